"""The first receipts of the main job in docker on a real GPU: `stackproof run gpu-docker-vllm-0.26.0-tiny`
on the H100 (80GB HBM3, SM90), 2026-12-07, brought back by benchmarks/gpu_docker/ (run.sh, faults.py).

The image was built over the GPU host's own tree imported as an archive base (pinned by its sha256),
the server ran in a container that held the GPU through CDI, every stage was judged there. Five runs,
read back as written: bf16 PASS with an empty compile cache (cold) and again with it filled (warm), the
fp8 arm PASS with its kernel rule met, a planted stall named ENGINE_STALL_API_ALIVE with the engine's
py-spy frame taken inside the container, and EngineCore SIGKILLed mid-load named as the engine's death."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from stackproof.cli import main

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "gpu-docker-vllm-0.26.0"
RUNS = FIXTURES / "receipts"
SCHEMA = json.loads((REPO / "docs" / "receipt.schema.json").read_text())
CELL = "gpu-docker-vllm-0.26.0-tiny"
# The sha256 setup.sh printed for the host tree it packed (hostbase.tar, 15.6 GiB): the base of every image.
BASE_SHA256 = "23fb00e5ad13ba0090ff88e159cbf96d8a60626f7ef4ad77b18b45251c9cadfa"
CELL_IMAGE = "sha256:e2a36b62d4ae9ee2a452efc47d4bd2a8285cf165f049a23cbed56568c83aaef2"
PASSED = ("pass-bf16-cold", "pass-bf16-warm", "pass-fp8")
ALL = (*PASSED, "stall", "kill")
# The device calls' own summary lines (setup.sh's, and run.sh's after each job), as the tool returned them.
RECAP = (FIXTURES / "jobs" / "recap.txt").read_text().splitlines()


def receipt(run: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RUNS / run / "receipt.json").read_text())
    return data


def checks(doc: dict[str, Any], stage: str) -> dict[str, dict[str, Any]]:
    found = next(s for s in doc["stages"] if s["stage"] == stage)
    return {c["name"]: c for c in found["checks"]}


@pytest.mark.parametrize("run", ALL)
def test_every_receipt_validates_and_names_docker_cdi_the_h100_and_the_archive_base(run: str) -> None:
    doc = receipt(run)
    jsonschema.Draft202012Validator(SCHEMA).validate(doc)
    assert doc["cell"] == CELL
    image = doc["image"]
    assert image["runtime"] == "docker" and image["id"].startswith("sha256:")
    assert image["gpu_access"]["how"] == "cdi" and image["gpu_access"]["cdi_kind"] == "nvidia.com/gpu"
    assert image["base"] == {
        "name": "gpu-host-tree",
        "archive": "hostbase.tar",
        "format": "rootfs",
        "sha256": BASE_SHA256,
    }
    gpu = doc["host"]["gpus"][0]
    assert gpu["name"] == "NVIDIA H100 80GB HBM3" and gpu["compute_capability"] == "9.0"
    assert doc["servers"]["runtime"] == "docker" and doc["servers"]["started"] == 1


@pytest.mark.parametrize("run", PASSED)
def test_the_cell_passed_every_stage_in_its_container_with_gpu_cost_from_nvml(run: str) -> None:
    doc = receipt(run)
    assert doc["status"] == "PASS"
    assert [(s["stage"], s["status"]) for s in doc["stages"]] == [
        ("imports", "PASS"),
        ("startup", "PASS"),
        ("autotune", "PASS"),
        ("load", "PASS"),
    ]
    assert doc["image"]["id"] == CELL_IMAGE  # one build served all three
    seen = doc["runtime"]["gpus_seen_by_torch"][0]  # torch inside the container saw the GPU through CDI
    assert seen["capability"] == "9.0" and doc["runtime"]["distributions"]["vllm"] == "0.26.0"
    assert doc["load"]["questions"] == {"attempted": 64, "clean": 64, "faulted": 0, "incomplete": 0}
    cost = doc["cost"]
    assert cost["source"] == "nvml" and 20 * 2**30 < cost["peak_memory_bytes"]["value"] < 80 * 2**30
    assert 0 < cost["energy_per_output_token_j"]["value"] < 1


def test_the_build_json_names_the_image_every_pass_receipt_names() -> None:
    build = json.loads((FIXTURES / "build.json").read_text())
    assert CELL_IMAGE in json.dumps(build)


@pytest.mark.parametrize(("run", "warm"), [("pass-bf16-cold", False), ("pass-bf16-warm", True), ("pass-fp8", True)])
def test_the_receipt_says_whether_the_compile_cache_was_warm(run: str, warm: bool) -> None:
    cache = receipt(run)["compile_cache"]
    assert cache["used"] is True and cache["warm"] is warm and cache["warm_not_reused"] is False


def test_a_warm_compile_cache_cut_the_start_from_122_to_27_seconds() -> None:
    """The cost of a verification (issue 40 item 5): cold 122.5 s to ready, warm 26.9 s (the H100
    host runtime's baseline start: 123 s, benchmarks/h200_host)."""
    start = {run: next(s["seconds"] for s in receipt(run)["stages"] if s["stage"] == "startup") for run in PASSED}
    assert start["pass-bf16-cold"] > 100 and start["pass-bf16-warm"] < 40
    assert start["pass-bf16-cold"] > 3 * start["pass-bf16-warm"]


def test_flashinfer_autotune_ran_in_the_container_on_a_fresh_cache_and_tuned_nothing_on_sm90() -> None:
    """The autotuner was reached (nvcc on PATH: vllm/utils/flashinfer.py:48-63 at 0.26.0) and found no
    tunable op: on SM90 the dense model's attention is FLASH_ATTN and FP8 linear is CUTLASS (FlashInfer's
    FP8 scaled-mm needs compute capability 100: vllm/model_executor/kernels/linear/scaled_mm/flashinfer.py:50)."""
    for run in PASSED:
        log = (RUNS / run / "server.log").read_text()
        assert "[Autotuner]: Autotuning process starts" in log and "No FlashInfer autotune cache entries found" in log
        found = checks(receipt(run), "autotune")
        assert found["autotune-cache"]["status"] == "PASS" and found["autotune-cache"]["evidence"]["entries"] == 0


def test_the_fp8_arm_was_served_by_cutlass_as_vllm_0_26_0_chooses_on_sm90() -> None:
    startup = checks(receipt("pass-fp8"), "startup")
    assert startup["expect:fp8-kernel-cutlass"]["status"] == "PASS"
    log = (RUNS / "pass-fp8" / "server.log").read_text()
    assert "Selected CutlassFP8ScaledMMLinearKernel for Fp8PerTensorOnlineLinearMethod" in log


@pytest.mark.parametrize(("run", "code"), [("pass-fp8", 0), ("pass-bf16-cold", 1)])
def test_the_fp8_rules_pass_the_fp8_log_and_fail_the_bf16_one(run: str, code: int) -> None:
    log = RUNS / run / "server.log"
    argv = ["inspect", "log", str(log), "--matrix", str(REPO / "matrix.yaml"), "--cell", CELL, "--arm", "fp8"]
    assert main(argv) == code


def test_the_planted_stall_is_engine_stall_api_alive_with_the_frame_from_inside_the_container() -> None:
    doc = receipt("stall")
    assert doc["status"] == "FAIL"
    assert checks(doc, "load")["engine-progress"]["message"].startswith("ENGINE_STALL_API_ALIVE")
    (event,) = doc["forensics"]
    assert event["type"] == "ENGINE_STALL_API_ALIVE" and event["py_spy"]["available"] is True
    (engine,) = event["py_spy"]["processes"]
    # pid 112 is EngineCore's pid in the container's namespace (the server log's `EngineCore pid=112`)
    assert engine["pid"] == 112 and engine["cmdline"] == "VLLM::EngineCore"
    assert "(EngineCore pid=112)" in (RUNS / "stall" / "server.log").read_text()
    main_thread = next(t for t in engine["threads"] if t["name"] == "MainThread")
    assert main_thread["top"][0].startswith("_stackproof_test_stall (stackproof_test_stall.py:")
    assert any("EngineCoreProc.run_busy_loop (vllm/v1/engine/core.py:" in frame for frame in main_thread["top"])
    dump = json.loads((RUNS / "stall" / "load" / "forensics" / "py-spy.json").read_text())
    assert dump[0]["pid"] == 112 and dump[0]["returncode"] == 0


def test_the_killed_engine_is_its_death_not_http_errors() -> None:
    doc = receipt("kill")
    assert doc["status"] == "FAIL"
    progress = checks(doc, "load")["engine-progress"]
    assert progress["status"] == "FAIL" and progress["message"].startswith("ENGINE_DEAD")
    assert "EngineDeadError" in progress["message"]
    assert "SIGKILL to EngineCore pids [62] (in-container)" in (FIXTURES / "jobs" / "kill.stdout").read_text()


@pytest.mark.parametrize("job", ["build", "bf16", "bf16-warm", "fp8", "stall", "kill"])
def test_no_container_was_left_and_the_gpu_was_free_after_every_job(job: str) -> None:
    """run.sh's own line after each job (benchmarks/gpu_docker/run.sh), kept from the call's output."""
    line = next(line for line in RECAP if line.startswith(f"=== {job}:"))
    assert "containers left: 0" in line and line.endswith("GPU memory: 0 MiB")
