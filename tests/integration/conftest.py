"""Fixtures for the integration tier: a real dockerd, real images built by the pipeline.

Images the session tags are removed at its end (also when tests fail); containers are removed by
the code under test, and every test asserts that none of its containers is left.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from pipeline.engine import Engine
from pipeline.errors import InfraError
from tests.conftest import in_ci

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "images"
MATRIX = REPO / "matrix.yaml"

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Completed:
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> dict[str, object]:
        return json.loads(self.stdout)  # type: ignore[no-any-return]


def stackproof(args: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 1800) -> Completed:
    """Run the real CLI in a subprocess, as a user would; stderr is echoed for the test log."""
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    sys.stderr.write(proc.stderr[-20000:])
    return Completed(proc.returncode, proc.stdout, proc.stderr)


def docker(*args: str, check: bool = True) -> str:
    proc = subprocess.run([engine_cli(), *args], capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} failed: {proc.stderr}")
    return proc.stdout


_ENGINE: Engine | None = None


def engine_cli() -> str:
    assert _ENGINE is not None
    return _ENGINE.cli.path


def containers(label: str) -> list[str]:
    return docker("ps", "--all", "--quiet", "--filter", f"label={label}").split()


def stackproof_images() -> set[str]:
    out = docker("images", "--format", "{{.Repository}}:{{.Tag}}", "--filter", "reference=stackproof/*")
    return set(out.split())


@pytest.fixture(scope="session")
def engine(pytestconfig: pytest.Config) -> Iterator[Engine]:
    """The real daemon; images tagged during the session are removed when it ends."""
    global _ENGINE
    try:
        _ENGINE = Engine.connect()
    except InfraError as exc:
        if in_ci():
            pytest.fail(f"CI must provide a docker daemon: {exc}")
        pytest.skip(f"no docker daemon: {exc}")
    before = stackproof_images()
    yield _ENGINE
    for tag in sorted(stackproof_images() - before):
        docker("image", "rm", "--force", tag, check=False)


@pytest.fixture(scope="session")
def cpu_tiny(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The embedded default's image, built once per session by the pipeline itself."""
    out = tmp_path_factory.mktemp("cpu-tiny-build")
    result = stackproof(["build", "cpu-tiny", "--json", "--out", str(out)])
    assert result.returncode == 0, result.stderr[-3000:]
    return str(result.json()["tag"])


def write_matrix(
    path: Path, edit: dict[str, dict[str, object]] | None = None, extra_cells: list[dict[str, object]] | None = None
) -> Path:
    """A copy of the real matrix at `path`: lock paths made absolute, cells edited or added."""
    data = yaml.safe_load(MATRIX.read_text())
    for cell in data["cells"]:
        install = cell.get("install")
        if install:
            install["lock"] = str(REPO / install["lock"])
        cell.update((edit or {}).get(cell["id"], {}))
    data["cells"].extend(extra_cells or [])
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[str]:
    """A real OCI registry (Debian's docker-registry) on 127.0.0.1, stopped and its storage removed after."""
    binary = shutil.which("docker-registry")
    if binary is None:
        if in_ci():
            pytest.fail("CI must provide docker-registry (.ci/setup installs it)")
        pytest.skip("docker-registry is not installed (apt-get install docker-registry)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    storage = tmp_path / "registry-storage"
    config = tmp_path / "registry.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "version": 0.1,
                "log": {"level": "warn"},
                "storage": {"filesystem": {"rootdirectory": str(storage)}, "delete": {"enabled": True}},
                "http": {"addr": f"127.0.0.1:{port}"},
            }
        )
    )
    log = (tmp_path / "registry.log").open("w")
    proc = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"docker-registry exited: {(tmp_path / 'registry.log').read_text()[-2000:]}")
            try:
                if httpx.get(f"http://{address}/v2/", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError("docker-registry did not answer within 30 s")
            time.sleep(0.2)
        yield address
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        # What docker keeps of images pulled from this registry: pulls by digest leave `REPO@sha256:...`.
        listed = docker("images", "--digests", "--format", "{{.Repository}} {{.Tag}} {{.Digest}}", check=False)
        for repository, tag, digest in (line.split() for line in listed.splitlines() if line.count(" ") == 2):
            if repository.startswith(address):
                docker("rmi", f"{repository}@{digest}" if tag == "<none>" else f"{repository}:{tag}", check=False)


@pytest.fixture(scope="session")
def tiny_images(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """Two distinct, tiny images (one file each), removed at the end of the session."""
    tags = []
    for name in ("a", "b"):
        root = tmp_path_factory.mktemp(f"tiny-{name}")
        (root / "hello.txt").write_text(f"stackproof test image {name}\n")
        tarball = root.parent / f"tiny-{name}.tar"
        with tarfile.open(tarball, "w") as tar:
            tar.add(root / "hello.txt", arcname="hello.txt")
        tag = f"stackproof-test/tiny:{name}-{os.getpid()}"
        docker("import", "--change", 'CMD ["/hello.txt"]', str(tarball), tag)
        tags.append(tag)
    yield tags[0], tags[1]
    for tag in tags:
        docker("rmi", "--force", tag, check=False)
