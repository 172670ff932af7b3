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

__all__ = ["Fetched", "cache_ref", "fetch_built", "push_built", "registry_credentials"]


@dataclass(frozen=True, kw_only=True)
class Fetched:
    """An image taken from the registry instead of being built."""

    reference: str  # HOST/REPO@sha256:... pulled (the platform manifest)
    content_ref: str  # HOST/REPO:CELL-<content digest>, what was looked up
    image: ImageInfo


def registry_credentials(registry: str) -> Credentials | None:
    """The registry's credentials from the environment or docker's own config (never argv)."""
    host, _ = repository(registry)
    return find_credentials(host, env=dict(os.environ))


def fetch_built(
    docker: Docker,
    *,
    registry: str,
    cell_id: str,
    content_tag: str,
    platform: str,
    credentials: Credentials | None,
    ca_bundle: str | None = None,
) -> Fetched | None:
    """Pull the cell's image by digest when its content tag is in `registry`, tagged `content_tag`
    locally; None when the registry does not have it (the caller builds)."""
    ref = content_ref(registry, cell_id, content_tag)
    host, repo = repository(registry)
    tag = ref.rpartition(":")[2]
    with RegistryClient(host, credentials=credentials, ca_bundle=ca_bundle) as client:
        client.check()
        if client.manifest(repo, tag) is None:
            return None
        _, manifest = resolve_platform(client, repo, tag, platform, where=ref)
    reference = f"{host}/{repo}@{manifest.digest}"
    print(f"{cell_id}: {ref} is in the registry: pulling {reference} instead of building", file=sys.stderr)
    docker.pull(reference, login=docker_login(credentials))
    docker.tag(reference, content_tag)
    info = docker.image(content_tag)
    expected = manifest.digest if docker.image_store() == CONTAINERD_STORE else str(manifest.config_digest)
    if info is None or info.id != expected:
        docker.remove_image(content_tag)
        raise CheckFailed(
            f"{cell_id}: pulled {reference} but its image id is {info.id if info else None}, not {expected}: "
            "the registry did not serve the manifest it named"
        )
    return Fetched(reference=reference, content_ref=ref, image=info)


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
