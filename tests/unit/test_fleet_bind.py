"""`build --pull-only` with the content tag already on this daemon (pipeline/registry/fleet.py
`bind_local`): the registry's digest of that image is named, the registry's image wins over another
local one, and a tag the registry lacks is pushed first. A stand-in registry (tests/unit/fake_oci.py)
and a stand-in docker; the real ones: tests/integration/test_fleet.py (both Dockers) and the act run."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import httpx
import pytest

from pipeline.docker.client import CLASSIC_STORE, ImageInfo
from pipeline.registry import fleet
from pipeline.registry.oci import OCI_MANIFEST, RegistryClient
from tests.unit.fake_oci import FakeOci

REGISTRY = "127.0.0.1:5000"
CELL = "cpu-tiny"
TAG = "stackproof/cpu-tiny:0123456789abcdef"
REMOTE_TAG = f"{CELL}-0123456789abcdef"


def image_manifest(oci: FakeOci, config: bytes, *tags: str) -> tuple[str, str]:
    """An image manifest whose config is `config`, under `tags`: (manifest digest, config digest)."""
    blob = oci.blob(config)
    body = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": {"mediaType": "x", **blob}, "layers": []}
    return oci.put(body, OCI_MANIFEST, *tags), str(blob["digest"])


@dataclass
class FakeDocker:
    """The classic image store: an image's id is its config digest."""

    oci: FakeOci
    images: dict[str, str] = field(default_factory=dict)  # ref -> image id
    configs: dict[str, bytes] = field(default_factory=dict)  # image id -> its config
    calls: list[str] = field(default_factory=list)
    pushed: list[str] = field(default_factory=list)  # manifest digests pushed

    def image_store(self) -> str:
        return CLASSIC_STORE

    def image(self, ref: str) -> ImageInfo | None:
        found = self.images.get(ref)
        return ImageInfo(id=found, repo_digests=(), labels={}, size=0, env=()) if found else None

    def tag(self, source: str, target: str) -> None:
        self.images[target] = self.images[source]

    def remove_image(self, ref: str) -> None:
        self.images.pop(ref, None)

    def pull(self, ref: str, *, login: object = None) -> None:
        self.calls.append(f"pull {ref}")
        _, body = self.oci.manifests[ref.rpartition("@")[2]]
        self.images[ref] = str(httpx.Response(200, content=body).json()["config"]["digest"])

    def push(self, ref: str, *, login: object = None) -> str:
        self.calls.append(f"push {ref}")
        digest = image_manifest(self.oci, self.configs[self.images[ref]], ref.rpartition(":")[2])[0]
        self.pushed.append(digest)
        return digest


@pytest.fixture
def oci(monkeypatch: pytest.MonkeyPatch) -> FakeOci:
    registry = FakeOci()
    client = functools.partial(RegistryClient, transport=httpx.MockTransport(registry.handler))
    monkeypatch.setattr(fleet, "RegistryClient", client)
    return registry


def bind(docker: FakeDocker) -> fleet.Fetched:
    local = docker.image(TAG)
    assert local is not None
    wanted = fleet.Wanted(registry=REGISTRY, cell_id=CELL, content_tag=TAG, platform="linux/amd64", credentials=None)
    return fleet.bind_local(docker, wanted, local=local)  # type: ignore[arg-type]


def test_a_local_content_tag_is_named_by_the_registry_digest_of_the_same_image(oci: FakeOci) -> None:
    manifest, config = image_manifest(oci, b'{"os": "linux"}', REMOTE_TAG)
    docker = FakeDocker(oci, images={TAG: config})
    bound = bind(docker)
    assert bound.reference == f"127.0.0.1:5000/stackproof@{manifest}" and bound.pulled is False
    assert docker.calls == []  # nothing pulled, nothing pushed


def test_another_local_image_under_the_tag_is_replaced_by_the_registry_one(oci: FakeOci) -> None:
    manifest, config = image_manifest(oci, b'{"os": "linux"}', REMOTE_TAG)
    docker = FakeDocker(oci, images={TAG: "sha256:" + "e" * 64})
    bound = bind(docker)
    assert bound.pulled is True and bound.reference.endswith(f"@{manifest}")
    assert docker.calls == [f"pull 127.0.0.1:5000/stackproof@{manifest}"] and docker.images[TAG] == config


def test_a_local_content_tag_the_registry_lacks_is_pushed_then_named(oci: FakeOci) -> None:
    config = b'{"os": "linux", "built": "here"}'
    image_id = str(FakeOci().blob(config)["digest"])  # the classic store's id: the config digest
    docker = FakeDocker(oci, images={TAG: image_id}, configs={image_id: config})
    assert REMOTE_TAG not in oci.manifests
    bound = bind(docker)
    assert docker.calls == [f"push 127.0.0.1:5000/stackproof:{REMOTE_TAG}"]
    pushed = docker.pushed[-1]
    assert bound.pulled is False and bound.reference == f"127.0.0.1:5000/stackproof@{pushed}"
    assert f"127.0.0.1:5000/stackproof:{REMOTE_TAG}" not in docker.images  # the push tag is removed
