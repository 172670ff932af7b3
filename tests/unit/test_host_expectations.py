"""Host expectations a repro'd cell records (its `host:`) are checked against this host at verify time, and
the matrix reader refuses a malformed `host:` with its line and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.errors import InputError
from pipeline.matrix.read import load_matrix
from pipeline.result import Status
from stackproof.runjob import _host_expectations

REPO = Path(__file__).resolve().parents[2]


def _matrix_with_host_line(tmp_path: Path, expected: dict[str, object]) -> Path:
    text = (REPO / "matrix.yaml").read_text()
    marker = "  - id: fi-0.6.13-matched\n"
    assert marker in text
    text = text.replace(marker, marker + f"    host: {json.dumps(expected)}\n")
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


@pytest.mark.parametrize(
    ("host", "field", "says"),
    [
        ({"drivr": "580.95.05"}, "host.drivr", "unknown key"),
        ({"gpu_count": "one"}, "host.gpu_count", "must be a count"),
        ({"gpu_count": -1}, "host.gpu_count", "must be a count"),
        ({"cudnn_host": "9.14.0"}, "host.cudnn_host", "must be a list"),
        ({"driver": ["580"]}, "host.driver", "must be a string"),
    ],
)
def test_a_malformed_host_is_refused_with_its_line_and_field(
    tmp_path: Path, host: object, field: str, says: str
) -> None:
    path = _matrix_with_host_line(tmp_path, host)  # type: ignore[arg-type]
    with pytest.raises(InputError) as refused:
        load_matrix(path, images_dir=REPO / "images")
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if text.startswith("    host: "))
    assert f"{path}:{line}:" in str(refused.value) and field in str(refused.value) and says in str(refused.value)


def test_host_is_typed_on_the_cell(tmp_path: Path) -> None:
    host = {"gpu": "NVIDIA H200", "gpu_count": 1, "driver": "580.159.04", "cudnn_host": ["9.14.0"]}
    matrix = load_matrix(_matrix_with_host_line(tmp_path, host), images_dir=REPO / "images")
    cell = matrix.cell("fi-0.6.13-matched")
    assert cell.host is not None and cell.host.driver == "580.159.04" and cell.host.cudnn_host == ("9.14.0",)
    assert cell.host.as_dict() == host and matrix.cell("cpu-tiny").host is None
