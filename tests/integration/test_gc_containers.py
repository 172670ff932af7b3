"""`stackproof gc` with real containers (issue 27): a container whose owner process is gone is
removed; a live owner's, another host's and an unlabelled one are left alone.

The containers run `sleep 300` from a tiny image made here (the host's own /bin/sleep and the
libraries it links, imported with `docker import`), so no hub is needed; the image and every
container are removed at the end, also when the test fails.
"""

from __future__ import annotations

import secrets
import socket
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.docker.client import Docker
from pipeline.docker.gc import OWNER_HOST_LABEL, OWNER_PID_LABEL, OWNER_START_LABEL, owner_start_time
from tests.integration.conftest import JOB_LABEL, docker_cmd, stackproof

pytestmark = pytest.mark.integration


def _linked(binary: str) -> list[str]:
    """`binary` and the shared objects it loads (ldd), so it runs in an otherwise empty image."""
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, timeout=30, check=True).stdout
    libs = [part for line in out.splitlines() for part in line.split() if part.startswith("/")]
    return [binary, *libs]


@pytest.fixture
def sleep_image(docker: Docker, tmp_path: Path) -> Iterator[str]:
    tag = f"stackproof/gc-test:{secrets.token_hex(4)}"
    archive = tmp_path / "sleep.tar"
    with tarfile.open(archive, "w") as tar:
        for path in _linked("/bin/sleep"):
            tar.add(Path(path).resolve(), arcname=path.lstrip("/"))
    docker_cmd("import", "--change", f"LABEL {JOB_LABEL}", str(archive), tag)
    try:
        yield tag
    finally:
        docker_cmd("image", "rm", "--force", tag, check=False)


def _start(image: str, name: str, labels: dict[str, str]) -> str:
    flags = [arg for key, value in labels.items() for arg in ("--label", f"{key}={value}")]
    return docker_cmd(
        "run", "--detach", "--name", name, "--label", JOB_LABEL, *flags, "--network", "none", image, "/bin/sleep", "300"
    ).strip()


def _present(names: list[str]) -> set[str]:
    listed = docker_cmd("ps", "--all", "--format", "{{.Names}}").split()
    return set(names) & set(listed)


def test_gc_removes_a_dead_owners_container_and_leaves_the_rest(sleep_image: str) -> None:
    host = socket.gethostname()
    dead = subprocess.Popen(["sleep", "0"])
    dead_start = owner_start_time(dead.pid) or "1"
    dead.wait(timeout=10)
    live = subprocess.Popen(["sleep", "300"])
    suffix = secrets.token_hex(3)
    names = {kind: f"sp-gc-{kind}-{suffix}" for kind in ("dead", "live", "elsewhere", "unlabelled")}
    try:
        live_start = owner_start_time(live.pid)
        assert live_start is not None
        owner = {OWNER_HOST_LABEL: host, OWNER_PID_LABEL: str(dead.pid), OWNER_START_LABEL: dead_start}
        _start(sleep_image, names["dead"], owner)
        _start(sleep_image, names["live"], {**owner, OWNER_PID_LABEL: str(live.pid), OWNER_START_LABEL: live_start})
        _start(sleep_image, names["elsewhere"], {**owner, OWNER_HOST_LABEL: f"not-{host}"})
        _start(sleep_image, names["unlabelled"], {})
        assert _present(list(names.values())) == set(names.values())

        result = stackproof(["gc", "--json"], timeout=120)
        assert result.returncode == 0, result.stderr[-2000:]
        assert names["dead"] in result.json()["removed"]
        assert _present(list(names.values())) == {names["live"], names["elsewhere"], names["unlabelled"]}

        live.kill()  # the other way: once the live owner is gone, its container goes too
        live.wait(timeout=10)
        again = stackproof(["gc", "--json"], timeout=120)
        assert again.returncode == 0, again.stderr[-2000:]
        assert names["live"] in again.json()["removed"]
        assert _present(list(names.values())) == {names["elsewhere"], names["unlabelled"]}
    finally:
        live.kill()
        live.wait(timeout=10)
        for name in names.values():
            docker_cmd("rm", "--force", name, check=False)
