"""Fault injection into the real vLLM CPU server under load: the watchdog must name what happened.

SIGSTOP on the EngineCore process freezes the engine while the API process keeps answering
/health, /v1/models and /metrics: the run must end with ENGINE_STALL_API_ALIVE within
stall_seconds + 2 scrape intervals of the last progress. SIGKILL instead makes the API server
fail its requests and shut down: ENGINE_DEAD. Either way the run ends on its own and the container
is removed.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pipeline.docker.client import Docker
from pipeline.matrix.model import LoadSpec
from pipeline.result import StageResult, Status
from tests.faults import signal_engine_core
from tests.integration.conftest import IMAGES, containers, serving_cell, stackproof, write_matrix
from verify.stages.load import run_load_stage
from verify.stages.server import Server

pytestmark = pytest.mark.integration

STALL_SECONDS = 8.0
SCRAPE_S = 1.0
# Enough questions that the load is still running when the fault lands.
SPEC = LoadSpec(questions=400, concurrency=6, max_tokens=32, stall_seconds=STALL_SECONDS, scrape_interval_s=SCRAPE_S)


def _load_with_fault(docker: Docker, image: str, out: Path, sig: signal.Signals) -> tuple[StageResult, dict[str, Any]]:
    cell = serving_cell("cpu-tiny")
    injected: dict[str, Any] = {}

    def on_ready(server: Server) -> None:
        requests = out / "load" / "requests.jsonl"

        def inject() -> None:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:  # the load is under way: 10 requests answered
                if requests.exists() and len(requests.read_text().splitlines()) >= 10:
                    break
                time.sleep(0.05)
            injected["pids"] = signal_engine_core(docker, server.name, sig)
            injected["at"] = time.monotonic()

        thread = threading.Thread(target=inject, daemon=True)
        thread.start()
        injected["thread"] = thread

    result = run_load_stage(docker, cell, image, arm=None, out_dir=out, spec=SPEC, on_ready=on_ready)
    injected["returned"] = time.monotonic()
    return result, injected


def test_sigstop_engine_core_is_an_engine_stall_with_the_api_alive(
    docker: Docker, cpu_tiny: str, tmp_path: Path
) -> None:
    result, injected = _load_with_fault(docker, cpu_tiny, tmp_path, signal.SIGSTOP)
    assert injected["pids"], "the EngineCore process was found and stopped"
    assert result.status is Status.FAIL
    checks = {c.name: c for c in result.checks}
    progress = checks["engine-progress"]
    assert progress.status is Status.FAIL and "ENGINE_STALL_API_ALIVE" in progress.message
    event = progress.evidence
    assert event["api"] == {"health": 200, "models": 200, "metrics": 200}
    # Detected within stall_seconds + 2 scrape intervals of the last progress, and the run ended.
    assert STALL_SECONDS < event["progress_age_s"] <= STALL_SECONDS + 2 * SCRAPE_S
    assert injected["returned"] - injected["at"] < STALL_SECONDS + 2 * SCRAPE_S + 20  # incl. container removal
    # Evidence: engine steps and tokens at the stall, the gauges, the server's last log lines.
    assert event["engine_steps"] > 0 and event["cum_tokens"] > 0 and event["in_flight"] > 0
    assert event["last_log_lines"] and event["gpu"]["available"] is False
    # Stall forensics ran before the removal: a stopped EngineCore is reported, not attached to (the
    # counterpart of tests/integration/test_stall_forensics.py, where a running one is dumped).
    spied = {p["cmdline"].split()[0]: p for p in event["forensics"]["py_spy"]["processes"]}
    assert spied["VLLM::EngineCore"]["state"] == "T" and "stopped by a signal" in spied["VLLM::EngineCore"]["error"]
    frames = [f for stack in event["forensics"]["py_spy"]["frames"].values() for f in stack]
    assert not any("_stackproof_test_stall" in f for f in frames)
    summary = json.loads(Path(result.artifacts["summary"]).read_text())
    assert summary["events"][0]["type"] == "ENGINE_STALL_API_ALIVE"
    assert summary["questions"]["faulted"] > 0  # the questions in flight at the stall
    assert containers("io.stackproof.cell=cpu-tiny") == [], "the stopped server's container must be removed"


def test_sigkill_engine_core_is_engine_dead(docker: Docker, cpu_tiny: str, tmp_path: Path) -> None:
    result, injected = _load_with_fault(docker, cpu_tiny, tmp_path, signal.SIGKILL)
    assert injected["pids"]
    assert result.status is Status.FAIL
    checks = {c.name: c for c in result.checks}
    progress = checks["engine-progress"]
    assert progress.status is Status.FAIL and "ENGINE_DEAD" in progress.message, progress
    api = progress.evidence["api"]
    assert api["health"] in (0, 503), api  # refused (the API server shut down) or 503
    assert injected["returned"] - injected["at"] < STALL_SECONDS + 20
    questions = checks["questions"]
    assert questions.status is Status.FAIL
    assert set(questions.evidence["errors"]) & {"engine_dead", "connect", "stream_truncated", "http_5xx"}
    assert containers("io.stackproof.cell=cpu-tiny") == []


def test_soak_alternates_two_arms_and_compares_them(cpu_tiny: str, tmp_path: Path) -> None:
    """Two arms of cpu-tiny (one adds --enforce-eager), one slice each, through the real CLI."""
    matrix = write_matrix(
        tmp_path / "matrix.yaml",
        edit={"cpu-tiny": {"arms": {"eager": {"description": "no compile", "args": ["--enforce-eager"]}}}},
    )
    result = stackproof(
        [
            "soak",
            "cpu-tiny",
            "--matrix",
            str(matrix),
            "--images",
            str(IMAGES),
            "--arms",
            "default,eager",
            "--duration",
            "16",
            "--slice",
            "8",
            "--determinism-repeats",
            "1",
            "--json",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert result.returncode == 0, result.stderr[-5000:]
    document = result.json()
    arms = document["arms"]
    assert set(arms) == {"default", "eager"}  # type: ignore[arg-type]
    for arm in arms.values():  # type: ignore[union-attr]
        assert arm["questions"] > 0 and arm["faults"] == 0 and arm["clean"] == arm["questions"]
        assert arm["stats"]["p_luck"] > 0 and not arm["events"]
    comparison = document["comparison"]
    assert comparison["a"] == "default" and comparison["p_conditional"] == 1.0  # no faults on either side
    assert "questions" in result.stderr and "clean" in result.stderr  # the live progress line
    assert containers("io.stackproof.cell=cpu-tiny") == []
