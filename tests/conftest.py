"""Test tiers by folder and flag: tests/unit always runs; tests/integration needs `--run-docker`.

With `--run-docker` and no daemon answering, integration tests are skipped with the reason,
except under CI (CI=true), where a missing daemon is a failure: `.ci/run` always starts one.
"""

from __future__ import annotations

import os

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-docker", action="store_true", help="run the integration tier against a real dockerd")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-docker"):
        return
    skip = pytest.mark.skip(reason="integration tier: pass --run-docker (needs a real docker daemon)")
    for item in items:
        if "integration" in item.keywords:
            item.add_marker(skip)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"
