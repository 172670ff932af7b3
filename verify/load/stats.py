"""Fault statistics for load runs and soaks: what a clean run proves, and what it does not.

Notation: p0 = the baseline fault probability per question (e.g. 1/450), n = questions run,
k = faults seen. All of it is closed-form or scipy; nothing here touches a server, so the same
numbers serve `stackproof stats` for figures a user brings.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

from pipeline.errors import InputError

__all__ = [
    "ArmComparison",
    "FaultStats",
    "clean_questions_needed",
    "clean_run_luck",
    "compare_arms",
    "fault_stats",
    "parse_rate",
]


MAX_QUESTIONS = 10**12  # beyond this the closed forms lose their meaning (and scipy its integers)


def parse_rate(text: str) -> float:
    """`1/450` or `0.00222` -> a probability in (0, 1)."""
    try:
        value = float(Fraction(text.strip())) if "/" in text else float(text)
    except (ValueError, ZeroDivisionError, OverflowError) as exc:
        raise InputError(f"--baseline-rate {text!r}: write a fraction (1/450) or a decimal (0.00222)") from exc
    if not 0 < value < 1:
        raise InputError(f"--baseline-rate {text!r}: must be between 0 and 1 (a fault probability per question)")
    if not MIN_RATE <= value <= 1 - MIN_RATE:
        # 1 - 1e-320 is 1.0 in floating point: log(1 - p0) is 0 and every count below divides by it.
        raise InputError(f"--baseline-rate {text!r}: must be between {MIN_RATE:g} and {1 - MIN_RATE:g}")
    return value


MIN_RATE = 1e-12  # one fault in a trillion questions: far past any count a run can show


def clean_run_luck(p0: float, questions: int) -> float:
    """The chance that `questions` clean questions are luck, the rate still at p0: (1 - p0)^n, which is
    `fault_stats(p0, n, 0).p_luck` (binom.cdf(0, n, p0)) in closed form. The load's progress line
    shows it every 2 s from inside the event loop, where the first scipy import stalled every stream
    for 0.8-1.0 s (benchmarks/client_ceiling.py); this takes microseconds and imports nothing."""
    return math.exp(questions * math.log1p(-p0))


def clean_questions_needed(p0: float, confidence: float) -> int:
    """Fault-free questions needed to claim, at `confidence`, that the rate is below p0."""
    return math.ceil(math.log1p(-confidence) / math.log1p(-p0))


@dataclass(frozen=True, kw_only=True)
class FaultStats:
    baseline_rate: float
    questions: int
    faults: int
    p_luck: float  # chance of seeing this few faults (or none) if the rate were still p0
    rate_ci95: tuple[float, float]  # exact Poisson interval for the observed per-question rate
    one_per_ci95: tuple[float | None, float]  # "1 fault per X questions": (rarest, most frequent); None: unbounded
    one_sided_upper95: float  # the rule-of-three style bound when k == 0 (one-sided)
    need_clean_95: int
    need_clean_99: int
    need_clean_10x_lower_95: int
    p_faulty_arm_shows_5: float  # if the rate were still p0, the chance n questions show >= 5 faults (sizing)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def fault_stats(p0: float, questions: int, faults: int = 0) -> FaultStats:
    # scipy.stats is imported where it is used: importing it takes 1.5 s, and every command of the
    # CLI imports this module (`matrix audit` included, whose warm run is meant to take under 10 s)
    from scipy import stats

    if questions <= 0 or faults < 0 or faults > questions or questions > MAX_QUESTIONS:
        raise InputError(f"--questions must be 1 to {MAX_QUESTIONS:,} and 0 <= --faults <= --questions")
    # P(K <= k) under the baseline: for k == 0 this is (1 - p0)^n, the "clean run was luck" chance.
    p_luck = float(stats.binom.cdf(faults, questions, p0))
    low = 0.0 if faults == 0 else float(stats.chi2.ppf(0.025, 2 * faults)) / (2 * questions)
    high = float(stats.chi2.ppf(0.975, 2 * faults + 2)) / (2 * questions)
    one_sided = float(stats.chi2.ppf(0.95, 2 * faults + 2)) / (2 * questions)
    return FaultStats(
        baseline_rate=p0,
        questions=questions,
        faults=faults,
        p_luck=p_luck,
        rate_ci95=(low, high),
        one_per_ci95=(None if low == 0 else 1 / low, 1 / high),
        one_sided_upper95=one_sided,
        need_clean_95=clean_questions_needed(p0, 0.95),
        need_clean_99=clean_questions_needed(p0, 0.99),
        need_clean_10x_lower_95=clean_questions_needed(p0 / 10, 0.95),
        p_faulty_arm_shows_5=float(stats.binom.sf(4, questions, p0)),
    )


@dataclass(frozen=True, kw_only=True)
class ArmComparison:
    """Is arm A's fault rate higher than arm B's? Two exact tests, one-sided."""

    a_faults: int
    a_questions: int
    b_faults: int
    b_questions: int
    p_conditional: float  # kB ~ Bin(kA + kB, nB / (nA + nB)); P(KB <= kB)
    p_etest: float  # Krishnamoorthy-Thomson E-test (scipy.stats.poisson_means_test)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def compare_arms(a_faults: int, a_questions: int, b_faults: int, b_questions: int) -> ArmComparison:
    for questions, faults, which in ((a_questions, a_faults, "this arm"), (b_questions, b_faults, "the other arm")):
        if not 0 < questions <= MAX_QUESTIONS or not 0 <= faults <= questions:
            raise InputError(
                f"{which}: questions must be 1 to {MAX_QUESTIONS:,} and 0 <= faults <= questions "
                f"(--other-questions/--other-faults for the other arm)"
            )
    from scipy import stats  # see fault_stats

    total = a_faults + b_faults
    share_b = b_questions / (a_questions + b_questions)
    p_conditional = float(stats.binom.cdf(b_faults, total, share_b)) if total else 1.0
    p_etest = float(
        stats.poisson_means_test(a_faults, a_questions, b_faults, b_questions, alternative="greater").pvalue
    )
    return ArmComparison(
        a_faults=a_faults,
        a_questions=a_questions,
        b_faults=b_faults,
        b_questions=b_questions,
        p_conditional=p_conditional,
        p_etest=p_etest,
    )
