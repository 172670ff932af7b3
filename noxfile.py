"""Task runner: one session per job. `nox -l` lists them.

Sessions that touch docker need a running daemon (`bash .ci/setup` starts one on a fresh machine).
Site settings (index mirrors, the local wheel directory) are the CLI's own (pipeline/matrix/site.py): the
sessions pass nothing, so `stackproof run cpu-tiny` alone does what `nox -s demo` does.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import nox
import nox.command

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


# The integration groups (tests/conftest.py INTEGRATION_GROUPS) by how they may share the machine
# (docs/ci.md). AUDIT needs no docker and runs beside everything from the start. QUIET groups judge
# no timing: they run beside the first TIMED group, niced. TIMED groups judge timings (load, A/B,
# sweep, bisect) and run one after another; the last runs alone. A group in no tuple (a new one) runs
# in the foreground after the TIMED ones, alone: the safe place until it is sorted.
AUDIT = "audit"
# `host` (the host runtime's own tests) and `fleet` (Slurm; real servers inside its jobs, no timing
# judged) were TIMED until 2026-12-07: in QUIET's pytest they leave the foreground's path (~275 s).
QUIET = ("build", "registry", "host", "fleet")
TIMED = ("serve", "proofs")
# WORKFLOWS (verify.yml under act, 8-17 min: docs/fleet.md) judges no timing and needs the first
# prebuilt image: a niced pytest of its own beside the first TIMED group, like QUIET but not in QUIET's
# pytest (one after the other they would outlast it), so it costs CI's wall time only what it outlasts
# that group by; the TIMED groups after it still run alone.
WORKFLOWS = "workflows"
# Images the integration tier's session fixtures build, built while the unit tier runs. The first
# is waited for before any integration group starts (its bootstrapped base is shared and has no
# lock); the fixtures of the others wait on the build's own per-cell lock (pipeline/cache.py).
# cpu-tiny-host is a host environment (this user's cache), the one the ab, bisect and sweep proofs
# share (tests/integration/conftest.py: cpu_tiny_host_env): 206 s to build on a cold cache.
PREBUILD = ("cpu-tiny", "sglang-cpu-tiny", "cpu-tiny-vllm-0.32", "cpu-tiny-host")


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Unit tier always; the integration tier with `-- --run-docker` (real dockerd, real builds)."""
    _install(session)
    docker = "--run-docker" in session.posargs
    rest = [arg for arg in session.posargs if arg != "--run-docker"]
    # The unit tier on every core, a file per worker (a module fixture, like the fuzz suite's one
    # child process for all its cases, runs once). --run-slow: CI runs the unit tests marked slow too
    # (tests/conftest.py). Every pytest writes JUnit XML: the session ends with the slowest tests and
    # each group's time, over all of them.
    unit = ["-n", "auto", "--dist", "loadfile", "--run-slow", "tests/unit"]
    timing = Timing(Path(tempfile.mkdtemp(prefix="stackproof-timing-")))
    if not docker:
        timing.run(session, "unit", ["pytest", "-ra", "--durations=15", *unit, *rest])
        timing.report()
        timing.fail_if_any(session)
        return
    integration = ["tests/integration", "--run-docker", *rest]
    # Every pytest below labels what it builds with a job under this run's id and leaves its images
    # to the run (tests/integration/conftest.py: STACKPROOF_TEST_RUN): `_prebuilt` removes them all
    # once the last group has ended, never while another group may still use a tag.
    run_id = f"nox-{socket.gethostname()}-{os.getpid()}"
    session.env["STACKPROOF_TEST_RUN"] = run_id
    try:
        with (
            _prebuilt(session, PREBUILD, run_id) as first_built,
            _beside(session, [*integration, "-m", AUDIT, *timing.xml(AUDIT)], AUDIT, timing),
        ):
            timing.run(session, "unit", ["pytest", "-ra", "--durations=15", *unit, *rest])
            first_built()
            quiet = " or ".join(QUIET)
            with (
                _beside(session, [*integration, "-m", WORKFLOWS, *timing.xml(WORKFLOWS)], WORKFLOWS, timing),
                _beside(session, [*integration, "-m", quiet, *timing.xml("quiet")], "quiet", timing),
            ):
                timing.run(session, TIMED[0], ["pytest", "-ra", "--durations=30", *integration, "-m", TIMED[0]])
            for group in TIMED[1:]:
                timing.run(session, group, ["pytest", "-ra", "--durations=30", *integration, "-m", group])
            others = " and ".join(f"not {g}" for g in (AUDIT, *QUIET, *TIMED, WORKFLOWS))
            timing.run(session, "others", ["pytest", "-ra", *integration, "-m", others], none_ok=True)
    finally:
        timing.report()  # the log's last lines, also when a group failed
    timing.fail_if_any(session)


