"""Where stackproof keeps things in a registry, and the two lookups everything that talks to one shares.

Repository `HOST[:PORT][/NAMESPACE]/stackproof` holds the images (`CELL-<content digest>`, pushed by
`build --push` and `publish`), their receipts and the human tags (pipeline.registry.publish);
`.../stackproof-cache` holds buildx's layer cache, one tag per cell (pipeline.registry.fleet).
"""

from __future__ import annotations

from pipeline.errors import CheckFailed
from pipeline.registry.oci import Credentials, Manifest, RegistryClient, platform_manifest, split_registry

__all__ = [
    "CACHE_REPOSITORY",
    "REPOSITORY",
    "cache_ref",
    "content_ref",
    "docker_login",
    "repository",
    "resolve_platform",
]

REPOSITORY = "stackproof"
CACHE_REPOSITORY = "stackproof-cache"  # its own repository: pull and report never see cache manifests


def repository(registry: str) -> tuple[str, str]:
    """(host, repository) of the stackproof images in `registry` (`HOST[:PORT][/NAMESPACE]`)."""
    host, namespace = split_registry(registry)
    return host, f"{namespace}/{REPOSITORY}" if namespace else REPOSITORY


def content_ref(registry: str, cell_id: str, content_tag: str) -> str:
    """Where a cell's image is pushed under its content tag: `HOST/REPO:CELL-<content digest>`.
    Immutable in effect: the content tag names every input of the build."""
    host, repo = repository(registry)
    return f"{host}/{repo}:{cell_id}-{content_tag.rsplit(':', 1)[-1]}"


def cache_ref(registry: str, cell_id: str) -> str:
    """`HOST[/NAMESPACE]/stackproof-cache:CELL`: one cache per cell, overwritten by each build of it."""
    host, namespace = split_registry(registry)
    return f"{host}/{namespace + '/' if namespace else ''}{CACHE_REPOSITORY}:{cell_id}"


def docker_login(credentials: Credentials | None) -> Credentials | None:
    """Credentials docker does not already have from its own config: handed to its CLI privately."""
    if credentials is None or credentials.source.startswith("docker") or "auths" in credentials.source:
        return None
    return credentials


def resolve_platform(
    client: RegistryClient, repo: str, reference: str, platform: str, *, where: str
) -> tuple[Manifest, Manifest]:
    """(what `reference` names, the image manifest for `platform`): the same for a single-platform image."""
    top = client.manifest(repo, reference)
    if top is None:
        raise CheckFailed(f"{where}: {client.host}/{repo} has no manifest {reference}")
    if not top.is_index:
        return top, top
    descriptor = platform_manifest(top.json, platform)
    if descriptor is None:
        platforms = sorted(
            f"{(d.get('platform') or {}).get('os')}/{(d.get('platform') or {}).get('architecture')}"
            for d in top.json.get("manifests") or []
        )
        raise CheckFailed(f"{where}: the image index {top.digest} has no {platform} image (it has {platforms})")
    manifest = client.manifest(repo, descriptor["digest"])
    if manifest is None or manifest.is_index:
        raise CheckFailed(f"{where}: the index's {platform} entry {descriptor['digest']} is not an image manifest")
    return top, manifest
