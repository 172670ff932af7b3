"""The one place that starts subprocesses.

Every external command (docker, debootstrap, uv, pip) goes through `run` or `stream`, which echo
`+ argv` first (to the terminal with -v, pipeline.console), apply a timeout, and raise
`CommandFailed` with the tail of the output.
Values named in `redact` are replaced by `***` in every echo and error message.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.console import console
from pipeline.errors import InfraError, PipelineError

__all__ = ["CommandFailed", "CommandResult", "run", "stream"]


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
        proc = subprocess.run(
            list(argv),
            env={**os.environ, **env} if env else None,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input_text,
            stdin=None if input_text is not None else subprocess.DEVNULL,
        )
    except FileNotFoundError as exc:
        raise InfraError(f"{argv[0]}: not found on PATH ({exc})") from exc
    except subprocess.TimeoutExpired as exc:
        raise InfraError(f"timed out after {timeout:.0f}s: {_echo(argv, redact)}") from exc
    result = CommandResult(
        argv=tuple(argv),
        returncode=proc.returncode,
        stdout=proc.stdout,
        stderr=proc.stderr,
        seconds=time.monotonic() - started,
    )
    if check and proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        raise CommandFailed([_echo([a], redact) for a in argv], proc.returncode, tail)
    return result


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
        proc.kill()
        proc.wait()
        raise
    if returncode != 0:
        raise CommandFailed([_echo([a], redact) for a in argv], returncode, "\n".join(tail))
    return CommandResult(
        argv=tuple(argv),
        returncode=returncode,
        stdout="\n".join(tail),
        stderr="",
        seconds=time.monotonic() - started,
    )
