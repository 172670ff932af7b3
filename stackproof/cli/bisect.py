"""`stackproof bisect CELL --package NAME --good V1 --bad V2`: the first bad version (docs/bisect.md).

Exit 0: the bisect named the first bad version, or found the bad end no worse than the good end
(NO REGRESSION); 1: it could not decide (a step UNDECIDED, named with the pairs it needs); 2: bad
input (a cell, package, version or option, named), nothing run; 3: infrastructure (an index that
cannot be read, a build or a server that failed).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from stackproof.cli.abplan import AB_OPTIONS, COMPILE_CACHE_OPTION, PYTHON_OPTION, plan_of
from stackproof.cli.common import Command, arg, emit, load, load_spec, package_name

if TYPE_CHECKING:  # imported when the command runs (stackproof/cli/ab.py says why)
    from verify.perf.bisection import BisectReport

__all__ = ["COMMANDS", "bisect_command"]


def bisect_command(args: argparse.Namespace) -> int:
    from pipeline.errors import InputError
    from pipeline.matrix.site import load_site
    from stackproof.bisection import Bisect, canonical, check_ends, moved_packages, parse_version, run_bisect
    from stackproof.compilecompare import check_compile_cache, command_compile_cache
    from stackproof.runjob import exclusive_dir
    from verify.runtime.host import remove_dead_host_runs

    matrix, images = load(args)
    check_compile_cache(args.compile_cache)  # exit 2 before anything is made
    cell = matrix.cell(args.cell)
    if cell.serve is None:
        raise InputError(f"{matrix.file}:{cell.line}: cells[{cell.id}] has no serve spec: nothing to load")
    good, bad = parse_version(args.good, "--good"), parse_version(args.bad, "--bad")
    check_ends(good, bad)
    ask = Bisect(
        cell=cell,
        package=canonical(args.package),
        good=good,
        bad=bad,
        metric=args.metric,
        threshold=args.threshold,
        index=args.index,
        plan=plan_of(args, cell),
        build_only=args.build_only,
        python=args.python,
    )
    moved = moved_packages(matrix, cell, ask.package, ask.index)  # exit 2 before anything is made
    spec = load_spec(args, cell.serve.load)
    site = load_site(matrix)
    for run in remove_dead_host_runs():
        print(f"stackproof: ended {run}: its run is gone", file=sys.stderr)
    out = exclusive_dir(args.out / "bisect", time.strftime("bisect-%Y%m%dT%H%M%S"))
    with command_compile_cache(args.compile_cache, out=out, restarts=ask.plan.restart_first, command="bisect"):
        report = run_bisect(matrix, images, site, ask, moved=moved, spec=spec, out=out)
    emit(args, report.to_json(), _text(report))
    return 1 if report.failed else 0


def _text(report: BisectReport) -> str:
    lines = [
        f"{report.cell}: {report.package} {report.good} (good) .. {report.bad} (bad) on {report.metric}, "
        f"threshold {report.threshold:.0%}: {report.result}"
    ]
    for s in report.steps:
        e = s.evidence
        lines.append(
            f"  step {s.number}: {s.version:<12} {s.judgement:<9} {s.why}  "
            f"[interval {s.interval[0]} .. {s.interval[1] or '?'}; env {s.environment['source']}; {e.seconds:.0f}s]"
        )
    lines.append(f"  {report.reason}")
    lines.append(
        f"  {report.ab_runs} A/B runs, {report.builds} environments built, {report.seconds:.0f}s; "
        f"bisect report: {report.files.get('report')}"
    )
    return "\n".join(lines)


COMMANDS = (
    Command(
        path=("bisect",),
        help="the first version of a package that made a cell worse: A/B runs against the good end",
        handler=bisect_command,
        load_options=True,
        args=(
            arg("cell"),
            arg(
                "--package",
                type=package_name,
                required=True,
                help="the package moved (flashinfer-python moves the trio)",
            ),
            arg("--good", required=True, help="a version of the package known good: every step's baseline"),
            arg("--bad", required=True, help="a newer version known bad"),
            arg(
                "--metric",
                choices=("tok_s", "tpot_p50", "ttft_p50", "greedy", "start"),
                default="tok_s",
                help="what makes a version bad (default tok_s): an A/B REGRESSION of a metric, "
                "greedy answers that differ, or a server that does not start",
            ),
            arg("--index", default=None, help="the package's index, when the cell names none for it"),
            *AB_OPTIONS,
            PYTHON_OPTION,
            COMPILE_CACHE_OPTION,
            arg("--build-only", action="store_true", help="make every version's environment; run no A/B"),
            arg("--out", type=Path, default=Path("stackproof-out")),
        ),
    ),
)
