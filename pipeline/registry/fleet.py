"""A fleet of runners sharing one registry: pull a cell's image by its content tag instead of building it,
push what was built, and keep buildx's layer cache beside it.

A cell's content tag names every input of its build (pipeline.build.plan), so an image pushed under it
by one runner is the image any other runner would build. `build` asks the site's registry
(`STACKPROOF_REGISTRY`) for `HOST/REPO:CELL-<content digest>` before building; when it is there,
it resolves it to the cell's platform, pulls that manifest by digest and checks the pulled image is
that manifest (its id is the manifest digest on the containerd image store, the manifest's config
digest on the classic store), as `pull` does. GPU runners then never build: verify.yml builds and
pushes on a CPU runner and verifies on the GPU runners from the registry.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from pipeline.docker.client import CONTAINERD_STORE, Docker, ImageInfo
from pipeline.errors import CheckFailed
from pipeline.registry.layout import cache_ref, content_ref, docker_login, repository, resolve_platform
from pipeline.registry.oci import Credentials, RegistryClient, find_credentials

__all__ = [
    "Fetched",
    "Found",
    "Wanted",
    "bind_local",
    "cache_ref",
    "fetch_built",
    "find_built",
    "push_built",
    "registry_credentials",
]


@dataclass(frozen=True, kw_only=True)
class Fetched:
    """An image taken from the registry instead of being built."""

    reference: str  # HOST/REPO@sha256:... pulled (the platform manifest)
    content_ref: str  # HOST/REPO:CELL-<content digest>, what was looked up
    image: ImageInfo
    pulled: bool = True  # False: the image on this daemon already was that manifest (bind_local)


@dataclass(frozen=True, kw_only=True)
class Found:
    """The registry's image under a cell's content tag."""

    reference: str  # HOST/REPO@sha256:... of the cell's platform manifest
    content_ref: str  # HOST/REPO:CELL-<content digest>, what was looked up
    image_id: str  # its id on this daemon: the manifest digest (containerd store) or its config digest


def registry_credentials(registry: str) -> Credentials | None:
    """The registry's credentials from the environment or docker's own config (never argv)."""
    host, _ = repository(registry)
    return find_credentials(host, env=dict(os.environ))


@dataclass(frozen=True, kw_only=True)
class Wanted:
    """A cell's image as the site's registry would hold it: under `content_tag` (HOST/REPO:CELL-<content
    digest>, pipeline.registry.layout.content_ref) for the cell's platform, reached with `credentials`
    (from the environment or docker's own config, never argv) and the site's CA bundle."""

    registry: str
    cell_id: str
    content_tag: str  # the local tag, stackproof/CELL:<content digest[:16]>
    platform: str
    credentials: Credentials | None
    ca_bundle: str | None = None


def find_built(docker: Docker, wanted: Wanted) -> Found | None:
    """The platform manifest the registry holds under the cell's content tag, and the id docker gives
    its image on this daemon's store; None when the registry does not have the tag."""
    ref = content_ref(wanted.registry, wanted.cell_id, wanted.content_tag)
    host, repo = repository(wanted.registry)
    tag = ref.rpartition(":")[2]
    with RegistryClient(host, credentials=wanted.credentials, ca_bundle=wanted.ca_bundle) as client:
        client.check()
        if client.manifest(repo, tag) is None:
            return None
        _, manifest = resolve_platform(client, repo, tag, wanted.platform, where=ref)
    image_id = manifest.digest if docker.image_store() == CONTAINERD_STORE else str(manifest.config_digest)
    return Found(reference=f"{host}/{repo}@{manifest.digest}", content_ref=ref, image_id=image_id)


def fetch_built(docker: Docker, wanted: Wanted) -> Fetched | None:
    """Pull the cell's image by digest when its content tag is in the registry, tagged `content_tag`
    locally; None when the registry does not have it (the caller builds)."""
    found = find_built(docker, wanted)
    if found is None:
        return None
    print(
        f"{wanted.cell_id}: {found.content_ref} is in the registry: pulling {found.reference} instead of building",
        file=sys.stderr,
    )
    return _pull(docker, found, wanted)


def bind_local(docker: Docker, wanted: Wanted, *, local: ImageInfo) -> Fetched:
    """The content tag is already on this daemon (`build --pull-only` on a runner that built or
    verified the cell before): the registry's digest of that very image, so a receipt and its
    signature can name it. The registry's image under the tag wins: when the local one differs it
    is pulled by digest over it; when the registry lacks the tag the local image is pushed first."""
    cell_id, content_tag, registry = wanted.cell_id, wanted.content_tag, wanted.registry
    found = find_built(docker, wanted)
    if found is None:
        print(f"{cell_id}: {content_tag} is on this daemon but not in {registry}: pushing it", file=sys.stderr)
        push_built(docker, registry=registry, cell_id=cell_id, content_tag=content_tag, credentials=wanted.credentials)
        found = find_built(docker, wanted)
        if found is None:
            raise CheckFailed(f"{cell_id}: pushed {content_tag} to {registry}, but the registry lacks it")
    if found.image_id == local.id:
        print(f"{cell_id}: {content_tag} on this daemon is {found.reference} in the registry", file=sys.stderr)
        return Fetched(reference=found.reference, content_ref=found.content_ref, image=local, pulled=False)
    print(
        f"{cell_id}: {content_tag} on this daemon ({local.id}) is not the registry's image under its tag "
        f"({found.image_id}): pulling {found.reference} over it",
        file=sys.stderr,
    )
    return _pull(docker, found, wanted)


def _pull(docker: Docker, found: Found, wanted: Wanted) -> Fetched:
    """Pull `found` by digest, tag it `content_tag` and check the image docker now has is that manifest."""
    docker.pull(found.reference, login=docker_login(wanted.credentials))
    docker.tag(found.reference, wanted.content_tag)
    info = docker.image(wanted.content_tag)
    if info is None or info.id != found.image_id:
        docker.remove_image(wanted.content_tag)
        raise CheckFailed(
            f"{wanted.cell_id}: pulled {found.reference} but its image id is {info.id if info else None}, not "
            f"{found.image_id}: the registry did not serve the manifest it named"
        )
    return Fetched(reference=found.reference, content_ref=found.content_ref, image=info)


def push_built(
    docker: Docker, *, registry: str, cell_id: str, content_tag: str, credentials: Credentials | None
) -> str:
    """Push the local `content_tag` as `HOST/REPO:CELL-<content digest>`; `HOST/REPO@<pushed digest>`."""
    ref = content_ref(registry, cell_id, content_tag)
    docker.tag(content_tag, ref)
    try:
        digest = docker.push(ref, login=docker_login(credentials))
    finally:
        docker.remove_image(ref)
    reference = f"{ref.rpartition(':')[0]}@{digest}"
    print(f"{cell_id}: pushed {ref} ({reference})", file=sys.stderr)
    return reference
