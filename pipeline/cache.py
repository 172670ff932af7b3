"""The tool's own cache directory: stable build contexts and remembered file hashes.

`STACKPROOF_CACHE_DIR`, else `$XDG_CACHE_HOME/stackproof`, else `~/.cache/stackproof`. Nothing in
it is needed for correctness; deleting it only costs time.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

from pipeline.guard import boundedio

__all__ = ["cache_dir", "file_sha256", "locked"]


def cache_dir() -> Path:
    explicit = os.environ.get("STACKPROOF_CACHE_DIR")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "stackproof"


def file_sha256(path: Path) -> str:
    """sha256 of a file, remembered by (path, size, mtime) so a 200 MB wheel is read once."""
    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    index = cache_dir() / "sha256.json"
    try:
        known: dict[str, str] = json.loads(index.read_text())
    except (OSError, ValueError):
        known = {}
    if key in known:
        return known[key]
    h = hashlib.sha256()
    # A wheel in a mirror the user names: a FIFO or a device there is refused (never a wait or an
    # endless hash); a regular file is streamed, however large (a GPU wheel is gigabytes).
    with boundedio.open_input(path, "wheel") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    known[key] = h.hexdigest()
    with contextlib.suppress(OSError):
        index.parent.mkdir(parents=True, exist_ok=True)
        tmp = index.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known))
        tmp.replace(index)
    return known[key]


@contextlib.contextmanager
def locked(directory: Path) -> Iterator[Path]:
    """Hold an exclusive lock on `directory` (created if needed) for the duration."""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory.parent / f".{directory.name}.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield directory
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
