"""A fleet of runners sharing a registry (issue 15 item 5), on a real registry and both Dockers.

`build --push` on one runner, then `build` on another (here: the same daemon after the local
content tag is removed) pulls the pushed manifest by digest instead of building; `--force`
builds anyway; `--pull-only` (a GPU runner) refuses to build when the registry lacks the tag. On
Docker 26 (buildx, containerd image store) the build keeps its layer cache in the registry.

The cell is a small one on the tier's bootstrapped Debian base (the base of cpu-tiny): its build
adds no package, so each build is seconds; Docker 26 gets that base by `docker save | docker load`
from 20.10 instead of a second debootstrap.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.build.bootstrap import ensure_base
from pipeline.build.plan import plan_cell
from pipeline.docker.client import Docker
from pipeline.matrix.model import BootstrapBase
from pipeline.matrix.read import load_matrix
from pipeline.matrix.site import load_site
from pipeline.registry.layout import CACHE_REPOSITORY
from pipeline.registry.oci import OCI_INDEX, OCI_MANIFEST, RegistryClient, platform_manifest
from tests.integration.conftest import IMAGES, REPO, Daemon, write_matrix
from tests.integration.registries import Registry, start_registry

pytestmark = pytest.mark.integration

CELL = "fleet-tiny"
BASE = "debian-bookworm"


@pytest.fixture(scope="module")
def base_tag(docker: Docker, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tier's bootstrapped base (cpu-tiny's) on Docker 20.10, made by the pipeline if not there yet."""
    matrix = load_matrix(REPO / "matrix.yaml", images_dir=IMAGES)
    base = next(b for b in matrix.bases if getattr(b, "name", None) == BASE)
    assert isinstance(base, BootstrapBase)
    return ensure_base(docker, base, load_site(matrix), IMAGES)[0]


@pytest.fixture
def bench(daemon: Daemon, base_tag: str, tmp_path: Path, docker_config: Path) -> Iterator[Fleet]:
    if daemon.image_id(base_tag) is None:  # Docker 26: the same base, copied rather than bootstrapped again
        save = subprocess.Popen(["docker", "save", base_tag], stdout=subprocess.PIPE)
        env = {**os.environ, **daemon.env}
        subprocess.run([daemon.cli, "load", "--quiet"], stdin=save.stdout, env=env, check=True, timeout=300)
        assert save.wait(timeout=300) == 0
    (tmp_path / "registry").mkdir()
    with start_registry("anonymous", tmp_path / "registry", password="") as registry:
        fleet = Fleet(daemon, registry, tmp_path, docker_config)
        try:
            yield fleet
        finally:
            fleet.cleanup()


class Fleet:
    def __init__(self, daemon: Daemon, registry: Registry, tmp: Path, config: Path) -> None:
        self.daemon, self.registry, self.tmp, self.config = daemon, registry, tmp, config
        self.tags: list[str] = []

    def matrix(self, name: str) -> tuple[Path, str]:
        """A matrix with the fleet cell (its content tag made unique by `name`), and that content tag."""
        cell = {
            "id": CELL,
            "base": BASE,
            "arch": "none",
            "runner": ["self-hosted"],
            "env": {"STACKPROOF_TEST_FLEET": f"{name}-{secrets.token_hex(6)}"},
            # One RUN step (about a second), so the build has a layer for buildx to cache.
            "uninstall": ["stackproof-fleet-test-absent"],
            "serve": {"model": {"source": "path:/hello.txt"}},
        }
        path = write_matrix(self.tmp / f"matrix-{name}.yaml", extra_cells=[cell])
        matrix = load_matrix(path, images_dir=IMAGES)
        tag = plan_cell(matrix, matrix.cell(CELL), load_site(matrix), IMAGES).tag
        self.tags.append(tag)
        return path, tag

    def build(self, matrix: Path, *extra: str, registry: bool = True):  # type: ignore[no-untyped-def]
        env = {"DOCKER_CONFIG": str(self.config)}
        if registry:
            env["STACKPROOF_REGISTRY"] = self.registry.address
        # -v: the build's own lines on stderr are what proves a build ran (or did not)
        args = ["build", CELL, "-v", "--matrix", str(matrix), "--images", str(IMAGES), "--out", str(self.tmp / "out")]
        return self.daemon.stackproof([*args, "--json", *extra], env=env)

    def client(self) -> RegistryClient:
        return RegistryClient(self.registry.address)

    def cleanup(self) -> None:
        for tag in self.tags:
            self.daemon.docker("rmi", "--force", tag, check=False)
        listed = self.daemon.docker("images", "--digests", "--format", "{{.Repository}}@{{.Digest}}", check=False)
        for ref in listed.split():
            if ref.startswith(self.registry.address):
                self.daemon.docker("rmi", "--force", ref, check=False)


