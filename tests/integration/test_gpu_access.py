"""GPU access by CDI and the archive base, against real daemons (CPU: a FAKE CDI device kind).

dockerd 26 runs with `features.cdi` and a spec for `stackproof.test/gpu` (tests/integration/
fake_cdi.py, the stand-in for nvidia.com/gpu, which no GPU here can back): auto-detection must pick
CDI there, a container given the device must see its env and mount and one without must not. The
20.10 daemon has no CDI and no nvidia runtime: exit 3 naming what to install. The archive base is a
rootfs tarball of this host's sh, imported by sha256; a wrong sha256 is refused before docker sees it."""

from __future__ import annotations

import dataclasses
import hashlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.build.archive import ensure_archive_base
from pipeline.docker.client import Container, Docker, DockerCli
from pipeline.errors import InfraError, InputError
from pipeline.matrix.model import ArchiveBase
from tests.integration.conftest import IMAGES, Daemon
from tests.integration.fake_cdi import FAKE_ENV, FAKE_KIND, FAKE_MOUNT, host_rootfs

FAKE = {"STACKPROOF_CDI_KIND": FAKE_KIND}


@pytest.fixture
def docker_26(docker26: Daemon, monkeypatch: pytest.MonkeyPatch) -> Docker:
    """The pipeline's Docker on dockerd 26 (the CLI reads DOCKER_HOST from this process)."""
    monkeypatch.setenv("DOCKER_HOST", docker26.env["DOCKER_HOST"])
    return Docker(DockerCli(path=docker26.cli, mode="classic-buildkit", version="26"))


@pytest.fixture
def rootfs_base(docker_26: Docker, tmp_path: Path) -> Iterator[tuple[Docker, ArchiveBase]]:
    tarball = host_rootfs(tmp_path / "rootfs.tar")
    sha = hashlib.sha256(tarball.read_bytes()).hexdigest()
    base = ArchiveBase(name="tiny", archive=tarball.name, sha256=sha, format="rootfs", env=(("PATH", "/bin"),))
    yield docker_26, base
    if docker_26.image(base.tag) is not None:
        docker_26.remove_image(base.tag)


def _probe(image: str, gpus: str | None) -> Container:
    script = f'echo "env=${FAKE_ENV}"; cat {FAKE_MOUNT} 2>/dev/null || echo no-card'
    return Container(
        image=image, name=f"sp-cdi-{uuid.uuid4().hex[:8]}", role="probe", command=("/bin/sh", "-c", script),
        network="none", gpus=gpus,
    )  # fmt: skip


def test_auto_detection_picks_cdi_for_the_declared_kind(docker_26: Docker) -> None:
    access = docker_26.gpu_access(env=FAKE)
    assert access.how == "cdi" and access.cdi_kind == FAKE_KIND and "fake-gpu.yaml" in access.source
    with pytest.raises(InfraError, match=r"no spec there declares nvidia\.com/gpu.*nvidia-ctk cdi generate"):
        Docker(docker_26.cli).gpu_access(env={})  # the real kind: no spec for it here


def test_the_20_10_daemon_offers_neither_way(docker: Docker) -> None:
    with pytest.raises(InfraError, match=r"no nvidia runtime .*CDI is off in this daemon"):
        Docker(docker.cli).gpu_access(env={})


def test_an_archive_base_is_imported_by_sha256_and_the_cdi_device_reaches_only_its_container(
    rootfs_base: tuple[Docker, ArchiveBase], tmp_path: Path
) -> None:
    docker, base = rootfs_base
    wrong = ArchiveBase(name="tiny", archive=base.archive, sha256="0" * 64, format="rootfs", line=9)
    with pytest.raises(InputError, match=r"^m.yaml:9: bases.tiny.sha256: .* has sha256 " + base.sha256):
        ensure_archive_base(docker, wrong, directory=tmp_path, matrix_file=Path("m.yaml"))
    assert docker.image(wrong.tag) is None  # refused before anything was loaded
    assert ensure_archive_base(docker, base, directory=tmp_path, matrix_file=Path("m.yaml")) == base.tag
    assert dict(docker.image(base.tag).env)["PATH"] == "/bin"  # type: ignore[union-attr]
    docker.gpu_access(env=FAKE)  # this run's choice, as the runtime makes it once
    probe = _probe(base.tag, "all")
    given = docker.run_to_end(probe, timeout=60)
    assert docker.container_state(probe.name) == ("missing", -1)  # the GPU container is gone after it
    assert given.returncode == 0 and given.stdout.split() == ["env=all", "fake", "gpu", "card"], given.stderr
    one = docker.run_to_end(_probe(base.tag, "device=0"), timeout=60)
    assert one.stdout.split()[0] == "env=0"
    without = docker.run_to_end(_probe(base.tag, None), timeout=60)
    assert without.returncode == 0 and without.stdout.split() == ["env=", "no-card"]
    failing = _probe(base.tag, "all")
    failed = docker.run_to_end(dataclasses.replace(failing, command=("/bin/sh", "-c", "exit 7")), timeout=60)
    assert failed.returncode == 7 and docker.container_state(failing.name) == ("missing", -1)


def test_a_cell_builds_over_a_rootfs_archive_base(docker: Docker, tmp_path: Path) -> None:
    """`stackproof build`'s own path on the 20.10 daemon (BuildKit, --network host): the archive is
    checked and imported, and the cell's Dockerfile makes the /tmp an imported tree lacks."""
    from pipeline.build.image import build_cell
    from pipeline.matrix.read import load_matrix
    from pipeline.matrix.site import SiteSettings

    tarball = host_rootfs(tmp_path / "rootfs.tar")
    sha = hashlib.sha256(tarball.read_bytes()).hexdigest()
    matrix_file = tmp_path / "matrix.yaml"
    matrix_file.write_text(
        "schema_version: 1\nindexes: {pypi: {url: 'https://pypi.org/simple'}}\n"
        f"bases:\n  tiny: {{archive: rootfs.tar, sha256: '{sha}', format: rootfs, python: /bin/sh,\n"
        "         env: {PATH: /bin}}\n"
        "cells:\n  - {id: archive-cell, base: tiny, platform: linux/amd64, arch: none, serve: null}\n"
    )
    matrix = load_matrix(matrix_file, images_dir=IMAGES)
    base = matrix.cell("archive-cell").base
    assert isinstance(base, ArchiveBase)
    result = None
    try:
        result = build_cell(
            docker, matrix, matrix.cell("archive-cell"), SiteSettings(base_archives=tmp_path), IMAGES,
            out_dir=tmp_path / "out",
        )  # fmt: skip
        script = "test -d /tmp && test -k /tmp && echo tmp-ok"  # the sticky bit: chmod 1777
        check = Container(image=result.tag, name=f"sp-arch-{uuid.uuid4().hex[:8]}", role="probe",
                          command=("/bin/sh", "-c", script), network="none")  # fmt: skip
        assert docker.run_to_end(check, timeout=60).stdout.strip() == "tmp-ok"
    finally:
        for tag in (result.tag if result else None, base.tag):
            if tag and docker.image(tag) is not None:
                docker.remove_image(tag)
