"""Host expectations a repro'd cell records (`# stackproof-host:`) are checked against this host at verify time."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.matrix.read import load_matrix
from pipeline.result import Status
from stackproof.runjob import _host_expectations

REPO = Path(__file__).resolve().parents[2]


def _matrix_with_host_line(tmp_path: Path, expected: dict[str, object]) -> Path:
    text = (REPO / "matrix.yaml").read_text()
    marker = "  - id: fi-0.6.13-matched\n"
    assert marker in text
    text = text.replace(marker, marker + f"    # stackproof-host: {json.dumps(expected)}\n")
    text = text.replace("lock: locks/", f"lock: {REPO}/locks/")
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    return path


# This host as the doctor probe saw it, given to the check rather than probed here: the test then
# says the same on a GPU runner as on a CPU machine. The document is a real one (cpu-tiny's container).
THIS_HOST = json.loads((REPO / "tests/fixtures/doctor/cpu-tiny-container.json").read_text())


def test_a_reporters_host_that_differs_warns(tmp_path: Path) -> None:
    matrix = load_matrix(
        _matrix_with_host_line(tmp_path, {"driver": "580.95.05", "gpu_count": 1}), images_dir=REPO / "images"
    )
    check = _host_expectations(matrix, matrix.cell("fi-0.6.13-matched"), this_host=lambda: THIS_HOST)
    assert check is not None and check.status is Status.WARN
    assert "driver: the report had '580.95.05'" in check.message and "gpu_count" in check.message


def test_the_same_host_passes_and_cells_without_the_line_are_not_checked(tmp_path: Path) -> None:
    matrix = load_matrix(
        _matrix_with_host_line(tmp_path, {"kernel": THIS_HOST["host"]["kernel"], "gpu_count": 0}),
        images_dir=REPO / "images",
    )
    check = _host_expectations(matrix, matrix.cell("fi-0.6.13-matched"), this_host=lambda: THIS_HOST)
    assert check is not None and check.status is Status.PASS, check
    assert _host_expectations(matrix, matrix.cell("cpu-tiny"), this_host=lambda: THIS_HOST) is None
