"""Greedy determinism: where two token sequences first differ, and what each phase makes of a difference."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from pipeline.result import Status
from verify.load.determinism import PROMPTS, Divergence, Sample, compare, judge_phase, request_sample
from verify.serving import DRIVERS
from verify.serving.openai import ServerAPI


def sample(
    tokens: str, *, prompt: int = 0, phase: str = "A", gaps: list[float | None] | None = None, error: str | None = None
) -> Sample:
    toks = tuple(tokens.split())
    return Sample(
        prompt=prompt,
        phase=phase,
        tokens=toks,
        top2_gaps=tuple(gaps) if gaps is not None else tuple(0.1 for _ in toks),
        error=error,
    )


# -- compare --------------------------------------------------------------------------------------------


def test_equal_sequences_do_not_diverge() -> None:
    assert compare(sample("a b c"), sample("a b c", phase="B")) is None


def test_first_divergence_names_index_tokens_and_the_references_gap() -> None:
    ref = sample("a b c d", gaps=[2.0, 0.5, 0.03, 4.0])
    other = sample("a b x y", prompt=0, phase="B")
    assert compare(ref, other) == Divergence(prompt=0, phase="B", index=2, expected="c", got="x", gap_nats=0.03)


def test_a_shorter_sequence_diverges_at_its_length() -> None:
    ref = sample("a b c", gaps=[0.1, 0.2, 0.3])
    d = compare(ref, sample("a b"))
    assert d is not None
    assert (d.index, d.expected, d.got, d.gap_nats) == (2, "c", None, 0.3)


def test_a_longer_sequence_diverges_past_the_references_end() -> None:
    d = compare(sample("a b", gaps=[0.1, 0.2]), sample("a b c"))
    assert d is not None
    assert (d.index, d.expected, d.got, d.gap_nats) == (2, None, "c", None)


def test_divergence_is_suspect_only_above_one_nat() -> None:
    def at(gap: float | None) -> Divergence:
        return Divergence(prompt=0, phase="A", index=0, expected="a", got="b", gap_nats=gap)

    assert at(1.5).suspect and not at(1.0).suspect and not at(0.01).suspect and not at(None).suspect


# -- judge_phase ----------------------------------------------------------------------------------------

REFS = {0: sample("a b c d", prompt=0, gaps=[3.0, 0.2, 0.02, 1.0]), 1: sample("p q r", prompt=1)}


def test_all_equal_passes() -> None:
    result = judge_phase("A", REFS, [REFS[0], sample("a b c d"), sample("p q r", prompt=1)], batch_invariant=False)
    assert (result.name, result.status) == ("determinism-alone", Status.PASS)
    assert result.message == "3 greedy samples identical to the first answer of their prompt"
    assert result.evidence["exact_match_rate"] == 1.0 and result.evidence["divergences"] == []


def test_phase_a_mismatch_fails() -> None:
    result = judge_phase("A", REFS, [REFS[0], sample("a b x d"), sample("p q r", prompt=1)], batch_invariant=False)
    assert result.status is Status.FAIL
    assert result.message == (
        "1 of 3 samples diverged; first: prompt 0 at token 2 ('c' -> 'x', top-1/top-2 gap 0.020 nats)"
    )
    assert result.evidence["exact_match_rate"] == pytest.approx(2 / 3)
    (divergence,) = result.evidence["divergences"]
    assert divergence == {
        "prompt": 0,
        "phase": "A",
        "index": 2,
        "expected": "c",
        "got": "x",
        "gap_nats": 0.02,
        "suspect_corruption": False,
    }


def test_phase_b_mismatch_warns_without_batch_invariance() -> None:
    samples = [sample("a b x d", phase="B"), sample("p q r", prompt=1, phase="B")]
    result = judge_phase("B", REFS, samples, batch_invariant=False, invariance_env="VLLM_BATCH_INVARIANT")
    assert (result.name, result.status) == ("determinism-under-load", Status.WARN)
    assert result.message.endswith("; the server does not declare batch invariance (VLLM_BATCH_INVARIANT=1)")
    # an engine with no such variable: the warning names none
    plain = judge_phase("B", REFS, samples, batch_invariant=False)
    assert plain.message.endswith("; the server does not declare batch invariance")


def test_phase_b_mismatch_fails_under_declared_batch_invariance() -> None:
    samples = [sample("a b x d", phase="B")]
    result = judge_phase("B", REFS, samples, batch_invariant=True)
    assert result.status is Status.FAIL
    assert "batch invariance" not in result.message
    assert result.evidence["batch_invariant"] is True


def test_a_flip_where_the_gap_exceeded_one_nat_is_flagged_suspect() -> None:
    result = judge_phase("B", REFS, [sample("z b c d", phase="B")], batch_invariant=False)  # index 0: gap 3.0
    assert result.status is Status.WARN
    assert "(gap > 1 nat: suspect corruption, not numeric noise)" in result.message
    assert "top-1/top-2 gap 3.000 nats" in result.message
    assert result.evidence["divergences"][0]["suspect_corruption"] is True


def test_a_near_tie_flip_is_not_suspect() -> None:
    result = judge_phase("B", REFS, [sample("a b x d", phase="B")], batch_invariant=False)  # index 2: gap 0.02
    assert "suspect" not in result.message


def test_unknown_gap_is_reported_as_unknown() -> None:
    refs = {0: sample("a b", gaps=[None, None])}
    result = judge_phase("A", refs, [sample("a c")], batch_invariant=False)
    assert "top-1/top-2 gap unknown" in result.message


def test_all_errors_is_inconclusive() -> None:
    samples = [sample("", error="HTTP 503: dead"), sample("", prompt=1, error="ReadTimeout: ")]
    result = judge_phase("B", REFS, samples, batch_invariant=False)
    assert result.status is Status.INCONCLUSIVE
    assert result.message == "no phase-B sample could be compared"
    assert result.evidence["errors"] == ["HTTP 503: dead", "ReadTimeout: "]
    assert result.evidence["exact_match_rate"] is None


def test_samples_without_a_reference_are_not_compared() -> None:
    result = judge_phase("B", {}, [sample("a b", phase="B")], batch_invariant=False)
    assert result.status is Status.INCONCLUSIVE and result.evidence["compared"] == 0


def test_some_errors_but_no_divergence_warns() -> None:
    samples = [sample("a b c d", phase="B"), sample("", prompt=1, phase="B", error="HTTP 500: boom")]
    result = judge_phase("B", REFS, samples, batch_invariant=False)
    assert result.status is Status.WARN
    assert (
        result.message == "1 greedy samples identical to the first answer of their prompt; 1 samples failed to return"
    )


# -- request_sample against an in-process fake ----------------------------------------------------------


def _completion(tokens: list[str], top: list[dict[str, float | None]]) -> dict[str, Any]:
    return {
        "choices": [{"text": "", "logprobs": {"tokens": tokens, "top_logprobs": top}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 9, "completion_tokens": len(tokens)},
    }


def _ask(handler: Any, prompt: int = 1) -> tuple[Sample, int, int]:
    async def main() -> tuple[Sample, int, int]:
        async with ServerAPI("http://test", DRIVERS["vllm"], transport=httpx.MockTransport(handler)) as api:
            return await request_sample(api, model="m", prompt=prompt, phase="B", max_tokens=3, timeout=5.0)

    return asyncio.run(main())


def test_request_sample_asks_for_greedy_token_ids_and_reads_the_top2_gaps() -> None:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        assert request.url.path == "/v1/completions"
        top: list[dict[str, float | None]] = [
            {"token_id:5": -0.1, "token_id:6": -1.6},
            {"token_id:7": -0.5},  # only one alternative: no gap
            {"token_id:8": -0.2, "token_id:9": None, "token_id:1": -0.9},  # a null logprob is ignored
        ]
        return httpx.Response(200, json=_completion(["token_id:5", "token_id:7", "token_id:8"], top))

    s, prompt_tokens, completion_tokens = _ask(handler, prompt=len(PROMPTS) + 1)
    assert bodies == [
        {
            "model": "m",
            "prompt": PROMPTS[1],  # the prompt index wraps around the fixed prompts
            "max_tokens": 3,
            "temperature": 0,
            "ignore_eos": True,
            "logprobs": 2,
            "return_tokens_as_token_ids": True,
        }
    ]
    assert (s.phase, s.error, s.tokens) == ("B", None, ("token_id:5", "token_id:7", "token_id:8"))
    assert s.top2_gaps == pytest.approx((1.5, None, 0.7))
    assert (prompt_tokens, completion_tokens) == (9, 3)


def test_request_sample_http_error_is_an_error_sample() -> None:
    s, p, c = _ask(lambda request: httpx.Response(500, text="Internal Server Error"))
    assert s.error == "HTTP 500: Internal Server Error" and s.tokens == () and (p, c) == (0, 0)


def test_request_sample_connect_error_is_an_error_sample() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused")

    s, p, c = _ask(refuse)
    assert s.error == "ConnectError: [Errno 111] Connection refused" and (p, c) == (0, 0)