def test_second_build_pulls_the_pushed_content_tag_instead_of_building(bench: Fleet) -> None:
    matrix, tag = bench.matrix("pull")
    started = time.monotonic()
    first = bench.build(matrix, "--push")
    first_s = time.monotonic() - started
    assert first.returncode == 0, first.stderr[-3000:]
    built = first.json()
    assert built["source"] == "built"
    assert f"{tag} is not in {bench.registry.address}: building it here" in first.stderr
    assert f"[build {CELL}]" in first.stderr  # the build's own log lines: it did build
    pushed = str(built["registry_ref"])
    repo, _, digest = pushed.partition("@")
    assert repo == f"{bench.registry.address}/stackproof" and digest.startswith("sha256:")
    with bench.client() as client:
        top = client.manifest("stackproof", digest)
        assert top is not None
        assert client.manifest("stackproof", f"{CELL}-{tag.rsplit(':', 1)[1]}") is not None
        if top.is_index:  # buildx pushes an index (image + provenance): a runner pulls the platform's image
            entry = platform_manifest(top.json, "linux/amd64")
            assert entry is not None
            manifest = client.manifest("stackproof", entry["digest"])
        else:
            manifest = top
        assert manifest is not None and not manifest.is_index

    if bench.daemon.store == "containerd":  # buildx exported the layer cache beside the image
        assert f"layer cache {bench.registry.address}/{CACHE_REPOSITORY}:{CELL}" in first.stderr
        with bench.client() as client:
            cache = client.manifest(CACHE_REPOSITORY, CELL, accept=(OCI_INDEX, OCI_MANIFEST))
            assert cache is not None, "no cache manifest in the registry after a buildx build"
            print(f"cache manifest {cache.media_type} {cache.digest}")
    else:
        assert "no registry layer cache" in first.stderr  # said, not silently skipped

    bench.daemon.docker("rmi", tag)  # another runner: the content tag is not on its daemon
    assert bench.daemon.image_id(tag) is None
    started = time.monotonic()
    second = bench.build(matrix)
    second_s = time.monotonic() - started
    assert second.returncode == 0, second.stderr[-3000:]
    pulled = second.json()
    print(f"{bench.daemon.name}: build+push {first_s:.1f}s, pull instead of build {second_s:.1f}s")
    assert pulled["source"] == "registry" and pulled["skipped"] is True and pulled["log"] is None
    assert pulled["registry_ref"] == f"{repo}@{manifest.digest}"
    assert f"is in the registry: pulling {repo}@{manifest.digest} instead of building" in second.stderr
    assert f"[build {CELL}]" not in second.stderr and "building" not in second.stderr.replace("instead of building", "")
    # The image is the pushed manifest: its id is that digest (containerd) or that manifest's config.
    expected = manifest.digest if bench.daemon.store == "containerd" else manifest.config_digest
    assert pulled["image_id"] == expected == bench.daemon.image_id(tag)

    forced = bench.build(matrix, "--force")  # a forced build builds although the registry has it
    assert forced.returncode == 0, forced.stderr[-3000:]
    assert forced.json()["source"] == "built" and f"[build {CELL}]" in forced.stderr
    assert "instead of building" not in forced.stderr
    if bench.daemon.store == "containerd":  # and it read the registry cache the first build wrote
        assert "inferred cache manifest type" in forced.stderr


