"""The one place that starts subprocesses.

Every external command (docker, debootstrap, uv, pip) goes through `run` or `stream`, which echo
`+ argv` first (to the terminal with -v, pipeline.console), apply a timeout, and raise
`CommandFailed` with the tail of the output.
Values named in `redact` are replaced by `***` in every echo and error message.

Each command runs in its own session and process group, and the whole group is ended (SIGKILL)
when the command exits, times out or the caller is interrupted (issue 43): a child it started
(an interpreter given with `--python` that forks, a tool's helper) does not outlive it, and a
grandchild holding the output pipe open cannot keep the caller waiting past its timeout.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.console import console
from pipeline.errors import InfraError, PipelineError

__all__ = ["CommandFailed", "CommandResult", "end_group", "run", "stream"]


class CommandFailed(PipelineError):
    """A command exited non-zero. `output_tail` is the last lines of its output."""

    def __init__(self, argv: Sequence[str], returncode: int, output_tail: str) -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.output_tail = output_tail
        super().__init__(f"command failed with exit code {returncode}: {shlex.join(argv)}\n{output_tail}")


@dataclass(frozen=True, kw_only=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def _echo(argv: Sequence[str], redact: Iterable[str]) -> str:
    text = shlex.join(argv)
    for secret in redact:
        if secret:
            text = text.replace(secret, "***")
    return text


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 600,
    check: bool = True,
    quiet: bool = False,
    input_text: str | None = None,
    redact: Iterable[str] = (),
) -> CommandResult:
    """Run a command to completion and capture its output.

    `env` entries are added to the current environment. A missing executable or a timeout is an
    infrastructure problem (`InfraError`); a non-zero exit raises `CommandFailed` when `check`.
    """
    redact = tuple(redact)
    if not quiet:
        console().command(_echo(argv, redact))
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            list(argv),
            env={**os.environ, **env} if env else None,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
            text=True,
            errors="replace",
            start_new_session=True,  # its own group: ended as one (end_group)
        )
    except FileNotFoundError as exc:
        raise InfraError(f"{argv[0]}: not found on PATH ({exc})") from exc
    readers = _Readers(proc, input_text)
    try:
        proc.wait(timeout=timeout)  # the command itself, not the pipes a child of it may hold open
    except subprocess.TimeoutExpired as exc:
        end_group(proc)
        readers.join()
        raise InfraError(f"timed out after {timeout:.0f}s: {_echo(argv, redact)}") from exc
    except BaseException:
        end_group(proc)
        raise
    end_group(proc)  # what it started and left running goes with it
    stdout, stderr = readers.join()
    result = CommandResult(
        argv=tuple(argv),
        returncode=proc.returncode,
        stdout=stdout,
        stderr=stderr,
        seconds=time.monotonic() - started,
    )
    if check and proc.returncode != 0:
        tail = "\n".join((stdout + stderr).splitlines()[-30:])
        raise CommandFailed([_echo([a], redact) for a in argv], proc.returncode, tail)
    return result


def end_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the process group `proc` leads (it, and whatever it started that stayed in it), then reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


class _Readers:
    """stdout and stderr read in threads (and stdin fed), so that the wait is on the process, and a
    straggler that left the group with the pipes open costs at most `grace` seconds once it ends."""

    def __init__(self, proc: subprocess.Popen[str], input_text: str | None, grace: float = 5.0) -> None:
        self.proc, self.grace = proc, grace
        self.parts: tuple[list[str], list[str]] = ([], [])
        self.threads = [
            threading.Thread(target=self._read, args=(pipe, into), daemon=True)
            for pipe, into in ((proc.stdout, self.parts[0]), (proc.stderr, self.parts[1]))
        ]
        if input_text is not None:
            self.threads.append(threading.Thread(target=self._feed, args=(input_text,), daemon=True))
        for thread in self.threads:
            thread.start()

    @staticmethod
    def _read(pipe: Any, into: list[str]) -> None:
        with contextlib.suppress(OSError, ValueError):
            for piece in iter(lambda: pipe.read(65536), ""):
                into.append(piece)

    def _feed(self, text: str) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.write(text)
            self.proc.stdin.close()

    def join(self) -> tuple[str, str]:
        deadline = time.monotonic() + self.grace
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        for pipe, thread in zip((self.proc.stdout, self.proc.stderr), self.threads, strict=False):
            if pipe is not None and not thread.is_alive():  # closing under a blocked reader would block too
                with contextlib.suppress(OSError, ValueError):
                    pipe.close()
        return "".join(self.parts[0]), "".join(self.parts[1])


def stream(
    argv: Sequence[str],
    *,
    on_line: Callable[[str], None],
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 3600,
    redact: Iterable[str] = (),
    tail_lines: int = 40,
) -> CommandResult:
    """Run a long command, handing each output line (stdout and stderr merged) to `on_line`.

    Used for builds and bootstraps, whose logs the user must see as they happen. The process is
    killed when `timeout` passes or when the caller is interrupted, so nothing is left running.
    """
    redact = tuple(redact)
    console().command(_echo(argv, redact))
    started = time.monotonic()
    tail: deque[str] = deque(maxlen=tail_lines)
    try:
        proc = subprocess.Popen(
            list(argv),
            env={**os.environ, **env} if env else None,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            bufsize=1,
            start_new_session=True,
        )
    except FileNotFoundError as exc:
        raise InfraError(f"{argv[0]}: not found on PATH ({exc})") from exc
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            tail.append(line)
            on_line(line)
            if time.monotonic() - started > timeout:
                raise InfraError(f"timed out after {timeout:.0f}s: {_echo(argv, redact)}")
        returncode = proc.wait(timeout=max(1.0, timeout - (time.monotonic() - started)))
    except BaseException:
        end_group(proc)
        raise
    end_group(proc)
    if returncode != 0:
        raise CommandFailed([_echo([a], redact) for a in argv], returncode, "\n".join(tail))
    return CommandResult(
        argv=tuple(argv),
        returncode=returncode,
        stdout="\n".join(tail),
        stderr="",
        seconds=time.monotonic() - started,
    )
