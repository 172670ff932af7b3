"""pipeline/host/env.py: an environment given with `--python` (checked, never changed) and the
versions a host cell says it is given, against a real interpreter's inventory."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pipeline.errors import InputError
from pipeline.host.env import given_differences, given_env
from pipeline.matrix.model import HOST_BASE, Cell, Requirement
from pipeline.result import Status
from stackproof.runjob import _given_check


def host_cell(**given: str) -> Cell:
    return Cell(
        id="h",
        line=1,
        base=HOST_BASE,
        platform="linux/amd64",
        arch="sm90",
        runner=(),
        system_packages=(),
        install=None,
        overrides=(),
        uninstall=(),
        recipes=(),
        env=(),
        serve=None,
        arms=(),
        expect=None,
        runtime="host",
        given=tuple(Requirement(name=n, version=v, index="pypi") for n, v in sorted(given.items())),
    )


def test_this_interpreter_is_a_given_environment_with_its_inventory() -> None:
    env = given_env(sys.executable)
    assert env.source == "given" and env.root is None and env.digest.startswith("sha256:")
    names = {name for name, _ in env.versions}
    assert "pytest" in names and env.packages == len(env.versions)
    assert env.python_version == sys.version.split()[0]


def test_a_missing_or_not_executable_python_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"--python .*/nope: no such file") as info:
        given_env(str(tmp_path / "nope"))
    assert info.value.exit_code == 2
    plain = tmp_path / "python"
    plain.write_text("#!/bin/sh\n")
    with pytest.raises(InputError, match="not an executable file"):
        given_env(str(plain))


def test_an_executable_that_is_no_python_is_bad_input(tmp_path: Path) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho not python >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(InputError, match="not python"):
        given_env(str(fake))


def test_the_given_versions_must_all_be_there() -> None:
    here = (("vllm", "0.26.0"), ("flashinfer-python", "0.6.14"), ("torch", "2.11.0+cu130"))
    cell = host_cell(vllm="0.26", torch="2.11.0+cu130")
    assert given_differences(cell, here) == ()  # 0.26 is 0.26.0
    wrong = host_cell(vllm="0.28.0", torch="2.11.0", uvicorn="0.54.0")
    assert given_differences(wrong, here) == (
        "torch: the cell is given 2.11.0, the environment has 2.11.0+cu130",
        "uvicorn: the cell is given 0.54.0, the environment has none",
        "vllm: the cell is given 0.28.0, the environment has 0.26.0",
    )


def test_the_given_check_passes_on_the_real_environment_and_fails_on_another() -> None:
    env = given_env(sys.executable)
    pytest_version = dict(env.versions)["pytest"]
    passed = _given_check(host_cell(pytest=pytest_version), env)
    assert passed is not None and passed.status == Status.PASS
    failed = _given_check(host_cell(pytest="0.0.1"), env)
    assert failed is not None and failed.status == Status.FAIL
    assert failed.message == f"pytest: the cell is given 0.0.1, the environment has {pytest_version}"
    assert _given_check(host_cell(), env) is None  # nothing given: nothing to check


def test_a_given_python_other_than_the_locks_is_located_bad_input(tmp_path: Path) -> None:
    import dataclasses

    from pipeline.matrix.read import load_matrix
    from pipeline.matrix.site import SiteSettings
    from stackproof.runjob import _host_env

    repo = Path(__file__).resolve().parents[2]
    matrix = load_matrix(repo / "matrix.yaml", images_dir=repo / "images")
    cell = matrix.cell("cpu-tiny-host")
    assert cell.install is not None
    other = "3.9" if not sys.version.startswith("3.9") else "3.12"
    locked_elsewhere = dataclasses.replace(cell, install=dataclasses.replace(cell.install, python_version=other))
    with pytest.raises(InputError) as info:
        _host_env(matrix, locked_elsewhere, SiteSettings(), repo / "images", build=False, python=sys.executable,
                  out_dir=tmp_path)  # fmt: skip
    assert info.value.exit_code == 2
    assert str(info.value) == (
        f"{matrix.file}:{cell.line}: cells[cpu-tiny-host].install.python_version: the lock is for Python {other}, "
        f"and --python {Path(sys.executable).absolute()} is Python {sys.version.split()[0]}"
    )
    same = _host_env(
        matrix, cell, SiteSettings(), repo / "images", build=False, python=sys.executable, out_dir=tmp_path
    )
    assert same.source == "given"  # this interpreter is the lock's 3.11
