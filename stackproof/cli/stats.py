"""`stackproof stats`: what a fault count over N questions proves."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from pipeline.errors import InputError
from stackproof.cli.common import Command, arg
from stackproof.cli.common import emit as _emit

if TYPE_CHECKING:
    pass

__all__ = ["COMMANDS"]


def _stats(args: argparse.Namespace) -> int:
    from verify.load.stats import compare_arms, fault_stats, parse_rate

    p0 = parse_rate(args.baseline_rate)
    result = fault_stats(p0, args.questions, args.faults)
    document: dict[str, object] = {"faults": result.to_json()}
    rarest, most = result.one_per_ci95
    rarest_text = "unbounded" if rarest is None else f"{rarest:,.0f}"
    lines = [
        f"baseline 1 fault per {1 / p0:.0f} questions; {args.faults} fault(s) in {args.questions} questions",
        (
            f"chance a clean run is luck (rate still at the baseline): {result.p_luck:.1%}"
            if args.faults == 0
            else f"chance of {args.faults} or fewer faults at the baseline rate: {result.p_luck:.1%}"
        ),
        f"observed rate, exact 95% interval: 1 per [{most:,.0f}, {rarest_text}]",
        f"clean questions needed to claim a fix: {result.need_clean_95:,} (95%), {result.need_clean_99:,} (99%); "
        f"a 10x lower rate: {result.need_clean_10x_lower_95:,} (95%)",
        f"if the rate were still the baseline, {args.questions} questions would show >= 5 faults with "
        f"{result.p_faulty_arm_shows_5:.0%} chance",
    ]
    if (args.other_questions is None) != (args.other_faults is None):
        raise InputError("give both --other-questions and --other-faults to compare two arms")
    if args.other_questions is not None:
        arms = compare_arms(args.faults, args.questions, args.other_faults, args.other_questions)
        document["comparison"] = arms.to_json()
        lines.append(
            f"this arm worse than the other (one-sided): conditional binomial p = {arms.p_conditional:.4f}, "
            f"E-test p = {arms.p_etest:.4f}"
        )
    _emit(args, document, "\n".join(lines))
    return 0


COMMANDS = (
    Command(
        path=("stats",),
        help="what a fault count over N questions proves",
        handler=_stats,
        args=(
            arg("--baseline-rate", required=True, help="fault probability per question: 1/450 or 0.00222"),
            arg("--questions", type=int, required=True),
            arg("--faults", type=int, default=0),
            arg("--other-questions", type=int, default=None, help="a second arm to compare against"),
            arg("--other-faults", type=int, default=None),
        ),
    ),
)
