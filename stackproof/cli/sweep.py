"""`stackproof sweep CELL[:ARM] --sweep concurrency=1,2,4,8`: the throughput-latency curve (docs/sweep.md).

One server of the built cell (its image, or its host environment) kept up; a slice of load per
point after a discarded warm-up; per point output tok/s, TTFT p50/p99, TPOT p50, E2EL p50, and the
first point whose TTFT p99 crosses `--ttft-p99-limit`. Exit 0: a curve was measured (whatever
its verdict: the limit is a reading, not a gate); 1: the server never became ready; 2: bad input,
naming the option; 3: infrastructure (the cell not built, a server that exited between points).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from stackproof.cli.abplan import COMPILE_CACHE_OPTION, PYTHON_OPTION
from stackproof.cli.common import Command, arg, emit, load, load_spec, slice_seconds
from stackproof.sides import resolve_side
from verify.perf.sweep import SweepAxis, SweepReport, parse_sweep

__all__ = ["COMMANDS", "parse_axis", "parse_limit_ms", "sweep_command"]


def parse_axis(text: str) -> SweepAxis:
    try:
        return parse_sweep(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_limit_ms(text: str) -> float:
    """`2000`, `2000ms` or `2s`: a positive number of milliseconds."""
    raw = text.strip()
    scale, number = (
        (1000.0, raw[:-1]) if raw.endswith("s") and not raw.endswith("ms") else (1.0, raw.removesuffix("ms"))
    )
    try:
        value = float(number) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (give 2000ms or 2s)") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive duration")
    return value


def sweep_command(args: argparse.Namespace) -> int:
    from stackproof.compilecompare import check_compile_cache, command_compile_cache
    from stackproof.runjob import exclusive_dir
    from stackproof.sweep import run_sweep

    matrix, images = load(args)
    check_compile_cache(args.compile_cache)  # exit 2 before anything is built
    side = resolve_side(matrix, images, args.target, "CELL", python=args.python)
    assert side.cell.serve is not None
    spec = load_spec(args, side.cell.serve.load)
    out = exclusive_dir(args.out / "sweep", time.strftime("sweep-%Y%m%dT%H%M%S"))
    with command_compile_cache(args.compile_cache, out=out, restarts=False, command="sweep"):
        report = run_sweep(
            side, axis=args.sweep, spec=spec, slice_s=args.slice, ttft_p99_limit_ms=args.ttft_p99_limit, out_dir=out
        )
    emit(args, report.to_json(), _text(report))
    return 0


def _text(report: SweepReport) -> str:
    c = report.config
    lines = [
        f"{report.target}: {report.verdict} (TTFT p99 limit {c.ttft_p99_limit_ms:.0f} ms), "
        f"{len(report.points)} points of {c.slice_s:.0f}s, {report.seconds:.0f}s",
        f"  {c.axis:>11} {'tok/s':>9} {'req/s':>7} {'TTFT p50':>9} {'TTFT p99':>9} {'TPOT p50':>9} {'E2EL p50':>9}",
    ]
    for p in report.points:
        mark = "  <- crosses" if p.value == report.crossed_at else ""
        mark = mark or ("  <- best within limit" if p.value == report.best_within_limit else "")
        lines.append(
            f"  {p.value:>11g} {_n(p.output_tok_s)} {_n(p.requests_s, 7)} {_n(p.ttft_p50_ms)} {_n(p.ttft_p99_ms)} "
            f"{_n(p.tpot_p50_ms)} {_n(p.e2el_p50_ms)}{mark}"
        )
    lines.append(f"sweep report: {report.files.get('report')}")
    return "\n".join(lines)


def _n(value: float | None, width: int = 9) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.1f}"


COMMANDS = (
    Command(
        path=("sweep",),
        help="the throughput-latency curve of a built cell: a slice per load point, where TTFT p99 crosses a limit",
        handler=sweep_command,
        load_options=True,
        args=(
            arg("target", metavar="CELL", help="CELL or CELL:ARM"),
            arg("--sweep", type=parse_axis, required=True, help="concurrency=1,2,4,8 or rate=0.5,1,2"),
            arg("--slice", type=slice_seconds, default=20.0, help="seconds of load per point (default 20)"),
            arg(
                "--ttft-p99-limit",
                type=parse_limit_ms,
                default=2000.0,
                help="TTFT p99 limit: 2000ms or 2s (default 2s)",
            ),
            PYTHON_OPTION,
            COMPILE_CACHE_OPTION,
            arg("--out", type=Path, default=Path("stackproof-out")),
        ),
    ),
)
