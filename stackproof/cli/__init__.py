"""`stackproof` command line: parse, load the matrix once, dispatch, map exceptions to exit codes.

Exit codes: 0 success, 1 a check failed, 2 bad input or usage (nothing built or run),
3 infrastructure problem (no docker daemon, registry unreachable, a tool timeout), 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import pipeline
from stackproof.cli import (
    ab,
    bisect,
    build,
    ci,
    compare,
    fleet,
    gc,
    inspect,
    load,
    matrix,
    model,
    probe,
    propose,
    publish,
    report,
    repro,
    stats,
    sweep,
)
from stackproof.cli.common import GROUP_DEST, GROUPS, Command, load_options
from stackproof.cli.dispatch import bounded, dispatch

__all__ = ["COMMAND_MODULES", "main"]

# Every command module exposes COMMANDS, a tuple of Command records; the parser walks them in this
# order, which is the order `stackproof --help` lists them in.
COMMAND_MODULES = (
    matrix,
    build,
    load,
    ab,
    sweep,
    bisect,
    inspect,
    gc,
    stats,
    probe,
    propose,
    publish,
    ci,
    repro,
    model,
    report,
    compare,
    fleet,
)


def main(argv: list[str] | None = None) -> int:
    """Every line that leaves the process passes one redaction (pipeline.guard.redact.RedactingStream):
    a credential in a URL, a pip-freeze line, a doctor input or a server's answer never reaches the
    terminal, a log or a --json document, whichever command printed it."""
    with _redacted_output():
        try:
            args = _parser().parse_args(argv)
        except UsageError as exc:
            raise SystemExit(_usage_error(argv, exc)) from None  # argparse's contract: SystemExit(2)
        return _output_checked(dispatch(args))


def _output_checked(code: int) -> int:
    """A stdout that could not take the output (closed, full) is infrastructure trouble: exit 3,
    said on stderr, instead of a traceback or the interpreter's exit 120 (issue 43)."""
    from pipeline.guard.redact import RedactingStream

    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
    failed = sys.stdout.failed if isinstance(sys.stdout, RedactingStream) else None
    if failed is None or code not in (0, 1):
        return code
    print(
        f"stackproof: error: stdout: {failed.strerror or failed}: the output was not written; "
        "point stdout at a file or terminal that can take it",
        file=sys.stderr,
    )
    return 3


class UsageError(Exception):
    """argparse's usage error, raised instead of exiting so that `--json` still gets its document."""

    def __init__(self, message: str, usage: str) -> None:
        super().__init__(message)
        self.usage = usage


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse prints and exits; main prints (JSON too) and exits
        raise UsageError(message, self.format_usage())


def _usage_error(argv: list[str] | None, exc: UsageError) -> int:
    message = bounded(str(exc))  # argparse quotes the value it refused, however long
    print(exc.usage.rstrip(), file=sys.stderr)
    print(f"stackproof: error: {message}", file=sys.stderr)
    if "--json" in (sys.argv[1:] if argv is None else argv):
        document = {"error": {"exit_code": 2, "message": message, "problems": [message]}}
        print(json.dumps(document, indent=2))
    return 2


@contextlib.contextmanager
def _redacted_output() -> Any:
    from pipeline.guard.redact import RedactingStream

    saved = sys.stdout, sys.stderr
    if not isinstance(sys.stdout, RedactingStream):
        sys.stdout = RedactingStream(sys.stdout)
    if not isinstance(sys.stderr, RedactingStream):
        sys.stderr = RedactingStream(sys.stderr)
    try:
        yield
    finally:
        for stream, underlying in zip((sys.stdout, sys.stderr), saved, strict=True):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
            if isinstance(stream, RedactingStream) and stream.failed is not None:
                _discard(underlying)
        sys.stdout, sys.stderr = saved


def _discard(stream: Any) -> None:
    """Point a stream that failed (full, bad) at /dev/null, so the interpreter's last flush of what
    it still holds raises nothing (it would print 'Exception ignored' and exit 120)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
        stream.flush()


def commands() -> tuple[Command, ...]:
    """The command table: every command module's COMMANDS, in COMMAND_MODULES order."""
    return tuple(command for module in COMMAND_MODULES for command in module.COMMANDS)


def _common_parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The options every command takes, and the load overrides (`load_options=True` commands)."""
    common = _Parser(add_help=False)
    common.add_argument(
        "--matrix",
        type=Path,
        default=Path(os.environ.get("STACKPROOF_MATRIX", "matrix.yaml")),
        help="matrix file (default: ./matrix.yaml or $STACKPROOF_MATRIX)",
    )
    common.add_argument(
        "--images", type=Path, default=None, help="templates and recipes directory (default: images/ beside the matrix)"
    )
    common.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    common.add_argument(
        "-v", "--verbose", action="store_true", help="stream the tools' whole output (debootstrap, build, server)"
    )
    load_opts = _Parser(add_help=False)
    group = load_opts.add_argument_group("load (overrides serve.load)")
    for option in load_options():
        group.add_argument(*option.flags, **option.options)
    return common, load_opts


def _parser() -> argparse.ArgumentParser:
    common, load_opts = _common_parsers()
    parser = _Parser(prog="stackproof", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"stackproof {pipeline.__version__}")
    top = parser.add_subparsers(dest="command", required=True)
    groups: dict[tuple[str, ...], Any] = {(): top}  # made where the table first names them: `--help` keeps its order
    for command in commands():
        *within, name = command.path
        for depth in range(1, len(within) + 1):
            key = tuple(within[:depth])
            if key not in groups:
                group_parser = groups[key[:-1]].add_parser(key[-1], help=GROUPS[key])
                groups[key] = group_parser.add_subparsers(dest=GROUP_DEST.get(key, "sub"), required=True)
        parents = [common, load_opts] if command.load_options else [common]
        p = groups[tuple(within)].add_parser(name, parents=parents, help=command.help)
        if command.one_of:
            exclusive = p.add_mutually_exclusive_group(required=True)
            for option in command.one_of:
                exclusive.add_argument(*option.flags, **option.options)
        for option in command.args:
            p.add_argument(*option.flags, **option.options)
        p.set_defaults(handler=command.handler)
    return parser
