"""The first receipts from a real GPU server: `stackproof verify h200-vllm-0.26.0-tiny --runtime host`
on the H200 (vLLM 0.26.0 CUDA, torch 2.11.0+cu130, SM90), brought back by benchmarks/h200_host/.

Four runs, each read back as written: bf16 PASS, the fp8 arm PASS (its kernel rule met), the stall
hook's run FAIL with ENGINE_STALL_API_ALIVE and the blocked frame in py-spy's dump of the
EngineCore, and the first try FAIL because the environment was not what the cell said it is given.
The fp8 arm's rules are also applied to the bf16 server's log, which must fail them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from stackproof.cli import main

REPO = Path(__file__).resolve().parents[2]
RUNS = REPO / "tests" / "fixtures" / "h200-vllm-0.26.0" / "receipts"
SCHEMA = json.loads((REPO / "docs" / "receipt.schema.json").read_text())
CELL = "h200-vllm-0.26.0-tiny"


def receipt(run: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RUNS / run / "receipt.json").read_text())
    return data


def checks(doc: dict[str, Any], stage: str) -> dict[str, dict[str, Any]]:
    found = next(s for s in doc["stages"] if s["stage"] == stage)
    return {c["name"]: c for c in found["checks"]}


@pytest.mark.parametrize("run", ["pass-bf16", "pass-fp8", "stall", "given-mismatch"])
def test_every_receipt_from_the_h200_validates_and_names_the_host_runtime(run: str) -> None:
    doc = receipt(run)
    jsonschema.Draft202012Validator(SCHEMA).validate(doc)
    assert doc["cell"] == CELL
    if doc["runtime"]:  # what the environment's own torch saw
        assert doc["runtime"]["torch"] == "2.11.0+cu130" and doc["runtime"]["distributions"]["vllm"] == "0.26.0"
        assert doc["runtime"]["gpus_seen_by_torch"][0]["capability"] == "9.0"
    assert doc["image"]["runtime"] == "host" and doc["image"]["id_is"] == "environment"
    assert doc["image"]["environment"]["source"] == "given"
    assert doc["host"]["gpus"][0]["name"] == "NVIDIA H200" and doc["host"]["docker"] == "none"


@pytest.mark.parametrize(("run", "arm"), [("pass-bf16", None), ("pass-fp8", "fp8")])
def test_both_arms_passed_every_stage_with_gpu_cost_from_nvml(run: str, arm: str | None) -> None:
    doc = receipt(run)
    assert doc["status"] == "PASS" and doc["arm"] == arm
    assert [(s["stage"], s["status"]) for s in doc["stages"]] == [
        ("imports", "PASS"),
        ("startup", "PASS"),
        ("autotune", "PASS"),
        ("load", "PASS"),
    ]
    assert checks(doc, "imports")["given-environment"]["status"] == "PASS"
    assert doc["load"]["questions"] == {"attempted": 64, "clean": 64, "faulted": 0, "incomplete": 0}
    assert doc["cost"]["source"] == "nvml" and doc["cost"]["peak_memory_bytes"]["value"] > 40 * 2**30


def test_the_fp8_arm_was_served_by_cutlass_as_vllm_0_26_0_chooses_on_sm90() -> None:
    startup = checks(receipt("pass-fp8"), "startup")
    assert startup["expect:fp8-kernel-cutlass"]["status"] == "PASS"
    assert startup["forbid:fp8-kernel-not-marlin"]["status"] == "PASS"
    log = (RUNS / "pass-fp8" / "server.log").read_text()
    assert "Selected CutlassFP8ScaledMMLinearKernel for Fp8PerTensorOnlineLinearMethod" in log


@pytest.mark.parametrize(("run", "code"), [("pass-fp8", 0), ("pass-bf16", 1)])
def test_the_fp8_rules_pass_the_fp8_log_and_fail_the_bf16_one(
    run: str, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    log = RUNS / run / "server.log"
    assert (
        main(["inspect", "log", str(log), "--matrix", str(REPO / "matrix.yaml"), "--cell", CELL, "--arm", "fp8"])
        == code
    )
    out = capsys.readouterr().out
    assert ("FAIL         expect:fp8-kernel-cutlass" in out) is (code == 1)


def test_the_stall_on_the_gpu_server_is_named_with_the_blocked_frame() -> None:
    doc = receipt("stall")
    assert doc["status"] == "FAIL"
    progress = checks(doc, "load")["engine-progress"]
    assert progress["status"] == "FAIL" and progress["message"].startswith("ENGINE_STALL_API_ALIVE")
    [incident] = doc["forensics"]
    assert incident["type"] == "ENGINE_STALL_API_ALIVE" and incident["py_spy"]["available"] is True
    # The spin rule on NVML samples of the stall's window: an idle GPU, the engine waits on the host.
    assert incident["gpu"]["verdict"] == "GPU_IDLE"
    assert incident["gpu"]["devices"]["0"]["window_util_median_percent"] == 0.0
    dumps = json.loads((RUNS / "stall" / "py-spy.json").read_text())
    engine = [d for d in dumps if d["cmdline"] == "VLLM::EngineCore"]
    assert engine and engine[0]["returncode"] == 0
    assert "_stackproof_test_stall" in engine[0]["stdout"]


def test_an_environment_that_is_not_the_given_one_fails_before_any_server() -> None:
    doc = receipt("given-mismatch")
    assert doc["status"] == "FAIL" and [s["stage"] for s in doc["stages"]] == ["imports"]
    given = checks(doc, "imports")["given-environment"]
    assert given["status"] == "FAIL"
    # The cell said 2.11.0+cu130 (torch.__version__); the wheel's metadata says 2.11.0. The cell now does.
    assert given["message"] == "torch: the cell is given 2.11.0+cu130, the environment has 2.11.0"


def test_publish_refuses_a_host_cell_and_a_host_receipt_before_docker(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("pipeline.docker.client.Docker.connect", staticmethod(lambda: pytest.fail("docker was asked")))
    real = ["--matrix", str(REPO / "matrix.yaml"), "--registry", "127.0.0.1:1"]
    assert main(["publish", CELL, *real]) == 2
    err = capsys.readouterr().err
    assert "matrix.yaml:" in err and f"cells[{CELL}] runs on the host runtime" in err
    assert "no image to attach a receipt to" in err and "Traceback" not in err
    # A docker cell handed a host run's receipt: the same refusal, naming the receipt's field.
    host_receipt = RUNS / "pass-fp8" / "receipt.json"
    assert main(["publish", "cpu-tiny", *real, "--receipt", str(host_receipt)]) == 2
    err = capsys.readouterr().err
    assert f"--receipt {host_receipt}: image.runtime: a receipt of a host run (host:/tmp/venv/bin/python)" in err
