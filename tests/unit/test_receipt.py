"""Receipts: the status publish gates on, JUnit XML a CI viewer accepts, the Markdown summary.

The committed example (docs/receipt-cpu-tiny.json) is a real receipt from `stackproof run cpu-tiny`.
"""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from pipeline.errors import InputError
from pipeline.host.geometry import HostFingerprint, differences
from pipeline.receipt import SCHEMA_FILE, Receipt
from pipeline.receiptrender import render_junit, render_markdown, write_all
from pipeline.registry.oci import split_registry
from pipeline.registry.publish import legacy_receipt_tag, referrers_tag
from pipeline.result import CheckResult, Outcome, StageResult, Status, VerifyReport
from verify.stages.receipt import build_receipt, receipt_status

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "receipt-cpu-tiny.json"
CPU = HostFingerprint(
    arch="x86_64", kernel="6.1", os="Debian 12", docker="20.10", gpus=(), driver="none", cuda_driver="none"
)
SPARK = HostFingerprint(
    arch="aarch64",
    kernel="6.8",
    os="Ubuntu 24.04",
    docker="28.0",
    gpus=({"name": "NVIDIA GB10", "compute_capability": "12.1", "memory": "128 GiB"},),
    driver="580.95.05",
    cuda_driver="13.0",
)


def _report(*statuses: Status, passed: bool = True, expected: dict[str, object] | None = None) -> VerifyReport:
    stages = tuple(
        StageResult.of(
            stage, [CheckResult(name=f"{stage}-check", status=status, message=f"{stage} said {status}")], 1.5
        )
        for stage, status in zip(("imports", "startup", "autotune", "load"), statuses, strict=False)
    )
    return VerifyReport(
        cell="cpu-tiny",
        arm=None,
        image="stackproof/cpu-tiny:abc",
        image_id="sha256:" + "1" * 64,
        stages=stages,
        outcome=Outcome(passed=passed, summary="summary", expected_failure=expected),
    )


@pytest.mark.parametrize(
    ("statuses", "passed", "expected", "status"),
    [
        ((Status.PASS, Status.PASS, Status.SKIP, Status.PASS), True, None, "PASS"),
        ((Status.PASS, Status.WARN, Status.SKIP, Status.PASS), True, None, "PASS"),
        ((Status.PASS, Status.PASS), True, None, "INCONCLUSIVE"),  # --stages imports,startup: partial
        ((Status.SKIP, Status.SKIP, Status.SKIP, Status.SKIP), True, None, "INCONCLUSIVE"),
        ((Status.PASS, Status.FAIL), False, None, "FAIL"),
        ((Status.PASS, Status.INCONCLUSIVE), True, None, "INCONCLUSIVE"),
        ((Status.SKIP,), True, None, "INCONCLUSIVE"),
        ((Status.FAIL,), True, {"stage": "imports", "matched": True}, "FAIL"),  # known-bad, failed as expected
    ],
)
def test_receipt_status(
    statuses: tuple[Status, ...], passed: bool, expected: dict[str, object] | None, status: str
) -> None:
    assert receipt_status(_report(*statuses, passed=passed, expected=expected))[0] == status


def _receipt(*statuses: Status, passed: bool = True) -> Receipt:
    return build_receipt(
        _report(*statuses, passed=passed),
        matrix_digest="sha256:" + "2" * 64,
        host=SPARK,
        started_at=0.0,
        finished_at=9.0,
    )


