"""Fixtures for the integration tier: a real dockerd, real images built by the pipeline.

Images the session tags are removed at its end (also when tests fail), or, under `nox -s tests`, at
the end of the run once its last group is done (STACKPROOF_TEST_RUN, below); containers are removed
by the code under test, and every test asserts that none of its containers is left.
"""

from __future__ import annotations

import dataclasses
import grp
import json
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from pipeline.docker.client import Docker
from pipeline.errors import InfraError
from pipeline.matrix.compilecache import ENV_NAME as COMPILE_CACHE_ENV
from pipeline.matrix.model import Cell
from pipeline.matrix.read import load_matrix
from tests.conftest import in_ci

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "images"
MATRIX = REPO / "matrix.yaml"

pytestmark = pytest.mark.integration

# Every container the tool creates for this session carries io.stackproof.job=JOB (STACKPROOF_JOB):
# assertions about containers are about this session's own, so a concurrent run by anyone else on
# the same daemon (another engineer, another CI job) cannot break them.
#
# STACKPROOF_TEST_RUN is set by `nox -s tests` (noxfile.py: the run's id) when several pytest
# sessions share the daemon at once. Their builds of one cell give one content tag, which the last
# build moves onto its own image (its job label); a session that removed "its" images on leaving
# would take that tag, and any tag put on that image, from under a session still running (CI,
# 2026-12-07: the model-store test's variant tag vanished between two docker runs). The run removes
# them all once every session is done.
TEST_RUN = os.environ.get("STACKPROOF_TEST_RUN", "")
JOB = f"{TEST_RUN}-pytest-{os.getpid()}" if TEST_RUN else f"pytest-{socket.gethostname()}-{os.getpid()}"
JOB_LABEL = f"io.stackproof.job={JOB}"


@dataclass(frozen=True)
class Completed:
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> dict[str, object]:
        return json.loads(self.stdout)  # type: ignore[no-any-return]


# GitHub's self-hosted runner runs jobs as an ordinary user in the docker group; .ci/setup makes one.
RUNNER_USER = os.environ.get("STACKPROOF_TEST_RUNNER_USER", "stackproof-runner")
RUNNER_PYTHON = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"


def python_as(user: str | None, args: Sequence[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """argv and environment that run `python ARGS` as `user` (root only; None: this process's user)
    through `runuser`, with `env` but that user's HOME (so its own cache directory), as a CI runner would."""
    if user is None:
        return [sys.executable, *args], env
    home = pwd.getpwnam(user).pw_dir
    env = {**env, "HOME": home, "USER": user, "LOGNAME": user}
    env.pop("XDG_CACHE_HOME", None)
    # This interpreter may live under root's home (pyenv), out of the user's reach: run the system
    # python3 of the same minor version on this environment's packages instead.
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), sysconfig.get_paths()["purelib"]])
    return ["runuser", "-u", user, "--", RUNNER_PYTHON, *args], env


def stackproof(
    args: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 1800, user: str | None = None
) -> Completed:
    """Run the real CLI in a subprocess, as a user would (as `user`: see `python_as`); stderr is
    echoed for the test log."""
    argv, full_env = python_as(user, ["-m", "pipeline", *args], {**os.environ, "STACKPROOF_JOB": JOB, **(env or {})})
    proc = subprocess.run(argv, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout)
    sys.stderr.write(proc.stderr[-20000:])
    return Completed(proc.returncode, proc.stdout, proc.stderr)


def docker_cmd(*args: str, check: bool = True) -> str:
    proc = subprocess.run([engine_cli(), *args], capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} failed: {proc.stderr}")
    return proc.stdout


_ENGINE: Docker | None = None


def engine_cli() -> str:
    assert _ENGINE is not None
    return _ENGINE.cli.path


def containers(label: str, *, job: str = JOB) -> list[str]:
    """This session's containers (of `job`) carrying `label`."""
    return docker_cmd(
        "ps", "--all", "--quiet", "--filter", f"label={label}", "--filter", f"label=io.stackproof.job={job}"
    ).split()


