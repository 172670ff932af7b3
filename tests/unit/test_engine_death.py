"""The engine's death told by behaviour (verify/load/death.py): a server error, then /health 503 or
refused, or the server gone, whatever the body says; proven both ways, pure and against the fake
server speaking vLLM 0.33's dead-engine answer (a 500 whose body names no engine)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from pipeline.matrix.model import LoadSpec
from pipeline.result import Status
from verify.load import watchdog
from verify.load.death import engine_death, log_cause
from verify.load.outcome import LoadTarget
from verify.load.progress import StallVerdict
from verify.load.run import run_load
from verify.load.summary import judge_load, summarise
from verify.serving import DRIVERS
from verify.serving.openai import ErrorClass, RequestRecord
from verify.serving.openai import Status as Probe

from .fake_openai import FakeVllm

VLLM = DRIVERS["vllm"]
# v1/engine/exceptions.py:22 @0.33.0: what a request to a dead engine gets, with status 500.
BODY = "The server had an error while processing your request."
LOG = [
    "INFO 12-06 20:00:01 [loggers.py:259] Engine 000: Avg prompt throughput: 3.1 tokens/s",
    "ERROR 12-06 20:00:02 [core_client.py:598] Engine core proc EngineCore_DP0 died unexpectedly, shutting down.",
    "ERROR 12-06 20:00:02 [async_llm.py:511] EngineCore encountered an issue. See stack trace (above) for the cause.",
    'INFO:     127.0.0.1:40000 - "POST /v1/chat/completions HTTP/1.1" 500 Internal Server Error',
]


@pytest.fixture(autouse=True)
def _hermetic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watchdog, "_kernel_xid", lambda since: [])  # the host's kernel log is not this test's


def _failed(status: int = 500, body: str = BODY) -> RequestRecord:
    return RequestRecord(
        question_id="q1", turn=0, status_code=status, error_class=ErrorClass.HTTP_5XX, error=f"HTTP {status}: {body}"
    )


def test_a_500_then_health_503_is_the_engines_death_whatever_the_body() -> None:
    records = [_failed(), RequestRecord(question_id="q2", turn=0)]
    death = engine_death(
        records, Probe(health=503, models=200, metrics=200), gone=None, log_lines=LOG, driver=VLLM, version="0.33.0"
    )
    assert death is not None
    assert death.shown_by == "HTTP 500, then /health 503"
    assert (death.requests, death.bodies, death.body_known) == (1, (BODY,), True)
    assert death.cause is not None and "EngineCore encountered an issue" in death.cause
    assert [r.error_class for r in records] == [ErrorClass.ENGINE_DEAD, None]


def test_a_500_with_health_still_200_is_no_death() -> None:
    records = [_failed()]
    death = engine_death(
        records, Probe(health=200, models=200, metrics=200), gone=None, log_lines=LOG, driver=VLLM, version="0.33.0"
    )
    assert death is None
    assert records[0].error_class is ErrorClass.HTTP_5XX


def test_the_server_gone_or_refusing_is_death_and_an_unknown_body_is_said_so() -> None:
    gone = engine_death(
        [_failed(body="boom")], None, gone="exited with code 1", log_lines=[], driver=VLLM, version="0.33.0"
    )
    assert gone is not None and gone.shown_by == "HTTP 500, then the server exited with code 1"
    assert (gone.body_known, gone.cause) == (False, None)  # a body the driver does not hold; no cause in the log
    refused = engine_death(
        [_failed()], Probe(health=0, models=0, metrics=0), gone=None, log_lines=[], driver=VLLM, version="0.28.0"
    )
    assert refused is not None and refused.shown_by == "HTTP 500, then /health refused the connection"
    assert refused.body_known is False  # before 0.33.0 the driver holds no such body: evidence, not the rule


def test_log_cause_prefers_a_marker_then_an_exception_line() -> None:
    assert log_cause(["x", "RuntimeError: CUDA error: an illegal memory access", "y"], ()) == (
        "RuntimeError: CUDA error: an illegal memory access"
    )
    assert log_cause(["a plain line"], VLLM.dead_markers) is None


def _run(tmp_path: Path, **fake: object) -> tuple[object, list[dict[str, object]]]:
    spec = LoadSpec(
        questions=8, concurrency=2, max_tokens=4, determinism_prompts=1, determinism_repeats=1, scrape_interval_s=0.2
    )
    server = FakeVllm(dead_status=500, dead_message=BODY, dies_after=3, **fake).start()  # type: ignore[arg-type]
    try:
        target = LoadTarget(base_url=server.url, label="fake", engine_version="0.33.0", last_log_lines=lambda: LOG)
        result = run_load(target, spec, tmp_path)
    finally:
        server.stop()
    written = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    checks = {c.name: c for c in judge_load(result, summarise(result, spec), batch_invariant=False)}
    return (result, checks), written


def test_a_dead_033_engine_under_load_is_reported_as_its_death_with_the_logs_cause(tmp_path: Path) -> None:
    (result, checks), written = _run(tmp_path)  # type: ignore[misc]
    events = [e for e in result.events if e.type is StallVerdict.ENGINE_DEAD]
    assert events and events[0].death is not None
    assert events[0].death["shown_by"] == "HTTP 500, then /health 503"
    assert "EngineCore encountered an issue" in events[0].death["cause"]
    failed = [r for r in result.records if r.error_class not in (None, ErrorClass.ABORTED)]
    assert failed and {r.error_class for r in failed} == {ErrorClass.ENGINE_DEAD}
    assert {w["error_class"] for w in written if w["error_class"] not in (None, "aborted")} == {"engine_dead"}
    assert checks["engine-progress"].status is Status.FAIL
    assert "the log's cause: " in checks["engine-progress"].message


def test_the_same_500_with_a_healthy_server_stays_a_server_error(tmp_path: Path) -> None:
    (result, checks), _ = _run(tmp_path, dead_health=200)  # type: ignore[misc]
    assert not any(e.type is StallVerdict.ENGINE_DEAD for e in result.events)
    classes = {r.error_class for r in result.records if r.error_class is not None}
    assert ErrorClass.HTTP_5XX in classes and ErrorClass.ENGINE_DEAD not in classes
    assert checks["questions"].status is Status.FAIL


def test_dataclass_round_trip_of_the_event_keeps_the_death(tmp_path: Path) -> None:
    (result, _), _ = _run(tmp_path)  # type: ignore[misc]
    event = next(e for e in result.events if e.type is StallVerdict.ENGINE_DEAD)
    assert dataclasses.asdict(event)["death"]["requests"] >= 1
