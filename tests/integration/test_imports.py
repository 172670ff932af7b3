"""Stage `imports` on real CPU images: a matched FlashInfer pair passes, a mismatched one fails
at `import flashinfer` with FlashInfer's own error (0.6.x) or on the kernels FlashInfer 0.7 would
fetch at start, and no server is ever started for either."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pipeline.docker.client import Docker
from tests.integration.conftest import REPO, created_since, stackproof, write_matrix

pytestmark = pytest.mark.integration


def test_matched_flashinfer_pair_imports(docker: Docker, cpu_tiny: str, tmp_path: Path) -> None:
    result = stackproof(["run", "fi-0.6.13-matched", "--json", "--out", str(tmp_path)])
    assert result.returncode == 0, result.stderr[-4000:]
    report = result.json()
    imports = report["stages"][0]  # type: ignore[index]
    assert imports["stage"] == "imports" and imports["status"] == "PASS"
    checks = {c["name"]: c for c in imports["checks"]}
    assert checks["import"]["evidence"]["flashinfer"] == "ok"
    assert checks["flashinfer-trio"]["evidence"]["flashinfer_import_check"] == "passes"
    assert report["outcome"]["passed"] is True  # type: ignore[index]


def test_mismatched_flashinfer_pair_fails_at_imports_and_starts_no_server(
    docker: Docker, cpu_tiny: str, tmp_path: Path
) -> None:
    build = stackproof(["build", "fi-mismatch", "--out", str(tmp_path)])
    assert build.returncode == 0, build.stderr[-4000:]
    since = time.time() - 1
    result = stackproof(["run", "fi-mismatch", "--json", "--out", str(tmp_path)])
    # The cell expects this failure, so the pipeline passes: exit 0, outcome explains why.
    assert result.returncode == 0, result.stderr[-4000:]
    report = result.json()
    assert [s["stage"] for s in report["stages"]] == ["imports"]  # type: ignore[union-attr]
    imports = report["stages"][0]  # type: ignore[index]
    assert imports["status"] == "FAIL"
    checks = {c["name"]: c for c in imports["checks"]}
    assert checks["import"]["message"].startswith(
        "import flashinfer raised RuntimeError: flashinfer-cubin version (0.6.13) does not match "
        "flashinfer version (0.6.18.post1)"
    )
    assert checks["flashinfer-trio"]["status"] == "FAIL"
    assert report["outcome"]["expected_failure"]["matched"] is True  # type: ignore[index]
    assert "not running startup" in result.stderr
    # The probe container is visible in the daemon's events (so the query works) and no server was.
    assert created_since(since, "io.stackproof.role=probe"), "the events query saw no probe container"
    assert created_since(since, "io.stackproof.role=server") == []


def test_flashinfer_07_ignoring_a_mismatched_cubin_fails_at_imports(
    docker: Docker, cpu_tiny: str, tmp_path: Path
) -> None:
    """FlashInfer 0.7.4 next to cubin 0.6.13: `import flashinfer` succeeds with a warning, and the
    image would download cubins at start. The stage fails it on the versions and shows the warning."""
    build = stackproof(["build", "fi-0.7.4-cubin-0.6.13", "--out", str(tmp_path)])
    assert build.returncode == 0, build.stderr[-4000:]
    since = time.time() - 1
    result = stackproof(["run", "fi-0.7.4-cubin-0.6.13", "--json", "--out", str(tmp_path)])
    assert result.returncode == 0, result.stderr[-4000:]
    report = result.json()
    assert [s["stage"] for s in report["stages"]] == ["imports"]  # type: ignore[union-attr]
    imports = report["stages"][0]  # type: ignore[index]
    assert imports["status"] == "FAIL"
    checks = {c["name"]: c for c in imports["checks"]}
    assert checks["import"]["status"] == "PASS" and checks["import"]["evidence"]["flashinfer"] == "ok"
    trio = checks["flashinfer-trio"]
    assert trio["status"] == "FAIL"
    assert trio["message"].startswith(
        "flashinfer-python 0.7.4 ignores flashinfer-cubin 0.6.13 (not 0.7.4) and would download cubins at start"
    )
    assert trio["evidence"]["flashinfer_import_check"].startswith("ignores, and downloads or compiles kernels")
    [logged] = trio["evidence"]["flashinfer_import_log"]
    assert logged.startswith(
        "Ignoring incompatible flashinfer-cubin package (cubins will be downloaded on demand to "
    ) and logged.endswith(
        ": flashinfer-cubin version (0.6.13) does not match flashinfer version (0.7.4). "
        "Run `flashinfer download-kernels` to install matching kernel wheels, or set "
        "FLASHINFER_DISABLE_VERSION_CHECK=1 to use the installed version anyway."
    )
    assert checks["requirements"]["status"] == "PASS", checks["requirements"]["message"]
    assert report["outcome"]["expected_failure"]["matched"] is True  # type: ignore[index]
    assert created_since(since, "io.stackproof.role=server") == []


def test_verify_needs_a_built_image(docker: Docker, tmp_path: Path) -> None:
    """A cell whose content tag was never built: verify says what to run, and builds nothing."""
    overrides = {
        "flashinfer-python": {"version": "0.6.13", "index": "pypi"},
        "flashinfer-cubin": {"version": "0.6.13", "index": "pypi"},
        "tabulate": {"version": "0.9.0", "index": "pypi"},
    }
    matrix = write_matrix(tmp_path / "matrix.yaml", edit={"fi-0.6.13-matched": {"overrides": overrides}})
    result = stackproof(["verify", "fi-0.6.13-matched", "--matrix", str(matrix), "--images", str(REPO / "images")])
    assert result.returncode == 2, result.stderr[-3000:]
    assert "is not built: run `stackproof build fi-0.6.13-matched`" in result.stderr
    assert "docker build" not in result.stderr
