"""The release-pin table as data: each vLLM release's raw wheel metadata, written by a command.

`pipeline/releases/release_pins.json` holds, per vLLM release, the `Requires-Dist` lines of the vllm wheel
and of the torch it pins, for each platform the official image has (the wheel file and its sha256
beside them), and what the release's docker/Dockerfile installs over them when that file was read.
`stackproof matrix pins refresh vllm==X.Y.Z [--dockerfile FILE]` writes an entry; nothing edits it
by hand. The pins themselves are derived from those lines (`derive`), so a unit test re-derives
them from the same text kept as fixtures.

The same record, fetched for a release not in the table, is kept under the cache directory
(`<cache>/release-pins/<index digest>/vllm-X.Y.Z.json`): a wheel's metadata never changes, so a
second command asks no index for it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import InputError

__all__ = [
    "NETWORK_WORDS",
    "PLATFORMS",
    "TABLE",
    "DockerfileFacts",
    "Release",
    "WheelMetadata",
    "cached_release",
    "load_table",
    "release_from_json",
    "release_to_json",
    "store_cached",
    "write_release",
]

# STACKPROOF_RELEASE_PINS: another table file (a copy), for a run that must not write the project's own.
TABLE = Path(os.environ.get("STACKPROOF_RELEASE_PINS") or Path(__file__).with_name("release_pins.json"))
PLATFORMS = ("linux/amd64", "linux/arm64")  # the official image's platforms (matrix.yaml's base)
# pip's words for "the index could not be reached", as opposed to "it has no such file".
NETWORK_WORDS = re.compile(
    r"ProxyError|NewConnectionError|Max retries exceeded|ConnectTimeout|ReadTimeout|SSLError|"
    r"Network is unreachable|Temporary failure in name resolution|Connection refused|Could not fetch URL|"
    r"too many \d+ error responses|Name or service not known"
)


@dataclass(frozen=True, kw_only=True)
class WheelMetadata:
    """One wheel's Requires-Dist, as pip's report gave it."""

    wheel: str
    sha256: str
    requires_dist: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class DockerfileFacts:
    """What a release's docker/Dockerfile installs over its wheels' metadata (`UV_OVERRIDE` lines)."""

    source: str  # which file, read when
    overrides: tuple[tuple[str, str], ...] = ()  # (canonical name, version)
    args: tuple[tuple[str, str], ...] = ()  # the ARG defaults the overrides came from
    require_cuda: str | None = None  # from `ARG CUDA_VERSION`


@dataclass(frozen=True, kw_only=True)
class Release:
    version: str
    read: str  # when and how the metadata was read
    vllm: tuple[tuple[str, WheelMetadata], ...]  # (platform, metadata)
    torch_version: str | None
    torch: tuple[tuple[str, WheelMetadata], ...] = ()
    dockerfile: DockerfileFacts | None = None  # None: the release's Dockerfile was not read
    # (package, matrix index, how it was found): the index that carries the pinned version when it is
    # not the `pypi` one (FlashInfer 0.7.3, vLLM 0.34.0's pin, is on FlashInfer's index only).
    indexes: tuple[tuple[str, str, str], ...] = ()

    @property
    def read_on(self) -> str:
        """The date the metadata was read (the first word of `read`)."""
        return f"read {self.read.split()[0]}" if self.read else "read on an unrecorded date"

    def requires(self, package: str, platform: str) -> tuple[str, ...] | None:
        found = dict(self.vllm if package == "vllm" else self.torch).get(platform)
        return found.requires_dist if found else None


@functools.cache
def load_table(path: Path = TABLE) -> Mapping[str, Release]:
    """version -> Release, from the table file (read once per process)."""
    try:
        document = json.loads(path.read_text())
        return {version: release_from_json(entry) for version, entry in document["releases"].items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(
            f"{path}: not a release-pin table ({exc}); rewrite it with `stackproof matrix pins refresh`"
        ) from None


def write_release(release: Release, path: Path = TABLE) -> None:
    """Put `release` into the table file (sorted by version), replacing an entry of the same version."""
    from packaging.version import Version

    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        document = {"schema_version": 1, "releases": {}}
    releases = {**document.get("releases", {}), release.version: release_to_json(release)}
    document = {
        "schema_version": 1,
        "written_by": "stackproof matrix pins refresh (never edit by hand)",
        "releases": {v: releases[v] for v in sorted(releases, key=Version)},
    }
    _atomic_write(path, json.dumps(document, indent=1) + "\n")
    load_table.cache_clear()


def cached_release(cache: Path, index_url: str, version: str) -> Release | None:
    """A release's record fetched by an earlier command from `index_url`, if any."""
    try:
        return release_from_json(json.loads(_cache_file(cache, index_url, version).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store_cached(cache: Path, index_url: str, release: Release) -> None:
    path = _cache_file(cache, index_url, release.version)
    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write(path, json.dumps(release_to_json(release), indent=1))


def _cache_file(cache: Path, index_url: str, version: str) -> Path:
    digest = hashlib.sha256(index_url.encode()).hexdigest()[:16]  # no URL (it may carry credentials) in a path
    return cache / "release-pins" / digest / f"vllm-{version}.json"


def _atomic_write(path: Path, text: str) -> None:
    from pipeline.guard.atomic import replace_text

    replace_text(path, text)


# -- JSON form (the same shape as tests/fixtures/repro/pypi-metadata-vllm-0.28.0.json) --------------


def release_to_json(release: Release) -> dict[str, Any]:
    def wheels(version: str | None, items: tuple[tuple[str, WheelMetadata], ...]) -> dict[str, Any]:
        out: dict[str, Any] = {"version": version}
        for platform, meta in items:
            out[platform] = {"wheel": meta.wheel, "sha256": meta.sha256, "requires_dist": list(meta.requires_dist)}
        return out

    document: dict[str, Any] = {
        "read": release.read,
        "vllm": wheels(release.version, release.vllm),
        "torch": wheels(release.torch_version, release.torch),
    }
    if release.indexes:
        document["indexes"] = {name: {"index": index, "how": how} for name, index, how in release.indexes}
    if release.dockerfile is not None:
        d = release.dockerfile
        document["dockerfile"] = {
            "source": d.source,
            "overrides": dict(d.overrides),
            "args": dict(d.args),
            "require_cuda": d.require_cuda,
        }
    return document


def release_from_json(entry: Mapping[str, Any]) -> Release:
    def wheels(part: Mapping[str, Any]) -> tuple[tuple[str, WheelMetadata], ...]:
        return tuple(
            (
                platform,
                WheelMetadata(wheel=m["wheel"], sha256=m["sha256"], requires_dist=tuple(m["requires_dist"])),
            )
            for platform, m in part.items()
            if platform != "version"
        )

    docker = entry.get("dockerfile")
    facts = None
    if docker is not None:
        facts = DockerfileFacts(
            source=str(docker["source"]),
            overrides=tuple(sorted(docker.get("overrides", {}).items())),
            args=tuple(sorted(docker.get("args", {}).items())),
            require_cuda=docker.get("require_cuda"),
        )
    torch = entry.get("torch") or {}
    return Release(
        version=str(entry["vllm"]["version"]),
        read=str(entry.get("read", "")),
        vllm=wheels(entry["vllm"]),
        torch_version=torch.get("version"),
        torch=wheels(torch),
        dockerfile=facts,
        indexes=tuple(
            (str(name), str(where["index"]), str(where.get("how", "")))
            for name, where in sorted((entry.get("indexes") or {}).items())
        ),
    )


Fetch = Callable[[str, str, str], WheelMetadata]
