"""Degeneration detectors: does the stack still produce text, or has the model fallen into a loop?

The failure they are built for is sgl-project/sglang#34895: an FP8 `lm_head` whose weight scale was
silently dropped made a checkpoint "repeat a single phrase forever inside reasoning (e.g. "need
analysis there need analysis there ...") from the very first token" and finish "with empty content
(`finish_reason=length`)", while the server answered every request. Nothing in the request
accounting sees that; these four rates do:

- `loop`: answers whose text ends in one short cycle repeated at least `LOOP_MIN_REPEATS` times
  and covering at least `LOOP_MIN_COVER` of the answer (characters, so any script counts);
- `empty`: answers with no `content` at all (reasoning alone, or nothing);
- `length`: answers that ended at `max_tokens` (judged only when EOS was allowed: with `ignore_eos`
  every answer ends there by design);
- `collapse`: greedy positions (the determinism samples, which carry top-2 logprobs) whose
  top-1/top-2 gap is either huge (the distribution collapsed onto one token) or zero (flat logits).

A random tiny model loops by nature and a real one ends some answers at `max_tokens`, so there is
no universal threshold: each cell's first clean run records its own rates as the baseline
(`verify/load/baselines.py`) and a later run fails a detector whose rate exceeds the baseline's by more
than `MARGIN`. Everything here is pure: records and samples in, rates and verdicts out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pipeline.result import CheckResult, Status
from verify.load.determinism import Sample
from verify.serving.openai import RequestRecord

__all__ = [
    "DETECTORS",
    "MARGIN",
    "Rates",
    "judge_degeneration",
    "loop_period",
    "measure",
]

# A loop: the answer ends in a cycle of at most LOOP_MAX_PERIOD characters, repeated at least
# LOOP_MIN_REPEATS times, that covers at least LOOP_MIN_COVER of the answer.
LOOP_MAX_PERIOD = 64
LOOP_MIN_REPEATS = 3
LOOP_MIN_COVER = 0.5
# A collapsed position: the top-1 token is e^12 (~160,000) times likelier than the next, or the
# two are exactly tied (logits flattened, e.g. scaled to zero).
COLLAPSE_GAP_NATS = 12.0
TIE_GAP_NATS = 1e-6
# How far above its baseline a rate may go before the detector fails (absolute, in [0, 1]).
MARGIN = 0.25
# Fewer answers than this prove nothing either way.
MIN_ANSWERS = 5
DETECTORS = ("loop", "empty", "length", "collapse")


@dataclass(frozen=True, kw_only=True)
class Rates:
    """What fraction of the run's answers (or greedy positions) each detector flagged."""

    answers: int
    positions: int  # greedy positions with a top-2 gap
    loop: float | None
    empty: float | None
    length: float | None  # None when EOS was not allowed (ignore_eos)
    collapse: float | None  # None without logprobs
    examples: dict[str, list[str]]  # a few flagged answers per detector, cut short

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def parse(cls, data: dict[str, Any]) -> Rates:
        return cls(
            answers=int(data["answers"]),
            positions=int(data["positions"]),
            loop=_fraction(data.get("loop")),
            empty=_fraction(data.get("empty")),
            length=_fraction(data.get("length")),
            collapse=_fraction(data.get("collapse")),
            examples={},
        )