def test_junit_counts_failures_and_skips_per_suite() -> None:
    root = ET.fromstring(
        render_junit(_receipt(Status.PASS, Status.FAIL, Status.SKIP, Status.INCONCLUSIVE, passed=False))
    )
    assert root.tag == "testsuites" and root.get("tests") == "4" and root.get("failures") == "2"
    suites = {s.get("name"): s for s in root.iter("testsuite")}
    assert set(suites) == {"cpu-tiny.imports", "cpu-tiny.startup", "cpu-tiny.autotune", "cpu-tiny.load"}
    for suite in suites.values():  # what CI report viewers require of every testsuite
        assert suite.get("name") and suite.get("tests") == "1" and suite.get("failures") in ("0", "1")
    assert suites["cpu-tiny.startup"].find("testcase/failure") is not None
    assert suites["cpu-tiny.autotune"].find("testcase/skipped") is not None
    inconclusive = suites["cpu-tiny.load"].find("testcase/failure")
    assert inconclusive is not None and inconclusive.get("type") == "INCONCLUSIVE"
    passing = ET.fromstring(render_junit(_receipt(Status.PASS, Status.PASS)))
    assert passing.get("failures") == "0" and passing.find(".//failure") is None


def test_markdown_names_status_host_and_findings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    receipt = _receipt(Status.PASS, Status.FAIL, passed=False)
    text = render_markdown(receipt)
    assert "FAIL" in text and "1x NVIDIA GB10 (cc 12.1)" in text and "startup said FAIL" in text
    summary = tmp_path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    paths = write_all(receipt, tmp_path / "run")
    assert summary.read_text().startswith("### ") and json.loads(paths["receipt"].read_text())["status"] == "FAIL"
    assert paths["junit"].is_file() and paths["summary"].read_text() == text


def _write_into(done: list[dict[str, Path]], out: Path) -> None:
    done.append(write_all(_receipt(Status.PASS), out))


