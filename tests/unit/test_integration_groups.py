"""The integration tier's groups (tests/conftest.py) cover every file once, and nox names them all."""

from __future__ import annotations

from pathlib import Path

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
