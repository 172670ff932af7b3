"""Test tiers by folder and flag: tests/unit always runs; tests/integration needs `--run-docker`.

With `--run-docker` and no daemon answering, integration tests are skipped with the reason,
except under CI (CI=true), where a missing daemon is a failure: `.ci/run` always starts one.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-docker", action="store_true", help="run the integration tier against a real dockerd")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # `pytest tests` collects alphabetically, which puts integration before unit: the minutes of
    # real builds would run before the seconds that catch most mistakes.
    items[:] = unit_tier_first(items)
    if config.getoption("--run-docker"):
        return
    skip = pytest.mark.skip(reason="integration tier: pass --run-docker (needs a real docker daemon)")
    for item in items:
        if "integration" in item.keywords:
            item.add_marker(skip)


def unit_tier_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """The unit tier's tests, then the rest, each in collection order (a stable sort)."""
    unit = Path(__file__).parent / "unit"
    return sorted(items, key=lambda item: 0 if unit in Path(item.path).parents else 1)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"