def created_since(since: float, label: str, *, job: str = JOB) -> list[str]:
    """Names of this session's containers carrying `label` created since `since`, from the daemon's
    event log (`Docker.created_since`, narrowed to this session's job)."""
    out = docker_cmd(
        "events", "--since", f"{since:.0f}", "--until", f"{time.time() + 1:.0f}",
        "--filter", "type=container", "--filter", "event=create",
        "--filter", f"label={label}", "--filter", f"label=io.stackproof.job={job}",
        "--format", "{{.Actor.Attributes.name}}",
    )  # fmt: skip
    return out.split()


def stackproof_images() -> set[str]:
    out = docker_cmd("images", "--format", "{{.Repository}}:{{.Tag}}", "--filter", "reference=stackproof/*")
    return set(out.split())


@pytest.fixture(scope="session")
def docker(pytestconfig: pytest.Config) -> Iterator[Docker]:
    """The real daemon; images tagged during the session are removed when it ends."""
    global _ENGINE
    try:
        _ENGINE = Docker.connect()
    except InfraError as exc:
        if in_ci():
            pytest.fail(f"CI must provide a docker daemon: {exc}")
        pytest.skip(f"no docker daemon: {exc}")
    before = set() if TEST_RUN else stackproof_images()  # under a run, the run removes them
    # The tool, run inside this process too (the load and stall tests call the stages directly),
    # labels its containers with this session's job, so "no container left" is about them.
    previous_job = os.environ.get("STACKPROOF_JOB")
    os.environ["STACKPROOF_JOB"] = JOB
    try:
        yield _ENGINE
    finally:
        if previous_job is None:
            os.environ.pop("STACKPROOF_JOB", None)
        else:
            os.environ["STACKPROOF_JOB"] = previous_job
    if TEST_RUN:
        return  # the run that set STACKPROOF_TEST_RUN removes them when its last session ends
    for tag in sorted(stackproof_images() - before):
        # Only what this session built (its job label), or what carries no job at all (bootstrap
        # bases): an image a concurrent session built while this one ran is that session's.
        job = docker_cmd(
            "image", "inspect", "--format", '{{index .Config.Labels "io.stackproof.job"}}', tag, check=False
        )
        if job.strip() in (JOB, "", "<no value>"):
            docker_cmd("image", "rm", "--force", tag, check=False)


@pytest.fixture(scope="session")
def runner_user() -> str | None:
    """The ordinary user (in the docker group) tests run the tool as: None when this process is
    already not root. As root outside CI without that user, the test is skipped; in CI it fails."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(RUNNER_USER)
    except KeyError:
        message = f"no user {RUNNER_USER!r} to run as (.ci/setup creates it; STACKPROOF_TEST_RUNNER_USER names another)"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    if grp.getgrnam("docker").gr_gid not in os.getgrouplist(RUNNER_USER, entry.pw_gid):
        pytest.fail(f"user {RUNNER_USER!r} is not in the docker group")
    return RUNNER_USER


def runner_dir(user: str | None, prefix: str) -> Path:
    """A fresh directory the runner user owns (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix=f"stackproof-{prefix}-"))
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(path, entry.pw_uid, entry.pw_gid)
    return path


