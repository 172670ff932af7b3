"""The options `ab` and `bisect` share: the A/B schedule, how the sides start, the host interpreter.

Each default is the cell's (stackproof/ab.py `defaults_for`: a GPU cell's from H100 measurements, a
CPU cell's from the two-core host); an option given on the command line wins.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.errors import InputError
from stackproof.cli.common import Arg, arg, parse_pairs, parse_threshold, slice_seconds

if TYPE_CHECKING:
    from pipeline.matrix.model import Cell
    from stackproof.ab import Plan

__all__ = ["AB_OPTIONS", "COMPILE_CACHE_OPTION", "PYTHON_OPTION", "plan_of"]

PYTHON_OPTION = arg(
    "--python",
    default=None,
    metavar="PY",
    help="serve a host cell from this existing environment's interpreter (as `verify --runtime host --python`)",
)

COMPILE_CACHE_OPTION = arg(
    "--compile-cache",
    type=Path,
    default=None,
    metavar="DIR",
    help="the servers' compile/JIT cache, one slot per image (as run's and verify's); `none`: every start cold. "
    "Default: the site's (STACKPROOF_COMPILE_CACHE), else, when a side is restarted, one for this run, removed after",
)

AB_OPTIONS: tuple[Arg, ...] = (
    arg(
        "--slice",
        type=slice_seconds,
        default=None,
        help="seconds of load per slice (default: 3 on a GPU cell, else 20)",
    ),
    arg(
        "--pairs",
        type=parse_pairs,
        default=None,
        help="measured slice pairs at the first look (default: 12 on a GPU cell, else 5)",
    ),
    arg(
        "--max-pairs",
        type=parse_pairs,
        default=None,
        help="while a metric is UNDECIDED, look again at twice the pairs, up to this many "
        "(default: 96 on a GPU cell, else --pairs: one look)",
    ),
    arg("--threshold", type=parse_threshold, default=0.05, help="smallest change that matters: 5%% or 0.05"),
    arg(
        "--apart",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="start the sides one after another, each ready first (default on a GPU cell: two starts at "
        "once on one GPU split its memory wrongly)",
    ),
    arg(
        "--restart-first",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="once both are ready, start the first-started side again, on the caches the other warmed "
        "(default on a GPU cell)",
    ),
    arg(
        "--allow-kv-mismatch",
        action="store_true",
        help="compare sides whose KV caches differ by more than 10%% (a bump that changes the weights' size)",
    ),
)


def plan_of(args: argparse.Namespace, cell: Cell) -> Plan:
    """The cell's defaults with the command line's options on top; exit 2 when they contradict."""
    from stackproof.ab import defaults_for

    plan = defaults_for(cell)
    changes: dict[str, object] = {"threshold": args.threshold}
    for name, value in (
        ("slice_s", args.slice),
        ("pairs", args.pairs),
        ("apart", args.apart),
        ("restart_first", args.restart_first),
    ):
        if value is not None:
            changes[name] = value
    if args.allow_kv_mismatch:
        changes["kv_tolerance"] = None
    pairs = int(changes.get("pairs", plan.pairs))  # type: ignore[call-overload]
    if args.max_pairs is not None:
        if args.max_pairs < pairs:
            raise InputError(f"--max-pairs {args.max_pairs}: must be at least --pairs ({pairs})")
        changes["max_pairs"] = args.max_pairs
    elif plan.max_pairs < pairs or not cell.is_gpu:
        changes["max_pairs"] = pairs  # --pairs past the cell's largest (or a CPU cell): one look
    return dataclasses.replace(plan, **changes)  # type: ignore[arg-type]