def test_a_step_summary_that_is_a_fifo_without_reader_is_skipped_not_waited_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 27, class 3: $GITHUB_STEP_SUMMARY naming a FIFO nobody reads made write_all's append wait
    for ever (seen: the child timed out); now the run's own files are written and the summary is
    refused with a warning. A device there is refused the same way (not a regular file)."""
    import threading

    fifo = tmp_path / "summary-fifo"
    os.mkfifo(fifo)
    for target in (fifo, Path("/dev/null")):
        monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(target))
        done: list[dict[str, Path]] = []
        worker = threading.Thread(target=_write_into, args=(done, tmp_path / "r"), daemon=True)
        worker.start()
        worker.join(timeout=10)
        assert done, f"write_all still waiting on GITHUB_STEP_SUMMARY={target}"
        assert done[0]["receipt"].is_file()
        assert f"GITHUB_STEP_SUMMARY={target}: not" in capsys.readouterr().err


def test_the_committed_example_is_a_real_passing_cpu_tiny_receipt() -> None:
    receipt = json.loads(EXAMPLE.read_text())
    assert receipt["schema_version"] == 1 and receipt["status"] == "PASS" and receipt["cell"] == "cpu-tiny"
    assert receipt["host"]["gpus"] == [] and receipt["image"]["id"].startswith("sha256:")
    load = receipt["load"]
    checks = {c["name"]: c for s in receipt["stages"] if s["stage"] == "load" for c in s["checks"]}
    deltas = checks["token-accounting"]["evidence"]["server_deltas"]
    assert deltas["generation_tokens"] == checks["token-accounting"]["evidence"]["client_output_tokens"]
    assert load["questions"]["clean"] == load["questions"]["attempted"] > 0
    ET.fromstring(render_junit(Receipt.parse(receipt)))  # renders again from the stored form


def test_host_key_and_differences() -> None:
    assert CPU.key != SPARK.key and CPU.describe() == "no GPU on x86_64"
    assert differences(SPARK, SPARK) == []
    diffs = differences(SPARK, CPU)
    assert any(d.startswith("architecture") for d in diffs) and any(d.startswith("GPUs") for d in diffs)
    assert HostFingerprint.parse(SPARK.to_json()) == SPARK


def test_registry_names() -> None:
    assert split_registry("127.0.0.1:5000") == ("127.0.0.1:5000", "")
    assert split_registry("http://reg.example:443/team/") == ("reg.example:443", "team")
    assert referrers_tag("sha256:" + "a" * 64) == "sha256-" + "a" * 64  # the OCI referrers tag schema
    assert legacy_receipt_tag("sha256:" + "a" * 64) == "sha256-" + "a" * 64 + ".receipt"  # stackproof 0.1
    with pytest.raises(InputError):
        split_registry("")


def test_real_h200_fingerprint_and_nvml_snapshot() -> None:
    """Recorded on the H200 by pipeline.host.geometry.host_fingerprint and verify.load.watchdog.gpu_snapshot.

    Idle, then a matmul.
    """
    data = json.loads(
        (Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "h200-host-and-nvml.json").read_text()
    )
    h200 = HostFingerprint.parse(data["host"])
    assert h200.describe() == "1x NVIDIA H200 (cc 9.0), driver 580.159.04 on x86_64"
    assert h200.key == data["host"]["key"]  # the key is stable across the JSON round trip
    assert differences(h200, CPU) == ["GPUs 1x NVIDIA H200 (cc 9.0) vs no GPU", "driver 580.159.04 vs none"]
    idle, busy = data["gpu_idle"]["devices"][0], data["gpu_busy"]["devices"][0]
    assert idle["util_percent"] < busy["util_percent"] == 100 and busy["power_w"] > 5 * idle["power_w"]


# -- the typed receipt and its JSON Schema ----------------------------------------------------------


def _validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(SCHEMA_FILE.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_receipts_written_now_and_the_committed_example_meet_the_schema(tmp_path: Path) -> None:
    validator = _validator()
    for receipt in (_receipt(Status.PASS, Status.PASS), _receipt(Status.PASS, Status.FAIL, passed=False)):
        written = json.loads(write_all(receipt, tmp_path / receipt.status)["receipt"].read_text())
        assert list(validator.iter_errors(written)) == []
        assert Receipt.parse(written) == receipt, "read back, it is the receipt that was written"
    assert list(validator.iter_errors(json.loads(EXAMPLE.read_text()))) == []


@pytest.mark.parametrize(
    ("edit", "where"),
    [
        (lambda d: d.update(status="VERIFIED"), "status"),
        (lambda d: d.pop("stages"), "stages"),
        (lambda d: d["image"].update(id="latest"), "id"),
        (lambda d: d["stages"][0]["checks"][0].update(status="OK"), "status"),
        (lambda d: d.update(schema_version=2), "schema_version"),
    ],
)
def test_the_schema_rejects_a_receipt_that_is_not_one(edit: Callable[[dict[str, Any]], object], where: str) -> None:
    document = _receipt(Status.PASS, Status.PASS).to_json()
    edit(document)
    errors = list(_validator().iter_errors(document))
    assert errors and any(where in (list(e.path) + list(e.schema_path) + [e.message]).__repr__() for e in errors)


def test_parse_says_what_is_wrong_with_a_document() -> None:
    document = _receipt(Status.PASS).to_json()
    with pytest.raises(ValueError, match="not a stackproof receipt"):
        Receipt.parse({"kind": "something.else"})
    with pytest.raises(ValueError, match="schema_version: 2; this tool reads 1"):
        Receipt.parse({**document, "schema_version": 2})
    with pytest.raises(InputError, match=r"stages\[0\]\.status: 'OK', not a status"):
        Receipt.parse({**document, "stages": [{"stage": "imports", "status": "OK", "checks": [], "seconds": 0}]})


def test_the_summary_shows_the_cost_and_build_numbers_that_have_values() -> None:
    import dataclasses

    from verify.forensics.cpucost import CpuSample, cpu_cost_fields
    from verify.stages.receipt import build_section

    samples = [CpuSample(at=0.0, cpu_seconds=1.0, rss_bytes=300 << 20), CpuSample(at=1.0, cpu_seconds=3.0, rss_bytes=1)]
    cost = {"energy_j": {"value": None, "unit": "J", "reason": "CPU cell"}}
    cost.update(cpu_cost_fields(samples, output_tokens=1000, seconds=2.0, cores=2))
    receipt = dataclasses.replace(
        _receipt(Status.PASS), cost=cost, build=build_section(source="built", made_in_s=130.0, image_size=3 << 30)
    )
    line = next(line for line in render_markdown(receipt).splitlines() if line.startswith("**Cost**"))
    assert line == "**Cost**: CPU-s/token 0.00200, peak RSS 300.0 MiB, tok/s per core 250.0, build 130 s, image 3.0 GiB"
    assert "**Cost**" not in render_markdown(_receipt(Status.PASS)), "nothing measured: no cost line"
    written = json.loads(receipt_json(receipt))
    assert written["build"]["image_size_bytes"]["value"] == 3 << 30 and Receipt.parse(written).build == receipt.build


def receipt_json(receipt: Receipt) -> str:
    return json.dumps(receipt.to_json())


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REAL_RECEIPTS = sorted([*FIXTURES.rglob("receipt.json"), SCHEMA_FILE.parent / "receipt-cpu-tiny.json"])


@pytest.mark.parametrize("path", REAL_RECEIPTS, ids=lambda p: "/".join(p.parts[-3:]))
def test_a_real_receipts_load_section_reads_back_typed_and_writes_back_key_for_key(path: Path) -> None:
    """Receipts from real runs (cpu-tiny here, vLLM 0.26.0 on the H200): the typed load section
    (pipeline/findings.py) is the JSON it came from, in the same order, so a receipt read and written
    again says the same."""
    document = json.loads(path.read_text())
    receipt = Receipt.parse(document, source=str(path))
    if document.get("load") is None:
        assert receipt.load is None
        return
    assert receipt.load is not None and receipt.load.summary.questions.attempted >= 0
    written = receipt.to_json()["load"]
    assert json.dumps(written) == json.dumps(document["load"])


def test_the_gpu_access_is_recorded_optional_and_checked(tmp_path: Path) -> None:
    """Which way the container got its GPUs (pipeline/docker/gpuaccess.py): written, read back,
    validated; absent in a receipt without a GPU (older receipts stay valid); a bad one is refused."""
    import dataclasses

    plain = _receipt(Status.PASS, Status.PASS)
    assert "gpu_access" not in plain.to_json()["image"]
    access = {"how": "cdi", "cdi_kind": "nvidia.com/gpu", "source": "CDI spec for nvidia.com/gpu: /etc/cdi/nvidia.yaml"}
    gpu = dataclasses.replace(plain, image=dataclasses.replace(plain.image, gpu_access=access))
    written = json.loads(write_all(gpu, tmp_path)["receipt"].read_text())
    assert written["image"]["gpu_access"] == access and list(_validator().iter_errors(written)) == []
    assert Receipt.parse(written) == gpu
    written["image"]["gpu_access"]["how"] = "nvidia"
    assert [e.message for e in _validator().iter_errors(written)] == ["'nvidia' is not one of ['gpus', 'cdi']"]


def test_an_archive_base_is_recorded_optional_and_checked(tmp_path: Path, real_matrix) -> None:
    """The archive a docker image grew from (issue 40: the GPU host's own tree) is in `image.base`:
    written from the real matrix's gpu-host-tree base, read back, validated; absent for any other base;
    a sha256 that is not 64 hex digits is refused by the schema."""
    import dataclasses

    from stackproof.runjob import _archive_base

    assert _archive_base(real_matrix, real_matrix.cell("cpu-tiny")) is None
    base = _archive_base(real_matrix, real_matrix.cell("gpu-docker-vllm-0.26.0-tiny"))
    assert base is not None and base["format"] == "rootfs" and base["archive"] == "hostbase.tar"
    plain = _receipt(Status.PASS, Status.PASS)
    assert "base" not in plain.to_json()["image"]
    with_base = dataclasses.replace(plain, image=dataclasses.replace(plain.image, base=base))
    written = json.loads(write_all(with_base, tmp_path)["receipt"].read_text())
    assert written["image"]["base"] == base and list(_validator().iter_errors(written)) == []
    assert Receipt.parse(written) == with_base
    written["image"]["base"]["sha256"] = "sha256:" + "0" * 64
    assert list(_validator().iter_errors(written))
