"""Run the parsed command's handler and map what it raised to an exit code and one message
(with `--json`, one JSON document on stdout too)."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import signal
import sys
from types import FrameType

from pipeline.console import console
from pipeline.errors import InputError, Interrupted, MatrixError, PipelineError

__all__ = ["MAX_PROBLEMS_SHOWN", "bounded", "dispatch"]


def dispatch(args: argparse.Namespace) -> int:
    console().verbose = bool(getattr(args, "verbose", False)) or console().verbose
    signal.signal(signal.SIGTERM, _raise_interrupted)
    try:
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        print("stackproof: interrupted; cleaned up", file=sys.stderr)
        return _fail(args, Interrupted.exit_code, "interrupted; cleaned up")
    except BrokenPipeError:
        return _broken_pipe()
    except MatrixError as exc:
        listed = [bounded(p) for p in _first_problems(exc.problems)]
        for problem in listed:
            print(problem, file=sys.stderr)
        print(f"stackproof: {len(exc.problems)} problem(s) in the matrix; nothing was built or run", file=sys.stderr)
        return _fail(args, exc.exit_code, "the matrix is invalid", listed)
    except PipelineError as exc:
        # A failed tool's last lines were printed by its phase (pipeline.console): not twice.
        message = bounded(str(exc))
        shown = message.splitlines()[0] if getattr(exc, "tail_shown", False) else message
        print(f"stackproof: error: {shown}", file=sys.stderr)
        return _fail(args, exc.exit_code, message)
    # Foreseeable conditions a reader below did not name more precisely: still no traceback.
    except UnicodeDecodeError as exc:
        return _report(args, InputError.exit_code, f"an input is not UTF-8 text ({exc.reason} at byte {exc.start})")
    except RecursionError:
        return _report(args, InputError.exit_code, "an input is nested too deeply to read")
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        return _report(args, 3, f"{where}{exc.strerror or exc}: {_os_error_advice(exc)}")
    except MemoryError:
        return _report(args, 3, "out of memory: the input or the run is larger than this host allows")


def _os_error_advice(exc: OSError) -> str:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        # A full disk is not the path's fault: say where space goes (docker's build cache keeps every
        # layer of a removed image; the run's --out and TMPDIR hold logs and environments).
        return "free disk space (`docker builder prune`, old run outputs, TMPDIR) and run again"
    if exc.errno == errno.EFBIG:  # the file was not written: the file it replaces is as it was
        return "a file-size limit (`ulimit -f`) stopped the write; raise it and run again"
    return "fix the path or its permissions"


# A person reads the first screenfuls; a broken generator's 300,000 identical problems cost half a
# minute to print (and a CI log's limit) and say nothing the first hundred do not.
MAX_PROBLEMS_SHOWN = 100


def _first_problems(problems: list[str]) -> list[str]:
    if len(problems) <= MAX_PROBLEMS_SHOWN:
        return problems
    rest = len(problems) - MAX_PROBLEMS_SHOWN
    return [*problems[:MAX_PROBLEMS_SHOWN], f"... and {rest:,} more problem(s) not listed (fix these first)"]


# An error quotes what it refused (a line, a value); a 10 MB line is not read by anyone, and it
# went to stderr, a CI log and the --json document whole. Each line of a message keeps its start
# (the file:line and what is wrong) and its end, and says how much was cut.
MAX_MESSAGE_LINE = 2_000


def bounded(message: str) -> str:
    """`message` with every line longer than MAX_MESSAGE_LINE characters cut in its middle."""
    if len(message) <= MAX_MESSAGE_LINE:
        return message
    lines = []
    for line in message.split("\n"):
        if len(line) > MAX_MESSAGE_LINE:
            head, tail = line[: MAX_MESSAGE_LINE - 200], line[-100:]
            line = f"{head} ... ({len(line) - len(head) - len(tail):,} characters not shown) ... {tail}"
        lines.append(line)
    return "\n".join(lines)


def _report(args: argparse.Namespace, code: int, message: str) -> int:
    message = bounded(message)
    print(f"stackproof: error: {message}", file=sys.stderr)
    return _fail(args, code, message)


def _fail(args: argparse.Namespace, code: int, message: str, problems: list[str] | None = None) -> int:
    """With `--json`, an error is one JSON document on stdout too (the contract: always a document)."""
    if getattr(args, "json", False) and not getattr(args, "emitted", False):
        document = {"error": {"exit_code": code, "message": message, "problems": problems or [message]}}
        try:
            print(json.dumps(document, indent=2))
        except BrokenPipeError:
            return _broken_pipe()
    return code


def _broken_pipe() -> int:
    """The reader went away (`stackproof matrix list --json | head`): stop quietly, as `yes | head`
    does; 141 is the shell's code for a SIGPIPE death. stdout is pointed at /dev/null so the
    interpreter's final flush raises nothing."""
    with contextlib.suppress(OSError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 141


def _raise_interrupted(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
