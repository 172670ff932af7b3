"""The load client is not the bottleneck (issue 45): no import inside the event loop, the silence
bound still exact, the pause measure finds a planted stall, and the benchmarks' quick modes run.

`stackproof load` paused every stream for 0.8-1.0 s about 2 s in: the progress line's first "luck"
figure called `fault_stats`, whose scipy import ran inside the event loop (benchmarks/
client_ceiling.py measured 1.9-5.4 s pauses on the loaded two-core host, 0.2-1.0 s after)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from verify.load.stats import clean_run_luck, fault_stats

REPO = Path(__file__).parents[2]


@pytest.mark.parametrize(("p0", "n"), [(1 / 450, 1), (1 / 450, 64), (1 / 450, 1350), (0.3, 7), (1e-9, 10**6)])
def test_the_closed_form_luck_is_the_binomial_one(p0: float, n: int) -> None:
    assert clean_run_luck(p0, n) == pytest.approx(fault_stats(p0, n, 0).p_luck, rel=1e-9)


@pytest.mark.slow  # a fresh interpreter importing scipy: 2-6 s on a loaded host
def test_the_progress_line_s_luck_imports_nothing_and_the_full_stats_do() -> None:
    """Both ways, in one fresh interpreter: clean_run_luck leaves scipy unimported, then fault_stats
    (what the progress line called) imports it."""
    code = (
        "import sys; from verify.load.stats import clean_run_luck, fault_stats; clean_run_luck(1/450, 64); "
        "print('scipy' in sys.modules); fault_stats(1/450, 64, 0); print('scipy' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["False", "True"]
    source = (REPO / "verify" / "load" / "run.py").read_text()
    progress = source[source.index("async def _report_progress") :]
    assert "fault_stats" not in progress and "clean_run_luck" in progress


def test_longest_pause_finds_a_planted_stall() -> None:
    from benchmarks.client_ceiling import longest_pause

    def record(start: float, gaps: list[float]) -> SimpleNamespace:
        return SimpleNamespace(start=start, ttft=0.01, itl=gaps)

    steady = [record(0.0, [0.002] * 400), record(0.001, [0.002] * 400)]
    assert longest_pause(steady) < 0.01
    stalled = [record(0.0, [0.002] * 300 + [0.9] + [0.002] * 100), record(0.001, [0.002] * 300 + [0.9] + [0.002] * 100)]
    assert 0.85 < longest_pause(stalled) < 0.95


def test_a_silent_stream_still_times_out_at_its_bound() -> None:
    """The lazy silence timer: a stream that goes quiet after chunks ends CHUNK_TIMEOUT no earlier
    than the chunk bound and at most its slack (5%) later; before any chunk, TTFT_TIMEOUT."""
    import time

    from verify.serving.openai import ErrorClass, RequestRecord, Timeouts, stream_chat

    from .fake_openai import FakeVllm

    async def one(hang: bool, timeouts: Timeouts) -> tuple[RequestRecord, float]:
        import httpx

        async with httpx.AsyncClient(base_url=fake.url, timeout=10) as client:
            record = RequestRecord(question_id="q", turn=0)
            started = time.monotonic()
            await stream_chat(client, model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                              ignore_eos=True, timeouts=timeouts, record=record, clock=time.monotonic,
                              on_chunk=lambda: None)  # fmt: skip
            return record, time.monotonic() - started

    with FakeVllm(hang=True, chunk_delay_s=0.0) as fake:
        record, took = asyncio.run(one(True, Timeouts(ttft=5.0, chunk=0.4)))
    assert record.error_class is ErrorClass.CHUNK_TIMEOUT and record.chunks == 1
    assert 0.4 <= took < 0.4 * 1.05 + 0.3  # the bound, its slack, and the loaded host's scheduling
    assert "no stream data for 0.4s after 1 chunks" in str(record.error)


def test_the_client_ceiling_quick_mode_reports_its_figures(tmp_path: Path) -> None:
    """One short run against the instant fake server, in this process: every figure is there and sane."""
    from benchmarks.client_ceiling import client_run, start_server

    server, url = start_server(tmp_path)
    try:
        row = client_run(url, concurrency=2, max_tokens=8, duration=0.6, out=tmp_path / "load")
    finally:
        server.kill()
        server.wait()
    assert row["requests"] > 0 and row["failed"] == 0 and row["output_tokens"] == 8 * row["requests"]
    assert row["cpu_ms_per_1k_tokens"] > 0 and row["tokens_per_cpu_s"] > 0 and row["longest_pause_ms"] >= 0
    json.dumps(row)
