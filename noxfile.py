"""Task runner: one session per job. `nox -l` lists them.

Sessions that touch docker need a running daemon (`bash .ci/setup` starts one on a fresh machine).
"""

from __future__ import annotations

import os
import subprocess

import nox

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True

PYTHON = "3.11"


def _site_env() -> dict[str, str]:
    """Map the `pytorch-cpu` index to this machine's local wheel directory, when it has one.

    That is a site setting (see README), so it lives here and in the environment, never in
    matrix.yaml. An explicit STACKPROOF_MIRRORS wins.
    """
    if os.environ.get("STACKPROOF_MIRRORS"):
        return {}
    find_links = os.environ.get("PIP_FIND_LINKS")
    if not find_links:
        result = subprocess.run(["pip", "config", "get", "global.find-links"], capture_output=True, text=True)
        find_links = result.stdout.strip()
    if find_links and os.path.isdir(find_links.split()[0]):
        return {"STACKPROOF_MIRRORS": f"pytorch-cpu={find_links.split()[0]}"}
    return {}


def _install(session: nox.Session) -> None:
    session.install("-e", ".[dev]")


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    _install(session)
    session.run("ruff", "check", ".")
    session.run("mypy")
    session.run("lint-imports")  # the layers: commands above checks above the floor (pyproject.toml)


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Unit tier always; the integration tier with `-- --run-docker` (real dockerd, real builds)."""
    _install(session)
    session.run("pytest", "-ra", "tests", *session.posargs, env=_site_env())


@nox.session(python=PYTHON)
def audit(session: nox.Session) -> None:
    """`stackproof matrix audit` on every cell (or `-- CELL...`): rules vs the pinned wheels' text."""
    _install(session)
    session.run("stackproof", "matrix", "audit", *session.posargs)


@nox.session(python=PYTHON)
def render(session: nox.Session) -> None:
    _install(session)
    session.run("stackproof", "render", *session.posargs, env=_site_env())


@nox.session(python=PYTHON)
def build(session: nox.Session) -> None:
    _install(session)
    session.run("stackproof", "build", *(session.posargs or ["cpu-tiny"]), env=_site_env())


@nox.session(python=PYTHON)
def verify(session: nox.Session) -> None:
    """CI's job for one cell on a self-hosted runner (`nox -s verify -- CELL [stackproof run options]`).

    Build + verify the cell, outputs (reports, receipts, logs) under stackproof-out/. The runner
    must already have docker with BuildKit (and the NVIDIA container toolkit for GPU cells): this
    session installs only the Python package, never docker (docs/ci.md).
    """
    if not session.posargs:
        session.error("give the cell: nox -s verify -- CELL")
    cell, *options = session.posargs
    _install(session)
    session.run("stackproof", "run", cell, "--out", "stackproof-out", *options, env=_site_env())


@nox.session(python=PYTHON)
def run(session: nox.Session) -> None:
    """The main job for the cells given (`nox -s run -- CELL`)."""
    _install(session)
    session.run("stackproof", "run", *session.posargs, env=_site_env())


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """The main job on the embedded default: build, serve and prove `cpu-tiny` end to end."""
    _install(session)
    session.run("stackproof", "run", "cpu-tiny", env=_site_env())


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Measure the performance goals (benchmarks/*.py); prints numbers, asserts nothing."""
    _install(session)
    session.run("python", "benchmarks/rebuild.py", *session.posargs, env=_site_env())
