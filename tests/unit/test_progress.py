"""Engine progress vs API liveness: the real /metrics fixture, and the stall rule both ways."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from verify.load.progress import Probe, Progress, StallVerdict, classify, parse_metrics
from verify.serving import DRIVERS

METRICS = Path(__file__).resolve().parents[1] / "fixtures" / "metrics" / "vllm-0.28.0-cpu-after-20-requests.txt"
STALL = 60.0


@pytest.fixture
def real() -> Progress:
    return parse_metrics(METRICS.read_text(), DRIVERS["vllm"].metric_names("0.28.0"))


def test_real_metrics_reduce_to_engine_progress(real: Progress) -> None:
    """vLLM 0.28.0 CPU after 20 requests of 32 tokens: 640 generated, 166 engine steps."""
    assert (real.steps, real.tokens, real.generated) == (166.0, 847.0, 640.0)
    assert (real.running, real.waiting) == (0.0, 0.0)
    assert real.process_start == pytest.approx(1.79599624596e9)


def _later(p: Progress, steps: float = 0, generated: float = 0, **changes: float) -> Progress:
    return dataclasses.replace(p, steps=p.steps + steps, generated=p.generated + generated, **changes)


ALIVE = Probe(health=200, models=200, metrics=200)


def test_progressing_engine(real: Progress) -> None:
    scrapes = [(0.0, real), (30.0, _later(real, 10, 40)), (90.0, _later(real, 20, 80))]
    assert (
        classify(scrapes, now=100.0, in_flight=4, last_chunk_at=None, stall_seconds=STALL) is StallVerdict.PROGRESSING
    )


def test_frozen_counters_with_the_api_answering_is_an_engine_stall(real: Progress) -> None:
    """The SIGSTOPped EngineCore: /health, /v1/models, /metrics all 200, counters frozen, 4 running."""
    frozen = _later(real, 5, 20, running=4.0)
    scrapes = [(0.0, real), (10.0, frozen), (40.0, frozen), (75.0, frozen)]
    assert (
        classify(scrapes, now=75.0, in_flight=4, last_chunk_at=9.0, stall_seconds=STALL, probe=ALIVE)
        is StallVerdict.ENGINE_STALL_API_ALIVE
    )
    # Stream chunks are progress too: a chunk 20 s ago means no stall yet.
    assert (
        classify(scrapes, now=75.0, in_flight=4, last_chunk_at=55.0, stall_seconds=STALL, probe=ALIVE)
        is StallVerdict.PROGRESSING
    )


def test_dead_engine_and_unresponsive_api(real: Progress) -> None:
    scrapes = [(0.0, real), (70.0, real)]
    dead = Probe(health=503, models=200, metrics=200)  # the SIGKILLed EngineCore, before the API exits
    assert (
        classify(scrapes, now=70.0, in_flight=2, last_chunk_at=None, stall_seconds=STALL, probe=dead)
        is StallVerdict.ENGINE_DEAD
    )
    refused = Probe(health=0, models=0, metrics=0)
    assert (
        classify(scrapes, now=70.0, in_flight=2, last_chunk_at=None, stall_seconds=STALL, probe=refused)
        is StallVerdict.ENGINE_DEAD
    )
    hung = Probe(health=None, models=200, metrics=200)
    assert (
        classify(scrapes, now=70.0, in_flight=2, last_chunk_at=None, stall_seconds=STALL, probe=hung)
        is StallVerdict.API_UNRESPONSIVE
    )


def test_nothing_in_flight_is_idle_not_a_stall(real: Progress) -> None:
    scrapes = [(0.0, real), (300.0, real)]
    assert (
        classify(scrapes, now=300.0, in_flight=0, last_chunk_at=None, stall_seconds=STALL, probe=ALIVE)
        is StallVerdict.IDLE
    )


def test_failed_scrapes_are_unknown_never_idle_or_stalled(real: Progress) -> None:
    assert (
        classify([(0.0, None), (70.0, None)], now=70.0, in_flight=3, last_chunk_at=None, stall_seconds=STALL)
        is StallVerdict.UNKNOWN
    )
    assert (
        classify([(0.0, real), (70.0, None)], now=70.0, in_flight=3, last_chunk_at=None, stall_seconds=STALL)
        is StallVerdict.UNKNOWN
    )


def test_counters_going_back_or_a_new_process_is_a_restart(real: Progress) -> None:
    back = _later(real, -100, -500)
    assert (
        classify([(0.0, real), (5.0, back)], now=5.0, in_flight=1, last_chunk_at=None, stall_seconds=STALL)
        is StallVerdict.RESTART_DETECTED
    )
    reborn = dataclasses.replace(_later(real, 1, 1), process_start=(real.process_start or 0) + 120)
    assert (
        classify([(0.0, real), (5.0, reborn)], now=5.0, in_flight=0, last_chunk_at=None, stall_seconds=STALL)
        is StallVerdict.RESTART_DETECTED
    )
