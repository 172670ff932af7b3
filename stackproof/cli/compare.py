"""`stackproof compare RUN_A RUN_B`: the same greedy prompts on two cells or arms, offline.

RUN is a run directory (`stackproof run`/`verify --out`), its receipt.json, a load or soak-slice
directory, or a greedy.json itself. Exit 0: the runs agree or differ only at near-ties; 1: a
divergence where a run was confident (corruption flagged); 2: bad input (no samples, other prompts).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from stackproof.cli.common import Command, arg, emit
from verify.load.compare import NEAR_TIE_NATS, compare_runs, find_greedy, read_greedy, render_table

__all__ = ["COMMANDS"]


def _nats(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a non-negative number of nats")
    return value


def _compare(args: argparse.Namespace) -> int:
    a = read_greedy(find_greedy(args.run_a))
    b = read_greedy(find_greedy(args.run_b))
    comparison = compare_runs(a, b, near_tie_nats=args.near_tie)
    emit(args, {**comparison.to_json(), "labels": {"a": a.label, "b": b.label}}, render_table(comparison))
    return 1 if comparison.corrupted else 0


COMMANDS = (
    Command(
        path=("compare",),
        help="greedy tokens of two runs: agreement, first divergence, logprob gap there (corruption or near-tie)",
        handler=_compare,
        args=(
            arg("run_a", type=Path, metavar="RUN_A", help="run directory, receipt.json, load dir or greedy.json"),
            arg("run_b", type=Path, metavar="RUN_B", help="the same for the other cell or arm"),
            arg(
                "--near-tie",
                type=_nats,
                default=NEAR_TIE_NATS,
                metavar="NATS",
                help="a divergence where both top-1/top-2 gaps are at most this is a near-tie "
                f"(default {NEAR_TIE_NATS:g})",
            ),
        ),
    ),
)
