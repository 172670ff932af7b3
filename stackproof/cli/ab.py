"""`stackproof ab A B`: what the bump cost, with a verdict per metric (docs/ab.md).

A and B are `CELL` or `CELL:ARM` (`CELL:default` is the cell without arm). Both sides get the
load spec of A's cell with the command line's overrides, so the questions, seed and concurrency are
the same. Exit 0: no regression (NO CHANGE, IMPROVEMENT or UNDECIDED, which says how many more
pairs would decide); 1: a REGRESSION beyond the threshold, greedy answers diverging where a side
was confident, or a side whose server never became ready; 2: bad input, naming the option; 3:
infrastructure (a server that exited between slices, an environment not built).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.errors import InfraError, InputError
from pipeline.matrix.model import Cell, Matrix
from stackproof.cli.common import Command, arg, emit, load, load_spec, seconds

if TYPE_CHECKING:  # the run itself (load test, numpy, the HTTP client) is imported when the command runs:
    # every other command, and `--help`, start without it (a third of a second per process)
    from stackproof.ab import Side
    from verify.perf.ab import AbReport

__all__ = ["COMMANDS", "MAX_PAIRS", "ab_command", "parse_pairs", "parse_threshold", "resolve_side"]

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
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 2 <= value <= MAX_PAIRS:
        raise argparse.ArgumentTypeError(f"{text!r}: give 2 to {MAX_PAIRS} measured pairs (an interval needs 2)")
    return value


def ab_command(args: argparse.Namespace) -> int:
    from stackproof.ab import run_ab
    from stackproof.runjob import exclusive_dir

    matrix, images = load(args)
    (cell_a, arm_a), (cell_b, arm_b) = _side(matrix, args.a, "A"), _side(matrix, args.b, "B")
    assert cell_a.serve is not None
    spec = load_spec(args, cell_a.serve.load)
    side_a = _resolve(matrix, images, cell_a, arm_a, args.a)
    side_b = _resolve(matrix, images, cell_b, arm_b, args.b)
    stem = time.strftime("ab-%Y%m%dT%H%M%S")
    out = exclusive_dir(args.out / "ab", stem)
    report = run_ab(
        side_a, side_b, spec=spec, slice_s=args.slice, pairs=args.pairs, threshold=args.threshold, out_dir=out
    )
    emit(args, report.to_json(), _text(report))
    return 1 if report.failed else 0


def resolve_side(matrix: Matrix, images: Path, text: str, which: str) -> Side:
    """`CELL` or `CELL:ARM` on the command line: the built side that serves it (`stackproof sweep`'s too)."""
    cell, arm = _side(matrix, text, which)
    return _resolve(matrix, images, cell, arm, text)


def _side(matrix: Matrix, text: str, which: str) -> tuple[Cell, str | None]:
    cell_id, _, arm_name = text.partition(":")
    if not cell_id:
        raise InputError(f"{which} {text!r}: give CELL or CELL:ARM")
    cell = matrix.cell(cell_id)
    if cell.serve is None:
        raise InputError(f"{which} {text!r}: cell {cell.id} has no serve spec: nothing to load")
    if arm_name and arm_name != "default":
        cell.arm(arm_name)
        return cell, arm_name
    return cell, None


def _resolve(matrix: Matrix, images: Path, cell: Cell, arm_name: str | None, label: str) -> Side:
    """The side's runtime and image: the cell's built host environment, or its built image."""
    from pipeline.matrix.site import load_site
    from stackproof.ab import Side

    arm = cell.arm(arm_name) if arm_name else None
    site = load_site(matrix)
    if cell.on_host:
        from pipeline.host.env import built_host_env, plan_host_env
        from stackproof.runjob import lineage_env
        from verify.runtime.host import HostRuntime, remove_dead_host_runs

        for run in remove_dead_host_runs():
            print(f"stackproof: ended {run}: its run is gone", file=sys.stderr)
        env = built_host_env(plan_host_env(matrix, cell, images))
        if env is None:
            raise InfraError(f"{cell.id}: its host environment is not built: run `stackproof build {cell.id}`")
        runtime = HostRuntime(python=env.python, files_root=env.files_root, image_env=lineage_env(matrix, cell))
        return Side(label=label, cell=cell, arm=arm, runtime=runtime, image=env.ref)
    from pipeline.build.image import built_image
    from pipeline.docker.client import Docker
    from pipeline.host.modelstore import ensure_model
    from verify.runtime import as_runtime

    docker = Docker.connect()
    tag = built_image(docker, matrix, cell, site, images)[0].tag
    assert cell.serve is not None
    ensure_model(cell.serve.model, where=f"{matrix.file}:{cell.line}: cells[{cell.id}].serve.model")
    return Side(label=label, cell=cell, arm=arm, runtime=as_runtime(docker), image=tag)


def _text(report: AbReport) -> str:
    lines = [
        f"{report.a} (A) vs {report.b} (B): {report.verdict}, threshold {report.config.threshold:.0%}, "
        f"{report.config.pairs} pairs of {report.config.slice_s:.0f}s slices, {report.seconds:.0f}s"
    ]
    for m in report.metrics:
        if m.change is None:
            lines.append(f"  {m.name:<13} {m.verdict:<11} {m.reason}")
            continue
        more = f"  (~{m.more_pairs} more pairs)" if m.more_pairs else ""
        lines.append(
            f"  {m.name:<13} {m.verdict:<11} A {m.a_median:>9.2f} B {m.b_median:>9.2f} {m.unit:<5} "
            f"B vs A {m.change:+7.1%} [{m.ci_low:+.1%}, {m.ci_high:+.1%}]{more}"
        )
    c = report.correctness
    if c is not None:
        if c.agreement is None:
            lines.append(f"  greedy: no comparison ({c.comparison.get('error')})")
        else:
            flag = "CORRUPTION" if c.corruption else "no corruption"
            lines.append(f"  greedy agreement {c.agreement:.1%}, {flag}")
    lines.append(f"ab report: {report.files.get('report')}")
    return "\n".join(lines)


COMMANDS = (
    Command(
        path=("ab",),
        help="A/B of two cells or arms on this host: the change per metric, with a verdict",
        handler=ab_command,
        load_options=True,
        args=(
            arg("a", metavar="A", help="CELL or CELL:ARM: the baseline"),
            arg("b", metavar="B", help="CELL or CELL:ARM: the bump"),
            arg("--slice", type=seconds, default=20.0, help="seconds of load per slice (default 20)"),
            arg("--pairs", type=parse_pairs, default=5, help="measured A/B slice pairs after the warm-up (default 5)"),
            arg("--threshold", type=parse_threshold, default=0.05, help="smallest change that matters: 5%% or 0.05"),
            arg("--out", type=Path, default=Path("stackproof-out")),
        ),
    ),
)
