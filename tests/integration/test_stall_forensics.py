"""Stall forensics on the real vLLM 0.28.0 CPU server: a stall without SIGSTOP, caught with its stack.

The test image is cpu-tiny plus the test-only recipe in tests/recipes/stall (a .pth hook that
makes EngineCore's step wait in `_stackproof_test_stall` while /tmp/stackproof-stall exists). The
test creates the flag inside the server once the load is under way (`Docker.exec`): the engine
stops stepping, the API keeps answering, and the watchdog must conclude ENGINE_STALL_API_ALIVE
with a py-spy dump, taken from a sidecar sharing the server's PID namespace, that names the
blocked frame. The same run proves the CPU cell's cost fields say why they are empty, and that
the sidecar and the server are removed.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import jinja2
import pytest

from pipeline.docker.client import Docker
from pipeline.matrix.model import LoadSpec
from pipeline.result import Status
from tests.integration.conftest import JOB, containers, serving_cell
from verify.stages.load import run_load_stage
from verify.stages.server import Server

pytestmark = pytest.mark.integration

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "stall"
FLAG = "/tmp/stackproof-stall"
STALL_SECONDS = 8.0
SPEC = LoadSpec(questions=400, concurrency=6, max_tokens=32, stall_seconds=STALL_SECONDS, scrape_interval_s=1.0)


@pytest.fixture(scope="module")
def stall_image(docker: Docker, cpu_tiny: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """cpu-tiny with the stall recipe: a COPY and one RUN on top of the session's image (seconds)."""
    context = tmp_path_factory.mktemp("stall-image")
    for name in ("stackproof_test_stall.py", "stackproof-test-stall.pth"):
        shutil.copy(RECIPE / name, context / name)
    template = jinja2.Template((RECIPE / "Dockerfile.j2").read_text(), undefined=jinja2.StrictUndefined)
    (context / "Dockerfile").write_text(template.render(base=cpu_tiny))
    tag = f"stackproof/cpu-tiny-stall:{JOB[-40:].replace('-', '')}".lower()
    docker.build(
        context,
        tag=tag,
        platform=docker.platform(),
        secrets={},
        labels={"io.stackproof.job": JOB},
        on_line=lambda line: None,
    )
    yield tag
    docker.remove_image(tag)


def test_a_blocked_engine_step_is_a_stall_with_its_stack(
    docker: Docker, stall_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STACKPROOF_JOB", JOB)  # the server and the sidecar carry this session's job label
    cell = serving_cell("cpu-tiny")
    injected: dict[str, float | int] = {}

    def on_ready(server: Server) -> None:
        requests = tmp_path / "load" / "requests.jsonl"

        def inject() -> None:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:  # the load is under way: 10 requests answered
                if requests.exists() and len(requests.read_text().splitlines()) >= 10:
                    break
                time.sleep(0.05)
            injected["rc"] = docker.exec(server.name, ["touch", FLAG]).returncode
            injected["at"] = time.monotonic()

        threading.Thread(target=inject, daemon=True).start()

    started = time.monotonic()
    result = run_load_stage(docker, cell, stall_image, arm=None, out_dir=tmp_path, spec=SPEC, on_ready=on_ready)
    returned = time.monotonic()
    assert injected.get("rc") == 0, "the flag file was created in the server"
    progress = next(c for c in result.checks if c.name == "engine-progress")
    assert progress.status is Status.FAIL and "ENGINE_STALL_API_ALIVE" in progress.message, progress
    event = progress.evidence
    assert event["api"] == {"health": 200, "models": 200, "metrics": 200}
    forensics = event["forensics"]
    spy = forensics["py_spy"]
    assert spy["available"] is True, spy
    titles = {p["cmdline"].split()[0] for p in spy["processes"]}
    assert "VLLM::EngineCore" in titles, titles
    engine_core = next(p for p in spy["processes"] if p["cmdline"].startswith("VLLM::EngineCore"))
    frames = spy["frames"][str(engine_core["pid"])]
    # The blocked frame, innermost, then the recipe's wrapper of the step, then vLLM's busy loop.
    print("EngineCore main thread:", *frames[:8], sep="\n  ")
    assert frames[0].startswith("_stackproof_test_stall (stackproof_test_stall.py:"), frames[:10]
    assert "._process_engine_step (stackproof_test_stall.py:" in frames[1], frames[:10]
    assert any(f.startswith("EngineCoreProc.run_busy_loop (vllm/v1/engine/core.py:") for f in frames), frames[:10]
    dump = tmp_path / spy["file"]
    assert dump.is_file() and "_stackproof_test_stall" in dump.read_text()
    # A CPU cell: no GPU verdict, no core dump, and each says why.
    assert forensics["gpu"]["verdict"] == "NOT_MEASURED" and "CPU cell" in forensics["gpu"]["reason"]
    assert forensics["cuda_coredump"]["available"] is False
    summary = json.loads(Path(result.artifacts["summary"]).read_text())
    cost = summary["cost"]
    for name in ("peak_memory_bytes", "energy_per_output_token_j", "output_tok_s_per_gpu", "gpu_seconds"):
        assert cost[name]["value"] is None and "CPU cell" in cost[name]["reason"], cost[name]
    assert summary["events"][0]["forensics"]["py_spy"]["file"] == "load/forensics/py-spy.json"
    assert returned - injected["at"] < STALL_SECONDS + 2 + 40  # detection, forensics, removal
    assert containers("io.stackproof.role=sidecar") == [], "the py-spy sidecar must be removed"
    assert containers("io.stackproof.cell=cpu-tiny") == [], "the stalled server's container must be removed"
    print(f"stall test: {returned - started:.0f}s in the load stage, {returned - injected['at']:.1f}s after the flag")
