"""One bounded reader for every file the tool reads but did not write (issue 27).

A receipt, a log, an autotune cache, a doctor input, a questions file, a repro source: any of them
can be `/dev/zero`, a FIFO nobody writes to, a symlink to a device or a 10 GB file. Each reader
here opens the path once, looks at what it is (never trusting `st_size`: procfs and pipes say 0),
refuses a directory, a device or a socket with a message naming the path, reads a FIFO or pipe
only where the caller says streaming is meant (opened without blocking, so a FIFO with no writer
is an empty input, not a wait without end), and stops after `limit` bytes: a larger input is an
`InputError` (exit 2) naming the file and the limit, never an out-of-memory exit 3.
"""

from __future__ import annotations

import fcntl
import io
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from pipeline.errors import InputError

__all__ = ["DEFAULT_LIMIT", "MAX_LINE", "iter_lines", "open_input", "read_bytes", "read_text"]

DEFAULT_LIMIT = 256 * 2**20  # a soak's receipt or requests.jsonl is tens of MB; nothing we read is near this
MAX_LINE = 1 * 2**20  # one JSONL record; a longer line is not a record this tool wrote


@contextmanager
def open_input(path: Path, what: str, *, stream_ok: bool = False) -> Iterator[BinaryIO]:
    """`path` opened for reading, after refusing what is not a file of content.

    `stream_ok`: a FIFO or a pipe (`<(...)`, `/dev/stdin`) is read as a stream; without it one is
    refused. A character or block device (`/dev/zero`, `/dev/sda`) and a socket are always refused.
    """
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise InputError(f"{path}: cannot read the {what}: no such file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None
    kind = _kind(info.st_mode)
    if kind == "directory":
        raise InputError(f"{path}: is a directory, not the {what} file")
    if kind in ("character device", "block device", "socket"):
        raise InputError(f"{path}: is a {kind}, not a file: give the {what} as a regular file")
    if kind == "FIFO" and not stream_ok:
        raise InputError(f"{path}: is a FIFO (a named pipe), not a file: give the {what} as a regular file")
    try:
        # O_NONBLOCK: opening a FIFO with no writer returns at once (a blocking open waits for one).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InputError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)  # reads block again: a writer's bytes are waited for
    with io.open(fd, "rb", closefd=True) as f:  # noqa: UP020 (a file descriptor, not a path)
        yield f


def read_bytes(path: Path, what: str, *, limit: int = DEFAULT_LIMIT, stream_ok: bool = False) -> bytes:
    """At most `limit` bytes of `path`; InputError when it holds more."""
    with open_input(path, what, stream_ok=stream_ok) as f:
        try:
            data = f.read(limit + 1)
        except OSError as exc:
            raise InputError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise InputError(f"{path}: the {what} is larger than {_size(limit)}: not an input this tool reads")
    return data


def read_text(path: Path, what: str, *, limit: int = DEFAULT_LIMIT, stream_ok: bool = False) -> str:
    """`read_bytes` decoded as UTF-8; a byte that is not is an InputError naming the line."""
    data = read_bytes(path, what, limit=limit, stream_ok=stream_ok)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InputError(f"{path}:{line}: the {what} is not UTF-8 text (offset {exc.start})") from None


def iter_lines(
    path: Path, what: str, *, limit: int = DEFAULT_LIMIT, max_line: int = MAX_LINE
) -> Iterator[tuple[int, bytes]]:
    """(line number, line without its newline), streamed: never more than `max_line` bytes in memory
    for one line, never more than `limit` bytes read in all."""
    total = 0
    with open_input(path, what) as f:
        for number, line in enumerate(iter(lambda: f.readline(max_line + 1), b""), start=1):
            total += len(line)
            if total > limit:
                raise InputError(f"{path}: the {what} is larger than {_size(limit)}: not an input this tool reads")
            if len(line) > max_line:
                raise InputError(f"{path}:{number}: a line longer than {_size(max_line)} in the {what}")
            yield number, line.rstrip(b"\r\n")


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "directory"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISFIFO, "FIFO"),
    ):
        if test(mode):
            return name
    return "file"


def _size(limit: int) -> str:
    return f"{limit // 2**20} MiB" if limit >= 2**20 else f"{limit:,} bytes"
