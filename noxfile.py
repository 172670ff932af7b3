"""Task runner: one session per job. `nox -l` lists them.

Sessions that touch docker need a running daemon (`bash .ci/setup` starts one on a fresh machine).
Site settings (index mirrors, the local wheel directory) are the CLI's own (pipeline/matrix/site.py): the
sessions pass nothing, so `stackproof run cpu-tiny` alone does what `nox -s demo` does.
"""

from __future__ import annotations

import nox

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True

PYTHON = "3.11"


def _install(session: nox.Session, *, dev: bool = True) -> None:
    # The jobs that only run the tool (demo, run, verify...) skip the dev tools: a minute and a
    # half of silent installing before a demo's first line otherwise.
    session.install("-e", ".[dev]" if dev else ".")


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
    docker = "--run-docker" in session.posargs
    rest = [arg for arg in session.posargs if arg != "--run-docker"]
    # The unit tier on every core, a file per worker (a module fixture, like the fuzz suite's one
    # child process for all its cases, runs once); the integration tier after it, one test at a
    # time: its real servers share the host's cores and one daemon. The slowest tests are listed at
    # the end of each: where the minutes go, in every CI log.
    # --run-slow: CI runs the unit tests marked slow too (tests/conftest.py).
    unit = ["-n", "auto", "--dist", "loadfile", "--run-slow", "tests/unit"]
    session.run("pytest", "-ra", "--durations=15", *unit, *rest)
    if docker:
        session.run("pytest", "-ra", "--durations=25", "tests/integration", "--run-docker", *rest)


@nox.session(python=PYTHON)
def unit(session: nox.Session) -> None:
    """The quick unit tier (under a minute): the tests marked slow are left to `nox -s tests` and CI."""
    _install(session)
    session.run("pytest", "-q", "--durations=10", "-n", "auto", "--dist", "loadfile", "tests/unit", *session.posargs)


@nox.session(python=PYTHON)
def integration(session: nox.Session) -> None:
    """One integration group alone (`nox -s integration -- serve`): build, serve, registry, audit,
    host (INTEGRATION_GROUPS in tests/conftest.py; a name that is none selects no test and fails)."""
    if not session.posargs:
        session.error("name a group: nox -s integration -- build|serve|registry|audit|host [pytest options]")
    group, *rest = session.posargs
    _install(session)
    session.run("pytest", "-ra", "--durations=15", "tests/integration", "--run-docker", "-m", group, *rest)


@nox.session(python=PYTHON)
def audit(session: nox.Session) -> None:
    """`stackproof matrix audit` on every cell (or `-- CELL...`): rules vs the pinned wheels' text."""
    _install(session)
    session.run("stackproof", "matrix", "audit", *session.posargs)


@nox.session(python=PYTHON)
def render(session: nox.Session) -> None:
    _install(session, dev=False)
    session.run("stackproof", "render", *session.posargs)


@nox.session(python=PYTHON)
def build(session: nox.Session) -> None:
    _install(session, dev=False)
    session.run("stackproof", "build", *(session.posargs or ["cpu-tiny"]))


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
    _install(session, dev=False)
    session.run("stackproof", "run", cell, "--out", "stackproof-out", *options)


@nox.session(python=PYTHON)
def run(session: nox.Session) -> None:
    """The main job for the cells given (`nox -s run -- CELL`)."""
    _install(session, dev=False)
    session.run("stackproof", "run", *session.posargs)


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """The main job on the embedded default: build, serve and prove `cpu-tiny` end to end."""
    _install(session, dev=False)
    session.run("stackproof", "run", "cpu-tiny")


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Measure the performance goals (benchmarks/*.py); prints numbers, asserts nothing."""
    _install(session)
    session.run("python", "benchmarks/rebuild.py", *session.posargs)
