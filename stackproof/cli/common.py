"""What every command module shares: the command record, argument types, the load overrides, and
the handlers' helpers (load the matrix named by the common options, print a result).

Kept apart from `stackproof.cli` so that the command modules use it without importing the parser
that walks them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.errors import InputError
from pipeline.guard.jsonfile import jsonable
from pipeline.matrix.model import LoadSpec, Matrix
from pipeline.matrix.read import MAX_CONCURRENCY, MAX_COUNT, MAX_SECONDS

__all__ = [
    "GROUPS",
    "GROUP_DEST",
    "NO_PREFLIGHT_HELP",
    "Arg",
    "Command",
    "arg",
    "emit",
    "jsonable",
    "load",
    "load_options",
    "load_spec",
    "parse_pairs",
    "parse_threshold",
    "registry_credentials",
]

NO_PREFLIGHT_HELP = "GPU cells: skip the host checks (GPU, compute capability, driver CUDA, NVIDIA runtime, disk)"


def load(args: argparse.Namespace) -> tuple[Matrix, Path]:
    """The matrix from `--matrix` (validated) and the images directory (`--images`, else beside it)."""
    from pipeline.matrix.read import load_matrix

    images = args.images or args.matrix.parent / "images"
    return load_matrix(args.matrix, images_dir=images), images


def emit(args: argparse.Namespace, document: Any, text: str) -> None:
    """One JSON document on stdout with `--json`, else the human text. The document is strict JSON:
    NaN and infinities (which strict parsers reject) are written as null."""
    if args.json:
        print(json.dumps(jsonable(document), indent=2, allow_nan=False))
        args.emitted = True  # a command that reports, then fails (doctor, exit 3), printed its one document
    else:
        print(text)


@dataclasses.dataclass(frozen=True)
class Arg:
    """One `add_argument` call: its flags (or positional name) and keywords."""

    flags: tuple[str, ...]
    options: dict[str, Any]


def arg(*flags: str, **options: Any) -> Arg:
    return Arg(flags, options)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Command:
    """A row of the command table: `stackproof PATH...`, its options and the function that runs it."""

    path: tuple[str, ...]  # ("render",) or ("matrix", "validate")
    help: str
    handler: Callable[[argparse.Namespace], int]
    args: tuple[Arg, ...] = ()
    load_options: bool = False  # takes the overrides of the cell's serve.load
    # Options of which exactly one must be given (`report --receipts | --registry`), added first.
    one_of: tuple[Arg, ...] = ()


# Groups of subcommands: `stackproof matrix validate`, `stackproof inspect log`, ...
GROUPS = {
    ("matrix",): "validate, list and show cells",
    ("matrix", "pins"): "the release-pin table (pipeline/releases/release_pins.json)",
    ("inspect",): "inspect a file",
    ("probe",): "run an in-image probe",
    ("model",): "the host model store",
    ("fleet",): "verify cells on a cluster through its scheduler (docs/fleet.md)",
}
# The name a group's chosen subcommand is stored under (argparse names it in "required" errors).
GROUP_DEST: dict[tuple[str, ...], str] = {("matrix", "pins"): "pins_command"}


def load_options() -> tuple[Arg, ...]:
    """Overrides of the cell's `serve.load` (the load stage, `load` and `soak`); unset = the cell's value."""
    return (
        arg("--questions", type=positive_int, default=None, help="questions in a short run"),
        arg("--questions-file", type=Path, default=None, help="JSONL of {id, turns: [2-3 strings]}"),
        arg("--concurrency", type=concurrency, default=None, help="questions in flight (closed loop)"),
        arg("--rate", type=positive_float, default=None, help="open loop: questions started per second"),
        arg("--burstiness", type=positive_float, default=None, help="gamma shape of arrivals (1 = Poisson)"),
        arg("--max-tokens", type=positive_int, default=None, help="output tokens per turn"),
        arg("--duration", type=seconds, default=None, help="seconds after which no question starts"),
        arg("--stall-seconds", type=seconds, default=None, help="no progress this long = stall"),
        arg("--chunk-timeout", type=seconds, default=None, help="seconds one stream may be silent"),
        arg("--scrape-interval", type=seconds, default=None, help="seconds between /metrics scrapes"),
        arg("--baseline-rate", default=None, help="fault probability per question: 1/450 or 0.00222"),
        arg("--determinism-repeats", type=count, default=None, help="greedy samples per prompt and phase (0 = off)"),
    )


def load_spec(args: argparse.Namespace, spec: LoadSpec) -> LoadSpec:
    """The cell's load spec with the command line's overrides on top (checked before anything runs)."""
    from verify.load.stats import parse_rate

    changes: dict[str, Any] = {
        "questions": args.questions,
        "concurrency": args.concurrency,
        "rate": args.rate,
        "burstiness": args.burstiness,
        "max_tokens": args.max_tokens,
        "duration_s": args.duration,
        "stall_seconds": args.stall_seconds,
        "chunk_timeout_s": args.chunk_timeout,
        "scrape_interval_s": args.scrape_interval,
        "determinism_repeats": args.determinism_repeats,
    }
    if args.questions_file is not None:
        from verify.load.workload import read_questions

        read_questions(args.questions_file)  # a bad file is a usage error now, not mid-run
        changes["questions_file"] = str(args.questions_file)
    if args.baseline_rate is not None:
        changes["baseline_rate"] = parse_rate(args.baseline_rate)
    return dataclasses.replace(spec, **{k: v for k, v in changes.items() if v is not None})


def number(kind: type[int] | type[float], *, zero_ok: bool = False, high: float = MAX_COUNT) -> Callable[[str], Any]:
    """An argparse type: a finite int or float that must be positive (or, with zero_ok, not
    negative) and at most `high`: no NaN, no infinity, no 10**9 workers."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} must be a finite number")
        if value < 0 or (value == 0 and not zero_ok):
            raise argparse.ArgumentTypeError(f"{text!r} {'must not be negative' if zero_ok else 'must be positive'}")
        if value > high:
            raise argparse.ArgumentTypeError(f"{text!r} is too large (at most {high:,})")
        return value

    return parse


