"""`stackproof ab A B`: what the bump cost, with a verdict per metric (docs/ab.md).

A and B are `CELL` or `CELL:ARM` (`CELL:default` is the cell without arm). Both sides get the
load spec of A's cell with the command line's overrides, so the questions, seed and concurrency are
the same. Exit 0: no regression (NO CHANGE, IMPROVEMENT or UNDECIDED, which says how many more
pairs would decide); 1: a REGRESSION beyond the threshold, greedy answers diverging where a side
was confident, or a side whose server never became ready; 2: bad input, naming the option; 3:
infrastructure (a server that exited between slices, an environment not built), or REFUSED: the
two engines did not get the same KV cache, so nothing was measured (the report says what each got).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING

from stackproof.cli.abplan import AB_OPTIONS, COMPILE_CACHE_OPTION, PYTHON_OPTION, plan_of
from stackproof.cli.common import Command, arg, emit, load, load_spec

if TYPE_CHECKING:  # the run itself (load test, numpy, the HTTP client) is imported when the command runs:
    # every other command, and `--help`, start without it (a third of a second per process)
    from verify.perf.ab import AbReport

__all__ = ["COMMANDS", "ab_command"]


def ab_command(args: argparse.Namespace) -> int:
    from stackproof.ab import run_ab
    from stackproof.compilecompare import check_compile_cache, command_compile_cache
    from stackproof.runjob import exclusive_dir
    from stackproof.sides import built_side, parse_side

    matrix, images = load(args)
    (cell_a, arm_a), (cell_b, arm_b) = parse_side(matrix, args.a, "A"), parse_side(matrix, args.b, "B")
    assert cell_a.serve is not None
    spec = load_spec(args, cell_a.serve.load)
    plan = plan_of(args, cell_a)  # exit 2 on contradicting options, before anything is built
    check_compile_cache(args.compile_cache)
    side_a = built_side(matrix, images, cell_a, arm_a, args.a, python=args.python)
    side_b = built_side(matrix, images, cell_b, arm_b, args.b, python=args.python)
    stem = time.strftime("ab-%Y%m%dT%H%M%S")
    out = exclusive_dir(args.out / "ab", stem)
    with command_compile_cache(args.compile_cache, out=out, restarts=plan.restart_first, command="ab"):
        report = run_ab(side_a, side_b, spec=spec, plan=plan, out_dir=out)
    emit(args, report.to_json(), _text(report))
    if report.verdict == "REFUSED":
        return 3
    return 1 if report.failed else 0


def _text(report: AbReport) -> str:
    lines = [
        f"{report.a} (A) vs {report.b} (B): {report.verdict}, threshold {report.config.threshold:.0%}, "
        f"{report.config.pairs} pairs of {report.config.slice_s:g}s slices, {report.seconds:.0f}s"
    ]
    for key, facts in sorted(report.engines.items()):
        kv = facts.get("kv_cache_gib")
        tokens = facts.get("kv_cache_tokens")
        lines.append(
            f"  engine {key}: KV cache {'?' if kv is None else f'{kv:g} GiB'}"
            f"{'' if tokens is None else f' ({tokens:,} tokens)'}, started #{facts.get('started_order')}"
            f"{', restarted' if facts.get('restarted') else ''}"
            f"{'' if facts.get('compile_cache') is None else ', compile cache ' + str(facts['compile_cache'])}"
        )
    if report.refusal:
        lines.append(f"  REFUSED: {report.refusal}")
        lines.append("  fix: start the sides apart (--apart), or --allow-kv-mismatch when the bump changes memory")
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
    from verify.perf.ab import CLIENT_BOUND, client_bound

    bound, said = client_bound(report.slices)
    if bound:
        lines.append(
            f"  client: more than {CLIENT_BOUND:.0%} of a core in {bound} of {said} slices: the load client was "
            "the bottleneck there, and its figures partly measure it (lower --concurrency)"
        )
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
            *AB_OPTIONS,
            PYTHON_OPTION,
            COMPILE_CACHE_OPTION,
            arg("--out", type=Path, default=Path("stackproof-out")),
        ),
    ),
)