class Timing:
    """Each group's wall time, every test's from the JUnit XML each pytest writes, and the groups
    that failed: a failing group no longer stops the session, so it hides none of the groups after it
    (a CI run that failed in `serve` used to say nothing of `proofs`); the session fails at its end."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.walls: dict[str, float] = {}
        self.failed: list[str] = []

    def fail_if_any(self, session: nox.Session) -> None:
        if self.failed:
            session.error(f"failed: {', '.join(self.failed)} (each group's log is above)")

    def xml(self, name: str) -> list[str]:
        return [f"--junitxml={self.folder / name}.xml"]

    def run(self, session: nox.Session, name: str, argv: list[str], *, none_ok: bool = False) -> None:
        started = time.monotonic()
        try:
            # pytest exits 5 when no test was selected: a group with no tests yet is not a failure.
            session.run(*argv, *self.xml(name), success_codes=[0, 5] if none_ok else [0])
        except nox.command.CommandFailed:
            self.failed.append(name)
        finally:
            self.walls[name] = time.monotonic() - started

    def report(self) -> None:
        """The 20 slowest tests of the whole session (setup, call and teardown), then each group's time:
        pytest's own, and the wall time the foreground waited for it."""
        cases, groups = [], []
        for path in sorted(self.folder.glob("*.xml"), key=lambda p: p.stat().st_mtime):
            for suite in ET.parse(path).iter("testsuite"):
                groups.append(f"{path.stem:<10} {float(suite.get('time') or 0):7.0f}s  {suite.get('tests')} tests")
            for case in ET.parse(path).iter("testcase"):
                name = f"{case.get('classname', '')}::{case.get('name', '')}"
                cases.append((float(case.get("time") or 0), path.stem, name))
        lines = ["", "===== the 20 slowest tests (all groups) ====="]
        lines += [f"{seconds:8.1f}s  {group:<8} {name}" for seconds, group, name in sorted(cases, reverse=True)[:20]]
        lines += ["===== each group's time (pytest's own) =====", *groups, "===== waited for in the foreground ====="]
        lines += [f"{name:<16} {seconds:7.0f}s" for name, seconds in self.walls.items()]
        print("\n".join(lines), flush=True)
        shutil.rmtree(self.folder, ignore_errors=True)