def loop_period(text: str) -> int | None:
    """The shortest period of a cycle the text ends in, when that cycle is a loop (see module doc)."""
    stripped = text
    n = len(stripped)
    if n == 0:
        return None
    for period in range(1, min(LOOP_MAX_PERIOD, n // LOOP_MIN_REPEATS) + 1):
        unit = stripped[n - period :]
        covered = period
        while covered + period <= n and stripped[n - covered - period : n - covered] == unit:
            covered += period
        # A partial unit before the repeats belongs to the loop too ("ne city one city one city").
        head = stripped[: n - covered]
        covered += len(_common_suffix(head, unit))
        if covered >= LOOP_MIN_REPEATS * period and covered >= LOOP_MIN_COVER * n:
            return period
    return None


def measure(records: Iterable[RequestRecord], samples: Sequence[Sample], *, eos_allowed: bool) -> Rates:
    """The detectors' rates over the answered load requests and the greedy samples."""
    answers = [r for r in records if r.ok and r.kind == "load"]
    looping = [r for r in answers if loop_period(r.text) is not None]
    empty = [r for r in answers if len(r.text) == len(r.reasoning)]  # every piece was reasoning, or none came
    length = [r for r in answers if r.finish_reason == "length"]
    gaps = [g for s in samples if not s.error for g in s.top2_gaps if g is not None]
    collapsed = sum(1 for g in gaps if g >= COLLAPSE_GAP_NATS or g <= TIE_GAP_NATS)
    total = len(answers)
    return Rates(
        answers=total,
        positions=len(gaps),
        loop=len(looping) / total if total else None,
        empty=len(empty) / total if total else None,
        length=(len(length) / total if total else None) if eos_allowed else None,
        collapse=collapsed / len(gaps) if gaps else None,
        examples={
            "loop": [_cut(r.text) for r in looping[:3]],
            "empty": [_cut(r.reasoning) or "(nothing)" for r in empty[:3]],
            "length": [_cut(r.text) for r in length[:3]] if eos_allowed else [],
        },
    )


def judge_degeneration(rates: Rates, baseline: Rates | None, *, baseline_note: str) -> list[CheckResult]:
    """One check per detector: the rate against the cell's baseline plus `MARGIN`.

    `baseline` is None when the cell has none yet; `baseline_note` says what happened then (recorded
    from this run, or not recorded because the run was not clean) and is shown in every message."""
    return [_judge_one(name, rates, baseline, baseline_note) for name in DETECTORS]


def _judge_one(name: str, rates: Rates, baseline: Rates | None, note: str) -> CheckResult:
    check = f"degeneration-{name}"
    rate: float | None = getattr(rates, name)
    evidence: dict[str, Any] = {
        "rate": rate,
        "answers": rates.answers,
        "positions": rates.positions,
        "margin": MARGIN,
        "examples": rates.examples.get(name, []),
    }
    if rate is None:
        why = {
            "length": "EOS was not allowed (ignore_eos): every answer ends at max_tokens by design",
            "collapse": "no greedy sample returned top-2 logprobs",
        }.get(name, "no answer to look at")
        return CheckResult(name=check, status=Status.SKIP, message=f"not judged: {why}", evidence=evidence)
    counted = rates.positions if name == "collapse" else rates.answers
    what = f"{rate:.0%} of {counted} {'greedy positions' if name == 'collapse' else 'answers'} {_WHAT[name]}"
    if baseline is None:
        evidence["baseline"] = None
        return CheckResult(name=check, status=Status.PASS, message=f"{what}; {note}", evidence=evidence)
    base: float | None = getattr(baseline, name)
    evidence["baseline"] = base
    if base is None:
        message = f"{what}; the baseline has no rate for it (recorded under other conditions)"
        return CheckResult(name=check, status=Status.INCONCLUSIVE, message=message, evidence=evidence)
    if counted < MIN_ANSWERS:
        message = f"{what}: too few to judge (at least {MIN_ANSWERS})"
        return CheckResult(name=check, status=Status.INCONCLUSIVE, message=message, evidence=evidence)
    limit = min(base + MARGIN, 1.0)
    # `length` fails only when every answer hit max_tokens (the #34895 shape), never on a mere rise.
    failed = rate >= 1.0 > limit if name == "length" else rate > limit
    if failed:
        message = f"{what}, against {base:.0%} in the cell's baseline (margin {MARGIN:.0%}): the model degenerated"
        return CheckResult(name=check, status=Status.FAIL, message=message, evidence=evidence)
    message = f"{what} (baseline {base:.0%}, margin {MARGIN:.0%})"
    return CheckResult(name=check, status=Status.PASS, message=message, evidence=evidence)


_WHAT = {
    "loop": "end in a repeated cycle",
    "empty": "have no content",
    "length": "ended at max_tokens",
    "collapse": f"have a top-1/top-2 gap of 0 or over {COLLAPSE_GAP_NATS:g} nats",
}


def _common_suffix(a: str, b: str) -> str:
    i = 0
    while i < min(len(a), len(b)) and a[-1 - i] == b[-1 - i]:
        i += 1
    return b[len(b) - i :] if i else ""


def _cut(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _fraction(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
