"""Greedy determinism: the same prompt at temperature 0 must give the same tokens.

Fixed prompts are sent to the completions path with `temperature=0`, a fixed `max_tokens`,
`ignore_eos` and `logprobs=2` (tokens returned as ids where the engine can), first alone R times
(phase A, batch of one: any difference is a bug), then R times mixed into the load (phase B:
without batch invariance the batch changes the numerics, so a difference is a warning unless the
server runs with the engine's batch-invariance variable set; see the serving driver). Each sample
is compared with the prompt's first phase-A answer: exact-match rate, first divergence index,
and the top-1/top-2 logprob gap there (a flip where the gap exceeded 1 nat is not numeric noise:
suspect corruption).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from pipeline.result import CheckResult, Status

if TYPE_CHECKING:  # a type only: importing the HTTP client here made every CLI command pay for httpx
    from verify.serving.openai import ServerAPI

__all__ = ["PROMPTS", "Divergence", "Sample", "compare", "judge_phase", "request_sample"]

# Fixed, deliberately plain prompts: the same text gives the same token ids on any tokenizer.
PROMPTS = (
    "The history of the printing press begins",
    "In a small village by the sea, there lived",
    "The three laws of thermodynamics state that",
    "To make a cup of tea, first",
    "The largest planet in the solar system is",
    "Once upon a time, a robot",
)
SUSPECT_GAP_NATS = 1.0


@dataclass(frozen=True, kw_only=True)
class Sample:
    prompt: int  # index into the prompts
    phase: str  # A (alone) | B (under load)
    tokens: tuple[str, ...]
    top2_gaps: tuple[float | None, ...]  # top-1 minus top-2 logprob at each position
    error: str | None = None


@dataclass(frozen=True, kw_only=True)
class Divergence:
    prompt: int
    phase: str
    index: int  # first position where the tokens differ
    expected: str | None
    got: str | None
    gap_nats: float | None  # the reference's top-1/top-2 gap at that position

    @property
    def suspect(self) -> bool:
        return self.gap_nats is not None and self.gap_nats > SUSPECT_GAP_NATS


def compare(reference: Sample, other: Sample) -> Divergence | None:
    """None when the token sequences are equal; else where and how they first differ."""
    if reference.tokens == other.tokens:
        return None
    index = next(
        (i for i, (a, b) in enumerate(zip(reference.tokens, other.tokens, strict=False)) if a != b),
        min(len(reference.tokens), len(other.tokens)),
    )
    return Divergence(
        prompt=other.prompt,
        phase=other.phase,
        index=index,
        expected=reference.tokens[index] if index < len(reference.tokens) else None,
        got=other.tokens[index] if index < len(other.tokens) else None,
        gap_nats=reference.top2_gaps[index] if index < len(reference.top2_gaps) else None,
    )


def judge_phase(
    phase: str,
    references: dict[int, Sample],
    samples: list[Sample],
    *,
    batch_invariant: bool,
    invariance_env: str | None = None,  # the engine's variable that declares batch invariance, if any
) -> CheckResult:
    """Phase A: any mismatch FAILs. Phase B: a mismatch WARNs, FAILs under declared batch invariance."""
    name = "determinism-alone" if phase == "A" else "determinism-under-load"
    errors = [s for s in samples if s.error]
    compared = [s for s in samples if not s.error and s.prompt in references]
    divergences = [d for s in compared if (d := compare(references[s.prompt], s)) is not None]
    evidence: dict[str, Any] = {
        "samples": len(samples),
        "compared": len(compared),
        "exact_match_rate": (len(compared) - len(divergences)) / len(compared) if compared else None,
        "divergences": [{**asdict(d), "suspect_corruption": d.suspect} for d in divergences],
        "errors": [s.error for s in errors][:5],
        "batch_invariant": batch_invariant,
    }
    if not compared:
        return CheckResult(
            name=name,
            status=Status.INCONCLUSIVE,
            message=f"no phase-{phase} sample could be compared",
            evidence=evidence,
        )
    if not divergences:
        message = f"{len(compared)} greedy samples identical to the first answer of their prompt"
        status = Status.WARN if errors else Status.PASS
        if errors:
            message += f"; {len(errors)} samples failed to return"
        return CheckResult(name=name, status=status, message=message, evidence=evidence)
    first = divergences[0]
    suspect = " (gap > 1 nat: suspect corruption, not numeric noise)" if any(d.suspect for d in divergences) else ""
    gap = "unknown" if first.gap_nats is None else f"{first.gap_nats:.3f} nats"
    message = (
        f"{len(divergences)} of {len(compared)} samples diverged; first: prompt {first.prompt} at token "
        f"{first.index} ({first.expected!r} -> {first.got!r}, top-1/top-2 gap {gap}){suspect}"
    )
    if phase == "A":
        status = Status.FAIL
    else:
        status = Status.FAIL if batch_invariant else Status.WARN
        if not batch_invariant:
            message += "; the server does not declare batch invariance" + (
                f" ({invariance_env}=1)" if invariance_env else ""
            )
    return CheckResult(name=name, status=status, message=message, evidence=evidence)


async def request_sample(
    api: ServerAPI, *, model: str, prompt: int, phase: str, max_tokens: int, timeout: float
) -> tuple[Sample, int, int]:
    """One greedy completion; returns the sample and the server's (prompt, completion) token counts."""
    driver = api.driver
    body: dict[str, Any] = {
        "model": model,
        "prompt": PROMPTS[prompt % len(PROMPTS)],
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": 2,
        **dict(driver.greedy_extras),
    }
    if driver.ignore_eos_field:
        body[driver.ignore_eos_field] = True
    answer = await api.complete(body, timeout=timeout)
    if not answer.ok:
        return Sample(prompt=prompt, phase=phase, tokens=(), top2_gaps=(), error=(answer.error or "")[:300]), 0, 0
    try:
        logprobs = answer.body["choices"][0].get("logprobs") or {}
        usage = answer.body.get("usage") or {}
        sample = Sample(
            prompt=prompt,
            phase=phase,
            tokens=tuple(logprobs.get("tokens") or ()),
            top2_gaps=tuple(_gap(top) for top in logprobs.get("top_logprobs") or ()),
        )
        return sample, int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
        error = f"unreadable completion: {type(exc).__name__}: {exc}"[:300]
        return Sample(prompt=prompt, phase=phase, tokens=(), top2_gaps=(), error=error), 0, 0


def _gap(top: dict[str, float] | None) -> float | None:
    if not top or len(top) < 2:
        return None
    best = sorted((v for v in top.values() if v is not None and math.isfinite(v)), reverse=True)
    return best[0] - best[1] if len(best) >= 2 else None