@contextmanager
def _prebuilt(session: nox.Session, cells: tuple[str, ...], run_id: str) -> Iterator[Callable[[], None]]:
    """Build `cells` in the background, niced (one after another: they share a bootstrapped base);
    yields a wait for the first. At the end, when every group is done, the images made since are
    removed: those carrying a job label of this run (the prebuild's and each group's) and the bases
    bootstrapped on the way (no job label)."""
    job = f"{run_id}-prebuild"
    tmp = Path(tempfile.mkdtemp(prefix="stackproof-prebuild-"))
    before = _stackproof_images()
    steps = [f"stackproof build {cell} --out {tmp / cell} && touch {tmp / cell}.done" for cell in cells]
    env = {**os.environ, "STACKPROOF_JOB": job, "PATH": f"{session.bin}{os.pathsep}{os.environ.get('PATH', '')}"}
    log = (tmp / "prebuild.log").open("wb")
    session.log(f"building {', '.join(cells)} beside the unit tier (log: {tmp / 'prebuild.log'})")
    background = subprocess.Popen(
        ["nice", "-n", "10", "sh", "-c", " && ".join(steps)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )

    def wait_first() -> None:
        deadline = time.monotonic() + 1800
        while not (tmp / f"{cells[0]}.done").exists():
            if background.poll() is not None or time.monotonic() > deadline:
                print((tmp / "prebuild.log").read_text(errors="replace")[-6000:], flush=True)
                session.error(f"the prebuild of {cells[0]} failed or took over 30 min: its log is above")
            time.sleep(2)

    try:
        yield wait_first
    finally:
        if background.poll() is None:  # only when the session failed early: the tiers wait on these builds
            os.killpg(background.pid, 9)
            background.wait()
        log.close()
        for tag in sorted(_stackproof_images() - before):
            label = _docker("image", "inspect", "--format", '{{index .Config.Labels "io.stackproof.job"}}', tag)
            if _made_by_the_run(label.strip(), run_id):
                _docker("image", "rm", "--force", tag)
        shutil.rmtree(tmp, ignore_errors=True)


def _made_by_the_run(job_label: str, run_id: str) -> bool:
    """An image's job label (`docker image inspect`'s text) is one of this run's jobs, or none (a
    base bootstrapped on the way); an image of another run on the same daemon is that run's."""
    return job_label.startswith(f"{run_id}-") or job_label in ("", "<no value>")


def _docker(*args: str) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=300, check=False)
    return done.stdout


def _stackproof_images() -> set[str]:
    return set(_docker("images", "--format", "{{.Repository}}:{{.Tag}}", "--filter", "reference=stackproof/*").split())


@contextmanager
def _beside(session: nox.Session, args: list[str], name: str, timing: Timing) -> Iterator[None]:
    """Run `pytest ARGS` niced in the background while the block runs; its log is printed after it,
    and its failure fails the session at its end (Timing.failed). An exception in the block stops it at once."""
    # Not session.create_tmp(): it would set TMPDIR for every later command of the session, to a
    # folder the runner user the integration tier runs the tool as cannot write.
    tmp = Path(tempfile.mkdtemp(prefix=f"stackproof-{name}-group-"))
    log_path = tmp / f"{name}.log"
    env = {**os.environ, **{k: v for k, v in session.env.items() if v is not None}}
    env["PATH"] = f"{session.bin}{os.pathsep}{env.get('PATH', '')}"
    argv = ["nice", "-n", "10", f"{session.bin}/pytest", "-ra", "--durations=10", f"--basetemp={tmp / name}", *args]
    session.log(f"{name} group beside the rest: {' '.join(argv[3:])} (log: {log_path})")
    started = time.monotonic()
    with log_path.open("wb") as log:
        background = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        yield
        code = background.wait(timeout=3600)  # an hour: the cold download of every cell's wheels
        timing.walls[f"{name} (beside)"] = time.monotonic() - started
    finally:
        if background.poll() is None:
            os.killpg(background.pid, 9)
            background.wait()
        print(f"\n===== {name} group (ran beside the rest) =====\n" + log_path.read_text(errors="replace"), flush=True)
        shutil.rmtree(tmp, ignore_errors=True)  # the audit group's wheels: 2.5 GB a run, left behind before
    if code != 0:
        timing.failed.append(f"{name} (exit {code})")


@nox.session(python=PYTHON)
def unit(session: nox.Session) -> None:
    """The quick unit tier (under a minute): the tests marked slow are left to `nox -s tests` and CI."""
    _install(session)
    session.run("pytest", "-q", "--durations=10", "-n", "auto", "--dist", "loadfile", "tests/unit", *session.posargs)


@nox.session(python=PYTHON)
def integration(session: nox.Session) -> None:
    """One integration group alone (`nox -s integration -- serve`): build, serve, registry, audit,
    host, proofs, fleet, workflows (INTEGRATION_GROUPS in tests/conftest.py; a name that is none
    selects no test and fails)."""
    if not session.posargs:
        session.error(
            "name a group: nox -s integration -- build|serve|registry|audit|host|proofs|fleet|workflows "
            "[pytest options]"
        )
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
