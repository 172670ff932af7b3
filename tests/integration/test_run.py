"""The main job on the embedded default, for real: a vLLM 0.28.0 CPU server in a container.

Also the paths that must not leave anything behind: a server that dies while starting, and a run
interrupted by SIGINT or SIGTERM while it waits for readiness.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import pytest

from pipeline.docker.client import Docker
from tests.integration.conftest import COLD, JOB, REPO, containers, created_since, runner_dir, stackproof, write_matrix
from tests.launch import launched

pytestmark = pytest.mark.integration

CELL_LABEL = "io.stackproof.cell=cpu-tiny"


@pytest.fixture
def runner_out(runner_user: str | None) -> Iterator[Path]:
    out = runner_dir(runner_user, "e2e")
    yield out
    shutil.rmtree(out, ignore_errors=True)


def test_cpu_tiny_end_to_end(docker: Docker, cpu_tiny: str, runner_user: str | None, runner_out: Path) -> None:
    """As an ordinary user in the docker group (a self-hosted runner's user), never as root. It judges
    a cold start (COLD): the image's own compile, never hidden by the session's compile cache."""
    since = time.time() - 1
    result = stackproof(["run", "cpu-tiny", "--json", "--out", str(runner_out)], user=runner_user, env=COLD)
    assert result.returncode == 0, result.stderr[-5000:]
    assert result.json()["compile_cache"] == {
        "used": False,
        "warm": False,
        "warm_not_reused": False,
        "starts": [{"server": ANY, "used": False, "warm": False}],
    }
    # A terminal a person reads: phase lines and verdicts, never the server's own output.
    assert len(result.stderr.splitlines()) < 60, result.stderr
    assert "[server cpu-tiny]" not in result.stderr and "GET /metrics" not in result.stderr
    assert len(created_since(since, "io.stackproof.role=server")) == 1, "startup and load share one server"
    report = result.json()
    assert report["servers"]["started"] == 1 and report["servers"]["planned_starts"] == 1  # type: ignore[index]
    owner = runner_user or pwd.getpwuid(os.geteuid()).pw_name
    assert all(path.owner() == owner for path in runner_out.rglob("*")), "every output belongs to the runner"
    assert report["image"]["ref"] == cpu_tiny  # type: ignore[index]
    assert report["outcome"]["passed"] is True  # type: ignore[index]
    stages = {s["stage"]: s for s in report["stages"]}  # type: ignore[union-attr]
    assert [s["stage"] for s in report["stages"]] == ["imports", "startup", "autotune", "load"]  # type: ignore[union-attr]
    assert stages["imports"]["status"] == "PASS" and stages["startup"]["status"] == "PASS"
    assert stages["autotune"]["status"] == "SKIP"  # a CPU cell: FlashInfer autotuning needs a GPU
    assert "CPU cell" in stages["autotune"]["checks"][0]["message"]
    checks = {c["name"]: c for c in stages["startup"]["checks"]}
    completion = checks["completion"]["evidence"]
    assert completion["completion_tokens"] == 16 and completion["finish_reason"] == "length"
    assert 0 < float(checks["readiness"]["evidence"]["seconds"]) < 420
    log = Path(stages["startup"]["artifacts"]["server_log"]).read_text()
    assert "Application startup complete." in log
    assert '"POST /v1/completions HTTP/1.1" 200' in log
    # The real startup log passes cpu-tiny's rules and yields its evidence.
    assert checks["expect:startup-complete"]["status"] == "PASS"
    assert checks["expect:cpu-device"]["status"] == "PASS"
    assert checks["forbid:no-traceback"]["status"] == "PASS"
    assert checks["evidence"]["evidence"]["architecture"] == [{"architecture": "LlamaForCausalLM"}]
    assert checks["evidence"]["evidence"]["engine-version"] == [{"version": "0.28.0"}]
    assert checks["signatures"]["status"] == "PASS"
    assert checks["kernel-log"]["status"] in ("PASS", "SKIP")
    probe = Path(stages["imports"]["artifacts"]["probe"])
    assert probe.is_file() and '"vllm"' in probe.read_text()
    _assert_short_load_passed(stages["load"])
    _assert_receipt(Path(stages["imports"]["artifacts"]["probe"]).parent, report)
    assert containers(CELL_LABEL) == [], "the server container must be removed after a passing run"


def test_sglang_cpu_tiny_end_to_end(
    docker: Docker, sglang_cpu_tiny: str, runner_user: str | None, runner_out: Path
) -> None:
    """The second serving engine through the same job: SGLang 0.5.18 on CPU (its kernel package
    stood in), as an ordinary user; its own ready line and rule set, vLLM's never consulted."""
    result = stackproof(["run", "sglang-cpu-tiny", "--json", "--out", str(runner_out)], user=runner_user)
    assert result.returncode == 0, result.stderr[-5000:]
    report = result.json()
    assert report["image"]["ref"] == sglang_cpu_tiny and report["outcome"]["passed"] is True  # type: ignore[index]
    stages = {s["stage"]: s for s in report["stages"]}  # type: ignore[union-attr]
    assert [s["stage"] for s in report["stages"]] == ["imports", "startup", "autotune", "load"]  # type: ignore[union-attr]
    assert stages["imports"]["status"] == "PASS" and stages["autotune"]["status"] == "SKIP"
    checks = {c["name"]: c for c in stages["startup"]["checks"]}
    assert checks["expect:sglang-ready"]["status"] == "PASS" and "expect:startup-complete" not in checks
    assert checks["expect:cpu-engine"]["status"] == "PASS"
    assert checks["forbid:no-kernel-stand-in-called"]["status"] == "PASS", "no SGLang kernel was ever called"
    assert checks["evidence"]["evidence"]["weights-loaded"][0]["architecture"] == "LlamaForCausalLM"
    assert checks["completion"]["evidence"]["completion_tokens"] == 16
    assert 0 < float(checks["readiness"]["evidence"]["seconds"]) < 420
    log = Path(stages["startup"]["artifacts"]["server_log"]).read_text()
    assert "The server is fired up and ready to roll!" in log
    _assert_short_load_passed(stages["load"])
    load = {c["name"]: c for c in stages["load"]["checks"]}
    assert "sglang:generation_tokens_total" in load["token-accounting"]["message"]
    assert containers("io.stackproof.cell=sglang-cpu-tiny") == [], "the server container is removed"


def _assert_receipt(run_dir: Path, report: dict[str, Any]) -> None:
    """receipt.json (PASS, this image id, this host), valid JUnit XML, and the Markdown summary."""
    receipt = json.loads((run_dir / "receipt.json").read_text())
    assert receipt["schema_version"] == 1 and receipt["kind"] == "stackproof.receipt"
    assert receipt["status"] == "PASS", receipt["status_reason"]
    assert receipt == report, "--json prints the receipt it wrote: one document, not two"
    assert receipt["image"]["id"].startswith("sha256:") and receipt["cell"] == "cpu-tiny"
    assert receipt["host"]["gpus"] == [] and receipt["host"]["driver"] == "none"  # a CPU host
    assert receipt["host"]["docker"] != "none" and receipt["matrix_digest"]
    assert [s["stage"] for s in receipt["stages"]] == ["imports", "startup", "autotune", "load"]
    assert receipt["load"]["questions"]["clean"] == 80 and receipt["autotune"] is None
    assert receipt["server_starts"] == 1
    # What the CPU cell cost, measured from the server container's cgroup, and on which CPU.
    assert receipt["host"]["cpu_model"] and receipt["host"]["cpu_cores"] >= 1
    cost = receipt["cost"]
    for name in ("cpu_seconds", "cpu_seconds_per_output_token", "peak_rss_bytes", "output_tok_s_per_core"):
        assert cost[name]["value"] is not None and cost[name]["value"] > 0, (name, cost[name])
    assert 1 <= cost["cores"]["value"] <= receipt["host"]["cpu_cores"]
    assert cost["energy_j"]["value"] is None and "CPU cell" in cost["energy_j"]["reason"], "GPU fields say why"
    assert receipt["build"]["image_size_bytes"]["value"] > 100 << 20
    assert receipt["build"]["source"] in ("built", "local")
    suites = ET.parse(run_dir / "junit.xml").getroot()
    assert suites.tag == "testsuites" and int(suites.get("failures", "-1")) == 0
    for suite in suites.iter("testsuite"):
        assert suite.get("name") and suite.get("tests") is not None and suite.get("failures") is not None
        assert int(suite.get("tests", "0")) == len(suite.findall("testcase"))
    summary = (run_dir / "summary.md").read_text()
    assert "stackproof `cpu-tiny`" in summary and "PASS" in summary and "**Load**" in summary
    # No secret reaches a receipt: the CA bundle's path and any index URL with credentials stay out.
    assert "BEGIN CERTIFICATE" not in json.dumps(receipt)


def _assert_short_load_passed(load: dict[str, Any]) -> None:
    """The short load on the real CPU server: clean questions, tokens that match the server's counters."""
    assert load["status"] == "PASS", load
    checks = {c["name"]: c for c in load["checks"]}
    # The startup stage's server, kept running for the load (a CPU cell: no autotune server between).
    assert checks["readiness"]["evidence"]["reused"] is True
    assert checks["signatures"]["status"] == "PASS"  # the whole log, after the load, shows no failure
    assert checks["engine-progress"]["status"] == "PASS"
    assert checks["questions"]["status"] == "PASS"
    assert checks["questions"]["evidence"]["faulted"] == 0 and checks["questions"]["evidence"]["clean"] > 0
    accounting = checks["token-accounting"]
    assert accounting["status"] == "PASS", accounting
    deltas = accounting["evidence"]["server_deltas"]
    assert deltas["generation_tokens"] == accounting["evidence"]["client_output_tokens"] > 0
    assert deltas["prompt_tokens"] == accounting["evidence"]["client_prompt_tokens"] > 0
    # Greedy determinism at concurrency 1 (phase A) must hold on the CPU server.
    assert checks["determinism-alone"]["status"] == "PASS"
    assert checks["determinism-alone"]["evidence"]["exact_match_rate"] == 1.0
    assert checks["determinism-under-load"]["status"] in ("PASS", "WARN")
    summary = json.loads(Path(load["artifacts"]["summary"]).read_text())
    assert summary["questions"]["attempted"] == summary["questions"]["clean"] == 80
    assert summary["latency_ms"]["ttft"]["p50"] > 0 and summary["latency_ms"]["tpot"]["p50"] > 0
    requests = Path(load["artifacts"]["requests"]).read_text().splitlines()
    assert len(requests) == summary["requests"]["ok"] >= 160  # 2-3 turns per question
    assert all(json.loads(line)["output_tokens"] == 32 for line in requests)  # ignore_eos: fixed lengths
    assert len(Path(load["artifacts"]["scrapes"]).read_text().splitlines()) >= 1
    assert summary["stats"]["faults"] == 0 and 0 < summary["stats"]["p_luck"] < 1


def test_server_that_exits_while_starting_fails_fast(cpu_tiny: str, tmp_path: Path) -> None:
    """An arm with an invalid argument: vLLM exits at once; the run must not wait for the timeout."""
    matrix = write_matrix(
        tmp_path / "matrix.yaml",
        edit={
            "cpu-tiny": {
                "arms": {
                    "too-long": {
                        "description": "exceeds the model's 512 positions",
                        "args": ["--max-model-len", "100000"],
                    }
                },
            }
        },
    )
    started = time.monotonic()
    result = stackproof(
        [
            "run",
            "cpu-tiny",
            "--json",
            "--arm",
            "too-long",
            "--matrix",
            str(matrix),
            "--images",
            str(REPO / "images"),
            "--out",
            str(tmp_path),
        ]
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 1, result.stderr[-3000:]
    assert "stage startup: FAIL" in result.stderr and "before it was ready" in result.stderr
    startup = {s["stage"]: s for s in result.json()["stages"]}["startup"]  # type: ignore[union-attr]
    checks = {c["name"]: c for c in startup["checks"]}
    assert checks["readiness"]["status"] == "FAIL"
    assert any("max_model_len" in line for line in checks["readiness"]["evidence"]["last_log_lines"])
    assert checks["forbid:no-traceback"]["status"] == "FAIL", "the traceback in the log must be named"
    assert "max_model_len" in result.stderr, "the last server log lines must be shown"
    assert elapsed < 120, f"took {elapsed:.0f}s: the wait must end when the container exits, not at the timeout"
    assert containers(CELL_LABEL) == []


@pytest.mark.parametrize(
    ("sig", "phase"),
    [(signal.SIGINT, "server"), (signal.SIGTERM, "server"), (signal.SIGINT, "probe")],
    ids=["SIGINT-while-waiting-for-readiness", "SIGTERM-while-waiting-for-readiness", "SIGINT-during-imports-probe"],
)
def test_interrupted_run_leaves_no_container(
    cpu_tiny: str, docker: Docker, tmp_path: Path, sig: signal.Signals, phase: str
) -> None:
    """Interrupt `stackproof run` while the container of `phase` runs: every container goes."""
    role = f"io.stackproof.role={phase}"
    proc = subprocess.Popen(  # through the launcher: SIGINT is the default even in a background job
        launched([sys.executable, "-m", "pipeline", "run", "cpu-tiny", "--out", str(tmp_path)]),
        cwd=REPO,
        # COLD: killed before it is ready, it gains nothing from the cache, and a kill in the middle
        # of vLLM's (non-atomic) cache write must not leave the session's slot broken.
        env={**os.environ, "STACKPROOF_JOB": JOB, **COLD},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not (set(containers(CELL_LABEL)) & set(containers(role))):
            assert proc.poll() is None, f"run ended before its {phase} container started: {proc.stderr.read()[-3000:]}"  # type: ignore[union-attr]
            assert time.monotonic() < deadline, f"no {phase} container appeared within 300s"
            time.sleep(0.2)
        time.sleep(2 if phase == "server" else 0.5)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr[-3000:]
    assert "interrupted; cleaned up" in stderr
    if phase == "server":
        assert "server container" in stderr and "removed" in stderr
    assert containers(CELL_LABEL) == [], f"{sig.name} during the {phase} left a container behind"