positive_int = number(int)
count = number(int, zero_ok=True)
positive_float = number(float)
concurrency = number(int, high=MAX_CONCURRENCY)
seconds = number(float, high=MAX_SECONDS)
MIN_SLICE_S, MAX_SLICE_S = 1.0, 3600.0  # a slice of A/B, sweep or bisect: a second to an hour of load


def slice_seconds(text: str) -> float:
    """`--slice` (issue 43): 1 s to an hour, refused before any server starts (a 10**-9 s slice
    measures nothing; a week's slice times 1,000 pairs is no run anyone waits for)."""
    value = float(seconds(text))
    if not MIN_SLICE_S <= value <= MAX_SLICE_S:
        raise argparse.ArgumentTypeError(f"{text!r}: give {MIN_SLICE_S:g} to {MAX_SLICE_S:g} seconds of load per slice")
    return value


def package_name(text: str) -> str:
    """A distribution name as PEP 508 spells one (issue 43: empty or path-like names were taken)."""
    import re

    if not re.fullmatch(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,198}[A-Za-z0-9])?", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a package name (letters, digits, '.', '_', '-')")
    return text


# -- argument types and inputs more than one command takes ------------------------------------------

MAX_PAIRS = 1000


def parse_threshold(text: str) -> float:
    """`5%` or `0.05`: a fraction strictly between 0 and 1."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a threshold (give 5% or 0.05)") from None
    if not math.isfinite(value) or not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be between 0 and 100% (exclusive)")
    return value


def parse_pairs(text: str) -> int:
    """`--pairs`: measured A/B pairs, 2 (an interval needs two) to MAX_PAIRS."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 2 <= value <= MAX_PAIRS:
        raise argparse.ArgumentTypeError(f"{text!r}: give 2 to {MAX_PAIRS} measured pairs (an interval needs 2)")
    return value


MAX_PASSWORD_CHARS = 64 * 2**10  # a registry token is a few KB


def registry_credentials(args: argparse.Namespace, registry: str) -> Any:
    """The registry credentials for this command: never from argv, never printed."""
    import os

    from pipeline.registry.oci import find_credentials, split_registry

    password = None
    if args.password_stdin:
        if sys.stdin.isatty():
            raise InputError("--password-stdin: pipe the password in (printf '%s' \"$PASSWORD\" | stackproof ...)")
        # Bounded like every input (issue 27): `< /dev/zero` is refused, not read until memory ends.
        password = sys.stdin.read(MAX_PASSWORD_CHARS + 1)
        if len(password) > MAX_PASSWORD_CHARS:
            raise InputError(f"--password-stdin: more than {MAX_PASSWORD_CHARS:,} characters: not a password")
        password = password.rstrip("\r\n")
        if not password:
            raise InputError("--password-stdin: stdin was empty")
    host, _ = split_registry(registry)
    return find_credentials(host, env=dict(os.environ), password=password)
