"""Task runner: one session per job. `nox -l` lists them.

Sessions that touch docker need a running daemon (`bash .ci/setup` starts one on a fresh machine).
Site settings (index mirrors, the local wheel directory) are the CLI's own (pipeline/matrix/site.py): the
sessions pass nothing, so `stackproof run cpu-tiny` alone does what `nox -s demo` does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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
    # the end of each: where the minutes go, in every CI log. --run-slow: CI runs the unit tests
    # marked slow too (tests/conftest.py).
    unit = ["-n", "auto", "--dist", "loadfile", "--run-slow", "tests/unit"]
    if not docker:
        session.run("pytest", "-ra", "--durations=15", *unit, *rest)
        return
    # The audit group needs no docker: it downloads the matrix's real wheels and reads them, minutes
    # spent mostly waiting on the network. It runs beside the rest, at a lower CPU priority than the
    # servers whose timings the other groups judge.
    with _beside(session, ["tests/integration", "--run-docker", "-m", "audit", *rest], "audit"):
        session.run("pytest", "-ra", "--durations=15", *unit, *rest)
        session.run("pytest", "-ra", "--durations=60", "tests/integration", "--run-docker", "-m", "not audit", *rest)


@contextmanager
def _beside(session: nox.Session, args: list[str], name: str) -> Iterator[None]:
    """Run `pytest ARGS` niced in the background while the block runs; its log is printed after it,
    and its failure fails the session. A failure in the block stops it at once."""
    # Not session.create_tmp(): it would set TMPDIR for every later command of the session, to a
    # folder the runner user the integration tier runs the tool as cannot write.
    tmp = Path(tempfile.mkdtemp(prefix=f"stackproof-{name}-group-"))
    log_path = tmp / f"{name}.log"
    env = {**os.environ, **{k: v for k, v in session.env.items() if v is not None}}
    env["PATH"] = f"{session.bin}{os.pathsep}{env.get('PATH', '')}"
    argv = ["nice", "-n", "10", f"{session.bin}/pytest", "-ra", "--durations=10", f"--basetemp={tmp / name}", *args]
    session.log(f"{name} group beside the rest: {' '.join(argv[3:])} (log: {log_path})")
    with log_path.open("wb") as log:
        background = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        yield
        code = background.wait(timeout=3600)  # an hour: the cold download of every cell's wheels
    finally:
        if background.poll() is None:
            os.killpg(background.pid, 9)
            background.wait()
        print(f"\n===== {name} group (ran beside the rest) =====\n" + log_path.read_text(errors="replace"), flush=True)
        shutil.rmtree(tmp, ignore_errors=True)  # the audit group's wheels: 2.5 GB a run, left behind before
    if code != 0:
        session.error(f"the {name} integration group failed (exit {code}): its log is above")


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
