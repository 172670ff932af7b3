"""The load client against servers whose answers do not end (issue 27, classes 3 and 4).

Fake-backed unit tests, not integration tests: the hostile server is tests/unit/fuzz_driver.py's
`Hostile` handler on 127.0.0.1 (the same one the fuzz suite's `load-server-*` cases use). Each run
goes in a thread joined with a deadline, so a client that waits for ever fails the test instead of
hanging the suite; memory is measured with tracemalloc.
"""

from __future__ import annotations

import asyncio
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.matrix.model import LoadSpec
from verify.load.outcome import LoadOutcome, LoadTarget
from verify.load.run import grace_s, run_load
from verify.serving import DEFAULT
from verify.serving.openai import MAX_METRICS_BYTES, ErrorClass, ServerAPI

from .fuzz_driver import Hostile, QuietServer, million_series

SPEC = LoadSpec(
    questions=2,
    concurrency=2,
    max_tokens=2,
    determinism_repeats=0,
    duration_s=2.0,
    chunk_timeout_s=1.0,
    ttft_timeout_s=5.0,
    scrape_interval_s=0.5,
)


@pytest.fixture(scope="module")
def hostile() -> Iterator[str]:
    server = QuietServer(("127.0.0.1", 0), Hostile)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    million_series()  # made before any test traces memory: the server's cost is not the client's
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _within(seconds: float, call: Callable[[], Any]) -> tuple[Any, float, int]:
    """call()'s result, its wall time and its traced peak bytes; fails when it outlives `seconds`."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # handed to the test below
            box["error"] = exc

    tracemalloc.start()
    started = time.monotonic()
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    took = time.monotonic() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert not thread.is_alive(), f"still running after {seconds:g}s: a wait without an end"
    if "error" in box:
        raise box["error"]
    return box.get("value"), took, peak


def _load(url: str, spec: LoadSpec, tmp_path: Path, limit: float) -> tuple[LoadOutcome, float, int]:
    target = LoadTarget(base_url=url, label="hostile")
    outcome, took, peak = _within(limit, lambda: run_load(target, spec, tmp_path / "o"))
    return outcome, took, peak


def test_a_stream_that_ignores_max_tokens_is_cut_as_an_overrun(hostile: str, tmp_path: Path) -> None:
    outcome, took, peak = _load(f"{hostile}/forever", SPEC, tmp_path, 30)
    records = [r for r in outcome.records if r.kind == "load"]
    assert records and all(r.error_class is ErrorClass.OVERRUN for r in records), [r.error for r in records]
    assert "ignores it" in (records[0].error or "")
    assert outcome.questions and not any(outcome.questions.values())  # faulted, never clean
    assert took < 15 and peak < 64 * 2**20, (took, peak)


def test_a_stream_line_without_end_is_cut_not_buffered(hostile: str, tmp_path: Path) -> None:
    spec = LoadSpec(**{**vars(SPEC), "max_tokens": 500})  # a stream cap above the line cap
    outcome, took, peak = _load(f"{hostile}/long-line", spec, tmp_path, 30)
    record = outcome.records[0]
    assert record.error_class is ErrorClass.OVERRUN and "line longer than" in (record.error or "")
    assert took < 15 and peak < 64 * 2**20, (took, peak)


@pytest.mark.slow
def test_a_dribbling_stream_ends_at_duration_plus_grace(hostile: str, tmp_path: Path) -> None:
    """One chunk every 0.5 s for ever, never silent for a chunk timeout: only the deadline ends it."""
    spec = LoadSpec(**{**vars(SPEC), "max_tokens": 500, "chunk_timeout_s": 3.0})
    outcome, took, _ = _load(f"{hostile}/dribble", spec, tmp_path, 60)
    bound = spec.duration_s + grace_s(spec)
    why = (outcome.stop_reason, [r.error for r in outcome.records])
    assert bound - 1 <= outcome.seconds <= bound + 3, (outcome.seconds, why)
    assert took <= bound + 10
    assert "grace" in outcome.stop_reason and "still streaming" in outcome.stop_reason
    assert [r.error_class for r in outcome.records] == [ErrorClass.OVERRUN] * 2
    assert outcome.questions == {q: False for q in outcome.questions} and outcome.questions


def test_an_honest_server_ends_well_inside_the_grace(tmp_path: Path) -> None:
    """The other way: a good stream at the same bounds is clean and ends on its own."""
    from .fake_openai import FakeServer

    with FakeServer() as server:
        outcome, _, _ = _load(server.url, SPEC, tmp_path, 30)
    assert outcome.questions and all(outcome.questions.values())
    assert "grace" not in outcome.stop_reason and outcome.seconds < SPEC.duration_s + grace_s(SPEC)


def test_a_million_series_metrics_page_is_refused_by_its_cap(hostile: str) -> None:
    async def scrape() -> tuple[str | None, str | None]:
        async with ServerAPI(f"{hostile}/million-series", DEFAULT) as api:
            return await api.metrics_text()

    (text, why), took, peak = _within(30, lambda: asyncio.run(scrape()))
    assert text is None and why is not None and f"{MAX_METRICS_BYTES:,} bytes" in why
    assert took < 15 and peak < 4 * MAX_METRICS_BYTES, (took, peak)


def test_a_million_series_server_keeps_load_within_duration(hostile: str, tmp_path: Path) -> None:
    outcome, took, _ = _load(f"{hostile}/million-series", SPEC, tmp_path, 40)
    assert outcome.before is None and outcome.after is None  # unknown, never parsed
    assert all(e.type == "UNKNOWN" for e in outcome.events)
    assert took < SPEC.duration_s + grace_s(SPEC) + 5


def test_an_endless_models_answer_is_refused(hostile: str, tmp_path: Path) -> None:
    from pipeline.errors import CheckFailed

    with pytest.raises(CheckFailed, match="larger than"):
        _load(f"{hostile}/endless-models", SPEC, tmp_path, 40)


def test_an_endless_error_answer_is_read_up_to_its_cap(hostile: str, tmp_path: Path) -> None:
    outcome, took, peak = _load(f"{hostile}/endless-error", SPEC, tmp_path, 30)
    record = outcome.records[0]
    assert record.status_code == 500 and record.error_class is ErrorClass.HTTP_5XX
    assert "larger than 64 KiB" in (record.error or "")
    assert took < 15 and peak < 64 * 2**20


def test_the_blocking_client_refuses_an_endless_models_answer(hostile: str) -> None:
    from verify.serving.openai import ModelNotNamed, ServerCalls

    def ask() -> str:
        with ServerCalls(f"{hostile}/endless-models", DEFAULT) as calls:
            return calls.model_id()

    with pytest.raises(ModelNotNamed, match="larger than"):
        _within(40, ask)
    with ServerCalls(f"{hostile}/ok", DEFAULT) as calls:  # the other way: a good answer names its model
        assert calls.model_id() == "hostile/model"


def test_a_status_probe_reads_no_body(hostile: str) -> None:
    async def probe() -> int | None:
        async with ServerAPI(f"{hostile}/million-series", DEFAULT) as api:
            return await api.status(api.paths.metrics)

    status, took, _ = _within(20, lambda: asyncio.run(probe()))
    assert status == 200 and took < 5
