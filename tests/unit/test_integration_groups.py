"""The integration tier's groups (tests/conftest.py) cover every file once, and nox names them all."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from types import ModuleType

import nox.command
import pytest

from tests.conftest import INTEGRATION_GROUPS, integration_group

REPO = Path(__file__).resolve().parents[2]


def test_every_integration_file_is_in_exactly_one_group() -> None:
    files = sorted(p.stem for p in (REPO / "tests" / "integration").glob("test_*.py"))
    placed = [module for modules in INTEGRATION_GROUPS.values() for module in modules]
    assert sorted(placed) == files, "a file in no group or in two (INTEGRATION_GROUPS, tests/conftest.py)"
    assert integration_group("test_publish") == "registry" and integration_group("test_nothing") is None


def test_the_nox_session_names_every_group() -> None:
    noxfile = (REPO / "noxfile.py").read_text()
    usage = next(line for line in noxfile.splitlines() if "nox -s integration -- build|" in line)
    assert set(usage.split("-- ", 1)[1].split(" ", 1)[0].split("|")) == set(INTEGRATION_GROUPS)


@functools.cache
def _noxfile() -> ModuleType:
    """noxfile.py as a module, loaded once (each load registers its sessions with nox)."""
    spec = importlib.util.spec_from_file_location("stackproof_noxfile", REPO / "noxfile.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_nox_schedule_names_only_real_groups_and_runs_each_once() -> None:
    """AUDIT beside everything, QUIET beside the first TIMED group, TIMED one after another, WORKFLOWS
    beside QUIET and TIMED; a group in none of them (a new one) runs in the foreground after them (its
    `-m` is the complement)."""
    nox_file = _noxfile()
    placed = [nox_file.AUDIT, *nox_file.QUIET, *nox_file.TIMED, nox_file.WORKFLOWS]
    assert len(placed) == len(set(placed)) and set(placed) <= set(INTEGRATION_GROUPS), placed
    assert "serve" in nox_file.TIMED and "proofs" in nox_file.TIMED, (
        "the groups that judge timings never run beside each other"
    )


def test_the_session_ends_with_the_20_slowest_tests_and_each_groups_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    timing = _noxfile().Timing(tmp_path)
    for group, count in (("unit", 25), ("serve", 3)):
        cases = "".join(f'<testcase classname="tests.{group}" name="t{i}" time="{i}.5"/>' for i in range(count))
        (tmp_path / f"{group}.xml").write_text(
            f'<testsuites><testsuite name="pytest" tests="{count}" time="{count * 10}">{cases}</testsuite></testsuites>'
        )
    timing.walls["unit"] = 250.0
    timing.report()
    out = capsys.readouterr().out
    slowest = out.split("the 20 slowest tests (all groups) =====\n")[1].split("=====")[0].splitlines()
    assert len(slowest) == 20 and slowest[0].split() == ["24.5s", "unit", "tests.unit::t24"]
    assert "serve" in out.split("each group's time")[1] and "30s  3 tests" in out
    assert "unit                 250s" in out


class _Session:
    """What Timing asks of a nox session: run (failing for the argv named in `failing`) and error."""

    def __init__(self, failing: set[str]) -> None:
        self.failing, self.ran, self.errors = failing, [], []  # type: ignore[var-annotated]

    def run(self, *argv: str, success_codes: list[int]) -> None:
        self.ran.append(argv[0])
        if argv[0] in self.failing:
            raise nox.command.CommandFailed(f"{argv[0]} failed")

    def error(self, message: str) -> None:
        self.errors.append(message)


def test_a_failing_group_hides_none_after_it_and_fails_the_session_at_its_end(tmp_path: Path) -> None:
    timing = _noxfile().Timing(tmp_path)
    session = _Session(failing={"serve"})
    for group in ("unit", "serve", "proofs"):
        timing.run(session, group, [group])
    assert session.ran == ["unit", "serve", "proofs"] and timing.failed == ["serve"]
    assert set(timing.walls) == {"unit", "serve", "proofs"}
    timing.fail_if_any(session)
    assert session.errors == ["failed: serve (each group's log is above)"]
    passing, clean = _Session(failing=set()), _noxfile().Timing(tmp_path)
    clean.run(passing, "unit", ["unit"])
    clean.fail_if_any(passing)
    assert passing.errors == [] and clean.failed == []


def test_the_run_removes_the_images_of_its_groups_and_bases_never_another_runs() -> None:
    """Groups leave their images to the run (tests/integration/conftest.py: STACKPROOF_TEST_RUN): a
    group that removed them on leaving took a shared content tag from under a group still running."""
    nox_file = _noxfile()
    run = "nox-vm-4242"
    for label in (f"{run}-prebuild", f"{run}-pytest-77", "", "<no value>"):
        assert nox_file._made_by_the_run(label, run), label
    for label in ("nox-vm-42421-pytest-9", "nox-vm-17-prebuild", "pytest-vm-4242", "release-build"):
        assert not nox_file._made_by_the_run(label, run), label