def test_pull_only_refuses_to_build_a_tag_the_registry_lacks(bench: Fleet) -> None:
    matrix, tag = bench.matrix("absent")
    result = bench.build(matrix, "--pull-only")
    assert result.returncode == 3, result.stderr[-2000:]
    assert f"{tag} is neither on this daemon nor in {bench.registry.address}" in result.stderr
    assert f"stackproof build {CELL} --push" in result.stderr
    assert f"[build {CELL}]" not in result.stderr and bench.daemon.image_id(tag) is None
    assert "Traceback" not in result.stderr
    json.dumps(result.stdout)  # nothing else printed on stdout but what --json would


def platform_digest(bench: Fleet, tag: str) -> tuple[str, str]:
    """The linux/amd64 manifest the registry holds under `tag`, and that manifest's config digest."""
    with bench.client() as client:
        top = client.manifest("stackproof", tag)
        assert top is not None, f"{tag} is not in the registry"
        if top.is_index:
            entry = platform_manifest(top.json, "linux/amd64")
            assert entry is not None
            top = client.manifest("stackproof", entry["digest"])
        assert top is not None and not top.is_index
        return top.digest, str(top.config_digest)


def test_pull_only_names_the_registry_digest_of_a_content_tag_already_here(bench: Fleet, base_tag: str) -> None:
    """A GPU runner whose daemon already has the content tag (it verified the cell before; on one host,
    the build runner's own image): `--pull-only` still gives the registry's digest of that image, which
    the workflow's receipt, signature and publish name. Before the fix: `source: local`,
    `registry_ref: null` (the act run of verify.yml found it: tests/integration/test_workflows_act.py)."""
    matrix, tag = bench.matrix("bound")
    pushed = bench.build(matrix, "--push")
    assert pushed.returncode == 0, pushed.stderr[-3000:]
    content = f"{CELL}-{tag.rsplit(':', 1)[1]}"
    manifest, config = platform_digest(bench, content)
    expected = manifest if bench.daemon.store == "containerd" else config
    repo = f"{bench.registry.address}/stackproof"

    again = bench.build(matrix, "--pull-only")  # the tag is here: nothing to pull, a digest to name
    assert again.returncode == 0, again.stderr[-3000:]
    bound = again.json()
    assert f"{tag} exists, build skipped" in again.stderr and f"[build {CELL}]" not in again.stderr
    assert bound["registry_ref"] == f"{repo}@{manifest}", bound
    assert bound["image_id"] == expected == bench.daemon.image_id(tag)
    if bench.daemon.store == "classic":  # the local image is that manifest's image: nothing pulled
        assert bound["source"] == "local" and "[pull]" not in again.stderr

    # Another image under the content tag here (a runner's stale or tampered image): the registry's wins.
    bench.daemon.docker("tag", base_tag, tag)
    assert bench.daemon.image_id(tag) != expected
    over = bench.build(matrix, "--pull-only")
    assert over.returncode == 0, over.stderr[-3000:]
    assert f"is not the registry's image under its tag ({expected}): pulling {repo}@{manifest} over it" in over.stderr
    assert over.json()["source"] == "registry" and over.json()["registry_ref"] == f"{repo}@{manifest}"
    assert bench.daemon.image_id(tag) == expected and f"[build {CELL}]" not in over.stderr


def test_pull_only_pushes_a_content_tag_only_this_daemon_has(bench: Fleet) -> None:
    """The content tag is here but the registry lacks it (a registry emptied since): `--pull-only` pushes
    it, so the receipt still names the registry's digest; it does not build."""
    matrix, tag = bench.matrix("unpushed")
    built = bench.build(matrix)  # built here, never pushed
    assert built.returncode == 0 and built.json()["source"] == "built", built.stderr[-3000:]
    content = f"{CELL}-{tag.rsplit(':', 1)[1]}"
    with bench.client() as client:
        assert client.manifest("stackproof", content) is None
    bound = bench.build(matrix, "--pull-only")
    assert bound.returncode == 0, bound.stderr[-3000:]
    assert f"{tag} is on this daemon but not in {bench.registry.address}: pushing it" in bound.stderr
    assert f"[build {CELL}]" not in bound.stderr
    manifest, config = platform_digest(bench, content)
    assert bound.json()["registry_ref"] == f"{bench.registry.address}/stackproof@{manifest}"
    assert bench.daemon.image_id(tag) == (manifest if bench.daemon.store == "containerd" else config)