def built_by_the_pipeline(cell: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """`stackproof build CELL` as a user runs it; the image's tag."""
    out = tmp_path_factory.mktemp(f"{cell}-build")
    result = stackproof(["build", cell, "--json", "--out", str(out)])
    assert result.returncode == 0, result.stderr[-3000:]
    return str(result.json()["tag"])


@pytest.fixture(scope="session")
def cpu_tiny(docker: Docker, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The embedded default's image, built once per session by the pipeline itself."""
    return built_by_the_pipeline("cpu-tiny", tmp_path_factory)


@pytest.fixture(scope="session")
def sglang_cpu_tiny(docker: Docker, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The SGLang 0.5.18 CPU cell's image (kernel package stood in), built once per session by the pipeline."""
    return built_by_the_pipeline("sglang-cpu-tiny", tmp_path_factory)


@pytest.fixture(scope="session")
def cpu_tiny_host_env() -> str:
    """cpu-tiny-host's host environment, as `stackproof build` makes it for this process's user, once
    per session for the proofs that load it (ab, bisect, sweep); nox prebuilds it beside the unit
    tier (noxfile.py PREBUILD), so here it is usually found. Its root directory."""
    done = stackproof(["build", "cpu-tiny-host", "--json"], timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    return str(done.json()["root"])


# -- servers without torch.compile -------------------------------------------------------------------

# Most of the tier's vLLM servers carry a test that judges nothing of torch.compile (correctness, engine
# faults, the serving contract, stalls, the model store, secrets): they start with `--enforce-eager`, with
# which vLLM skips torch.compile (0.28.0 vllm/config/vllm.py:1284, "Enforce eager set, disabling
# torch.compile and CUDAGraphs"). cpu-tiny on an idle two-core box (2026-12-07): ready in 27 s eager
# against 44 s with a warm compile cache and 72 s cold; on vLLM 0.28.0 CPU the warm cache is never reused
# ("'function' object has no attribute 'finalize_loading'", compilation/decorators.py:309-321), so a warm
# start still compiles. Only these cells' args change: the content tag (the image) stays the same.
# The tests that judge the compiled path use the real matrix: test_run's cpu-tiny end to end and the 0.32
# cell's run (both cold), test_compile_cache, the soak's default-against-eager arms, test_host_runtime.
EAGER_CELLS = ("cpu-tiny", "cpu-tiny-vllm-0.32", "cpu-tiny-host")
EAGER = "--enforce-eager"


def serving_cell(cell_id: str) -> Cell:
    """`cell_id` of the real matrix as the tier's in-process servers start it (EAGER_CELLS eager)."""
    cell = load_matrix(MATRIX, images_dir=IMAGES).cell(cell_id)
    if cell_id not in EAGER_CELLS or cell.serve is None:
        return cell
    return dataclasses.replace(cell, serve=dataclasses.replace(cell.serve, args=(*cell.serve.args, EAGER)))


def write_matrix(
    path: Path,
    edit: dict[str, dict[str, object]] | None = None,
    extra_cells: list[dict[str, object]] | None = None,
    extra_bases: dict[str, dict[str, object]] | None = None,
    *,
    eager: bool = False,
) -> Path:
    """A copy of the real matrix at `path`: lock paths made absolute, cells edited or added; with
    `eager`, EAGER_CELLS serve with `--enforce-eager` (the edits apply after, the added cells as given)."""
    data = yaml.safe_load(MATRIX.read_text())
    data["bases"].update(extra_bases or {})
    for cell in data["cells"]:
        install = cell.get("install")
        if install:
            install["lock"] = str(REPO / install["lock"])
        if eager and cell["id"] in EAGER_CELLS and "serve" in cell:
            cell["serve"]["args"] = [*cell["serve"]["args"], EAGER]
        cell.update((edit or {}).get(cell["id"], {}))
    data["cells"].extend(extra_cells or [])
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# -- both Dockers ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Daemon:
    """One docker daemon the publish/pull tier runs against: Debian 12's 20.10 (classic image store)
    on the default socket, or Debian 13's 26 with the containerd image store on its own."""

    name: str
    cli: str
    env: dict[str, str]  # what a process needs to reach this daemon with this CLI
    store: str  # "classic" or "containerd"
    plugins: str | None = None  # the CLI plugin directory (buildx) a DOCKER_CONFIG must name

    def docker(self, *args: str, check: bool = True, env: dict[str, str] | None = None) -> str:
        full = {**os.environ, **self.env, **(env or {})}
        proc = subprocess.run([self.cli, *args], capture_output=True, text=True, timeout=300, env=full)
        if check and proc.returncode != 0:
            raise AssertionError(f"docker ({self.name}) {' '.join(args)} failed: {proc.stderr}")
        return proc.stdout

    def image_id(self, ref: str) -> str | None:
        out = self.docker("image", "inspect", "--format", "{{.Id}}", ref, check=False).strip()
        return out or None

    def stackproof(
        self, args: Sequence[str], *, env: dict[str, str] | None = None, input_text: str | None = None
    ) -> Completed:
        argv = [sys.executable, "-m", "pipeline", *args]
        full = {**os.environ, **self.env, **(env or {})}
        proc = subprocess.run(
            argv, cwd=REPO, env=full, capture_output=True, text=True, timeout=900, input=input_text or ""
        )
        sys.stderr.write(proc.stderr[-20000:])
        return Completed(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture(scope="session")
def docker26(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """dockerd 26 (containerd image store) from .ci/setup's prefix, started once and stopped by its pid."""
    from tests.integration.registries import DOCKER26_PREFIX, Docker26

    if not (DOCKER26_PREFIX / "usr" / "sbin" / "dockerd").exists():
        message = f"no Docker 26 under {DOCKER26_PREFIX} (.ci/setup installs it; STACKPROOF_DOCKER26 names another)"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    # A short path: the daemon's unix socket lives in it (108 bytes at most).
    state = Path(tempfile.mkdtemp(prefix="sp-d26-"))
    daemon = Docker26(state=state)
    started = time.monotonic()
    daemon.start()
    print(f"dockerd 26 started in {time.monotonic() - started:.1f}s", file=sys.stderr)
    try:
        yield Daemon(name="docker-26", cli=daemon.cli, env=daemon.env(), store="containerd", plugins=daemon.plugins)
    finally:
        daemon.stop()
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="session", params=["docker-20.10", "docker-26"])
def daemon(request: pytest.FixtureRequest, docker: Docker) -> Daemon:
    if request.param == "docker-26":
        found: Daemon = request.getfixturevalue("docker26")
        return found
    return Daemon(name="docker-20.10", cli=docker.cli.path, env={}, store=docker.image_store())


@pytest.fixture
def docker_config(tmp_path: Path, daemon: Daemon) -> Path:
    """A fresh DOCKER_CONFIG directory for one test (no login of this machine's leaks in)."""
    path = tmp_path / "docker-config"
    path.mkdir()
    config: dict[str, object] = {"cliPluginsExtraDirs": [daemon.plugins]} if daemon.plugins else {}
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture
def canary() -> str:
    """A registry password that no output, stored blob or written file may contain."""
    return f"CANARY-{secrets.token_hex(8)}"


# -- the compile cache ------------------------------------------------------------------------------

# Every server start of the session uses one compile/JIT cache (pipeline/matrix/compilecache.py): the first
# start of each image fills that image's slot, every later one is warm (a vLLM CPU start spends about
# 43 of its 47 s compiling). A test that judges a cold start says so: it passes `env=COLD` to the tool
# (or starts its in-process servers with `compile_cache=None`), and asserts the receipt says unused.
COLD = {COMPILE_CACHE_ENV: "none"}


@pytest.fixture(scope="session", autouse=True)
def session_compile_cache() -> Iterator[Path | None]:
    """The session's cache, in STACKPROOF_COMPILE_CACHE for the tool and the in-process stages. A
    cache already set in the environment is used as it is (a developer's warm one across sessions);
    `none` there turns it off. Made here, it is removed at the end."""
    given = os.environ.get(COMPILE_CACHE_ENV)
    if given is not None:
        yield Path(given) if given.strip().lower() not in ("", "none", "off", "0") else None
        return
    root = Path(tempfile.mkdtemp(prefix="stackproof-compile-cache-"))
    root.chmod(0o1777)  # the runner user's runs make their own image slots in it (as in /tmp)
    os.environ[COMPILE_CACHE_ENV] = str(root)
    try:
        yield root
    finally:
        os.environ.pop(COMPILE_CACHE_ENV, None)
        shutil.rmtree(root, ignore_errors=True)
