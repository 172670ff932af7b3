"""What a base carries, as exact pins: a vLLM release image's own metadata, or a cell's stack.

`release_pins` answers "what does `vllm/vllm-openai:vX.Y.Z` pin?" from, in order:
1. the release-pin table (pipeline/releases/release_pins.json, pipeline/releases/table.py): each release's raw
   wheel metadata, written by `stackproof matrix pins refresh vllm==X.Y.Z`, never by hand; a unit
   test re-derives the pins from the same text kept in tests/fixtures,
2. when fetching is allowed, the same metadata kept under the cache directory by an earlier
   command, else PyPI itself: `pip install --dry-run --no-deps --report -` with
   `--use-feature=fast-deps` reads each wheel's METADATA through HTTP range requests (PyPI's
   `/pypi/NAME/VERSION/json` answers 404 for these releases, and the simple index carries no
   PEP 658 metadata for them), first for vllm, then for the torch it pins; what it read is kept,
3. nothing: the pins are unknown, and the caller says so.
Every answer carries `source`, which the caller prints. `ReleaseLookup` asks an index that could
not be reached once per command.

The release's pins are vllm's own `==` Requires-Dist and torch's (torch brings cuDNN and NCCL). The
image also carries flashinfer-cubin and flashinfer-jit-cache, which no metadata pins: they are
assumed to follow flashinfer-python in lockstep (jit-cache with torch's `+cuXY`), and marked so.

`cell_stack` answers the same for a cell of matrix.yaml: its base's pins, then its lock, its
uninstalls and its overrides.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

from packaging.markers import InvalidMarker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from pipeline import cmd
from pipeline.errors import InfraError, InputError, PipelineError
from pipeline.matrix.model import ArchiveBase, BootstrapBase, Cell, CellBase, HostBase, Matrix, RegistryBase
from pipeline.releases.table import (
    NETWORK_WORDS,
    Release,
    WheelMetadata,
    cached_release,
    load_table,
    store_cached,
)

__all__ = [
    "FI_CUBIN",
    "FI_JIT",
    "FI_PYTHON",
    "Lookup",
    "Pins",
    "ReleaseLookup",
    "builtin_releases",
    "cell_stack",
    "derive",
    "dockerfile_overrides",
    "exact_pins",
    "fetch_metadata",
    "fetch_requires_dist",
    "release_of_image",
    "release_pins",
]

FI_PYTHON, FI_CUBIN, FI_JIT = "flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache"
OFFICIAL_IMAGE = "vllm/vllm-openai"
LOCKSTEP = "assumed to follow flashinfer-python in lockstep (no metadata pins it)"


def builtin_releases(platform: str = "linux/amd64") -> dict[str, dict[str, str]]:
    """version -> the exact pins its wheels' metadata give on `platform`, for every release in the
    table (pipeline/releases/release_pins.json, written by `stackproof matrix pins refresh`), before the
    lockstep companions and the Dockerfile's overrides."""
    return {version: derive(release, platform) for version, release in load_table().items()}


def dockerfile_overrides(version: str) -> dict[str, str]:
    """What the release's Dockerfile installs over its metadata; {} when not read or none."""
    release = load_table().get(version)
    return dict(release.dockerfile.overrides) if release and release.dockerfile else {}


def derive(release: Release, platform: str) -> dict[str, str]:
    """vllm's own `==` Requires-Dist and its torch's, evaluated for the image on `platform`."""
    environment = marker_environment(platform)
    pins = exact_pins(list(release.requires("vllm", platform) or ()), environment)
    pins["vllm"] = release.version
    pins.update(exact_pins(list(release.requires("torch", platform) or ()), environment))
    return pins


@dataclass(frozen=True, kw_only=True)
class Pins:
    """Exact versions a base or cell is known to carry.

    `complete`: every distribution is known (a locked stack), so a package missing here is absent
    there. Otherwise only these are pinned and anything else is whatever the base resolved.
    """

    pins: tuple[tuple[str, str], ...]  # (canonical name, version), sorted
    complete: bool
    source: str
    assumed: tuple[tuple[str, str], ...] = ()  # (name, why its pin is an assumption)
    absent: tuple[str, ...] = ()  # names removed on purpose (`uninstall`)
    notes: tuple[str, ...] = field(default=())
    indexes: tuple[tuple[str, str], ...] = ()  # (name, matrix index) where the release's index is not pypi

    def get(self, name: str) -> str | None:
        return dict(self.pins).get(str(canonicalize_name(name)))

    def as_dict(self) -> dict[str, str]:
        return dict(self.pins)


def _pins(mapping: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((str(canonicalize_name(k)), v) for k, v in mapping.items()))


# -- release pins -----------------------------------------------------------------------------------


def marker_environment(platform: str, python_version: str = "3.12") -> dict[str, str]:
    """The environment markers of the official image (Linux, CPython 3.12) on `platform`."""
    machine = "aarch64" if platform == "linux/arm64" else "x86_64"
    return {
        "implementation_name": "cpython",
        "implementation_version": f"{python_version}.0",
        "os_name": "posix",
        "platform_machine": machine,
        "platform_python_implementation": "CPython",
        "platform_release": "",
        "platform_system": "Linux",
        "platform_version": "",
        "python_full_version": f"{python_version}.0",
        "python_version": python_version,
        "sys_platform": "linux",
        "extra": "",
    }


def exact_pins(requires_dist: list[str], environment: dict[str, str]) -> dict[str, str]:
    """The `name==version` requirements that apply in `environment` (extras dropped: none installed)."""
    pins: dict[str, str] = {}
    for line in requires_dist:
        try:
            requirement = Requirement(line)
            applies = requirement.marker is None or requirement.marker.evaluate(environment)
        except (InvalidRequirement, InvalidMarker):
            continue
        specs = list(requirement.specifier)
        if applies and len(specs) == 1 and specs[0].operator in ("==", "===") and "*" not in specs[0].version:
            pins[str(canonicalize_name(requirement.name))] = specs[0].version
    return pins


def lockstep(pins: dict[str, str]) -> dict[str, str]:
    """flashinfer-cubin and flashinfer-jit-cache at flashinfer-python's version; jit-cache gets
    `+cuXY` from the CUDA that torch pins (cuda-toolkit 13.0.3 -> cu130)."""
    fi = pins.get(FI_PYTHON)
    if fi is None:
        return {}
    extra = {FI_CUBIN: fi}
    cuda = cuda_tag(pins)
    if cuda:
        extra[FI_JIT] = f"{fi}+{cuda}"
    return extra


def cuda_tag(pins: dict[str, str]) -> str | None:
    toolkit = pins.get("cuda-toolkit")
    if toolkit:
        major, minor = [*toolkit.split("."), "0"][:2]
        return f"cu{major}{minor}"
    for name in pins:
        match = re.fullmatch(r"nvidia-cudnn-cu(\d+)", name)
        if match:
            return f"cu{match.group(1)}0"
    return None


RequiresFetch = Callable[[str, str, str], "list[str] | WheelMetadata"]


def release_pins(
    version: str,
    platform: str,
    *,
    online: bool,
    fetch: RequiresFetch | None = None,
    cache: tuple[Path, str] | None = None,
) -> tuple[Pins | None, str]:
    """The pins of `vllm/vllm-openai:v{version}`, and a line saying where they came from (or why none).

    Metadata comes from the release-pin table, else (online) from `cache` = (cache dir, index URL)
    where an earlier command kept it, else from `fetch`, whose answer is then kept there."""
    try:
        parsed = Version(version)
    except InvalidVersion:
        return None, f"vLLM {version!r} is not a version: its image's pins are unknown"
    if parsed.is_devrelease or parsed.local:
        return None, f"vLLM {version} is a development build, not on PyPI: its image's pins are unknown"
    release = load_table().get(version)
    if release is not None and release.requires("vllm", platform) is not None:
        source = f"release-pin table (vllm {version} and torch {release.torch_version} METADATA, {release.read_on})"
    elif not online:
        return None, (
            f"vLLM {version} is not in the release-pin table and fetching is off (--offline): pins unknown "
            f"(add it with `stackproof matrix pins refresh vllm=={version}`)"
        )
    else:
        release = cached_release(*cache, version) if cache else None
        if release is not None and release.requires("vllm", platform) is not None:
            source = f"PyPI (vllm {version} and torch {release.torch_version} METADATA, kept by an earlier command)"
        else:
            try:
                release = fetch_release(version, (platform,), fetch or fetch_requires_dist, known=release)
            except PipelineError as exc:
                return None, f"vLLM {version}: reading its metadata from PyPI failed ({_first_line(exc)}): pins unknown"
            if cache:
                store_cached(*cache, release)
            source = f"PyPI (vllm {version} and torch {release.torch_version} METADATA, fetched now)"
    return _pins_of(release, platform, source)


def _pins_of(release: Release, platform: str, source: str) -> tuple[Pins, str]:
    pins = derive(release, platform)
    extra = lockstep(pins)
    pins.update(extra)
    dockerfile = dict(release.dockerfile.overrides) if release.dockerfile else {}
    pins.update(dockerfile)
    if dockerfile:
        moved = ", ".join(f"{name} {v}" for name, v in sorted(dockerfile.items()))
        source += f"; {moved} as the image's Dockerfile installs it (UV_OVERRIDE)"
    notes = (
        ()
        if release.dockerfile
        else (
            f"vLLM {release.version}: its release Dockerfile was not read, so "
            "what it installs over the metadata is unknown",
        )
    )
    assumed = tuple((name, LOCKSTEP) for name in sorted(extra))
    indexes = tuple((name, index) for name, index, _ in release.indexes)
    if release.indexes:
        source += "; " + ", ".join(f"{name} from {index} ({how})" for name, index, how in release.indexes)
    found = Pins(pins=_pins(pins), complete=False, source=source, assumed=assumed, notes=notes, indexes=indexes)
    return found, source


def fetch_release(
    version: str, platforms: tuple[str, ...], fetch: RequiresFetch, *, known: Release | None = None
) -> Release:
    """vllm==version's metadata and its torch's on `platforms`, added to what `known` holds."""
    vllm = dict(known.vllm) if known else {}
    torch = dict(known.torch) if known else {}
    torch_version = known.torch_version if known else None
    for platform in platforms:
        vllm[platform] = _metadata(fetch("vllm", version, platform))
        pinned = exact_pins(list(vllm[platform].requires_dist), marker_environment(platform)).get("torch")
        if pinned is not None:
            torch_version = pinned
            torch[platform] = _metadata(fetch("torch", pinned, platform))
    return Release(
        version=version,
        read=f"{date.today().isoformat()} from the pypi index (pip --use-feature=fast-deps)",
        vllm=tuple(sorted(vllm.items())),
        torch_version=torch_version,
        torch=tuple(sorted(torch.items())),
        dockerfile=known.dockerfile if known else None,
    )


def _metadata(answer: list[str] | WheelMetadata) -> WheelMetadata:
    if isinstance(answer, WheelMetadata):
        return answer
    return WheelMetadata(wheel="", sha256="", requires_dist=tuple(answer))


def _first_line(exc: Exception) -> str:
    tail = getattr(exc, "output_tail", "")
    errors = [ln.strip() for ln in tail.splitlines() if ln.strip().startswith("ERROR")]
    network = [ln.strip() for ln in tail.splitlines() if NETWORK_WORDS.search(ln)]
    return (network or errors or [str(exc).splitlines()[0]])[0]


def fetch_requires_dist(name: str, version: str, platform: str, **options: Any) -> list[str]:
    """`Requires-Dist` of the cp312 manylinux wheel of name==version (see `fetch_metadata`)."""
    return list(fetch_metadata(name, version, platform, **options).requires_dist)


def fetch_metadata(
    name: str,
    version: str,
    platform: str,
    *,
    index_url: str = "https://pypi.org/simple",
    cert: Path | None = None,
    redact: tuple[str, ...] = (),
    find_links: Path | None = None,
) -> WheelMetadata:
    """The cp312 manylinux wheel of name==version: its file name, sha256 and `Requires-Dist`, read
    through range requests (`--use-feature=fast-deps`; a server without ranges sends the file).

    `--isolated` and `PIP_CONFIG_FILE=/dev/null` keep the host's pip configuration (extra indexes,
    constraints; the user's and the site-wide files) out of the answer; `find_links`: a local
    mirror directory, read with `--no-index` (never the public index instead); `cert`: the CA
    bundle to pass on (the site's, see pipeline/matrix/site.py). One retry: an unreachable index
    costs seconds, not pip's default five retries with back-off; one that cannot answer (unreachable,
    5xx) is InfraError (exit 3), not pip's "no matching distribution".
    """
    machine = "aarch64" if platform == "linux/arm64" else "x86_64"
    with tempfile.TemporaryDirectory(prefix="stackproof-pins-") as target:
        argv = [sys.executable, "-m", "pip", "install", "--isolated", "--dry-run", "--no-deps", "--ignore-installed"]
        where = ["--no-index", "--find-links", str(find_links)] if find_links else ["--index-url", index_url]
        argv += ["--quiet", "--report", "-", *where, "--only-binary=:all:", "--python-version"]
        argv += ["3.12", "--platform", f"manylinux_2_28_{machine}", "--target", target, "--use-feature=fast-deps"]
        # --progress-bar off: pip 23.2 draws its download bar on stdout when --log is given, before the report.
        argv += ["--retries", "1", "--timeout", "30", "--disable-pip-version-check", "--progress-bar", "off"]
        # --quiet keeps stdout for the report and hides pip's retry warnings; its --log keeps them,
        # and they are what tells "the index cannot be reached" from "it has no such file".
        argv += ["--log", str(Path(target) / "pip.log")]
        argv += ([f"--cert={cert}"] if cert else []) + [f"{name}=={version}"]
        try:
            # PIP_CONFIG_FILE=/dev/null: no configuration file at all, the site-wide ones too
            # (--isolated skips the user's only; issue 43: /etc/pip.conf's index leaked in).
            result = cmd.run(argv, timeout=180, redact=redact, env={"PIP_CONFIG_FILE": os.devnull})
        except cmd.CommandFailed as exc:
            log = (Path(target) / "pip.log").read_text(errors="replace") if (Path(target) / "pip.log").exists() else ""
            for secret in redact:  # the log names the index URL, credentials and all
                log = log.replace(secret, "***") if secret else log
            network = [line for line in log.splitlines() if NETWORK_WORDS.search(line)][-3:]
            network += [line for line in exc.output_tail.splitlines() if NETWORK_WORDS.search(line)][-3:]
            if network:  # issue 43: the index could not answer (unreachable, 5xx): exit 3, not "no such version"
                shown = re.sub(r"^\S+T\S+ ", "", network[-1].strip())[:400]
                source = f"index {find_links}" if find_links else "the pypi index"
                raise InfraError(f"{source} could not answer for {name}=={version}: {shown}") from None
            raise cmd.CommandFailed(exc.argv, exc.returncode, exc.output_tail) from None
    try:
        item = json.loads(result.stdout)["install"][0]
        info = item.get("download_info") or {}
        return WheelMetadata(
            wheel=str(info.get("url", "")).rsplit("/", 1)[-1].split("#")[0],
            sha256=str((info.get("archive_info") or {}).get("hashes", {}).get("sha256", "")),
            requires_dist=tuple(item["metadata"].get("requires_dist") or ()),
        )
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        raise InputError(f"pip's report for {name}=={version} has no metadata ({exc})") from exc


class ReleaseLookup:
    """`release_pins` for one whole command: one setting (online or not), each (version, platform)
    answered once, metadata kept on disk under `cache` (by index URL and version), and an index
    that could not be reached asked once: every later fetch in the command fails at once."""

    def __init__(
        self,
        *,
        online: bool,
        fetch: RequiresFetch | None = None,
        cache: Path | None = None,
        index_url: str = "https://pypi.org/simple",
    ) -> None:
        self.online = online
        self.fetch = fetch or functools.partial(fetch_metadata, index_url=index_url)
        self.cache = (cache, index_url) if cache is not None else None
        self._seen: dict[tuple[str, str], tuple[Pins | None, str]] = {}
        self._failed: dict[tuple[str, str] | None, str] = {}  # (name, version), or None: the index
        self.asked = 0  # fetches that reached the index (tests and the benchmark read it)

    def __call__(self, version: str, platform: str) -> tuple[Pins | None, str]:
        key = (version, platform)
        if key not in self._seen:
            self._seen[key] = release_pins(
                version, platform, online=self.online, fetch=self._fetch_once, cache=self.cache
            )
        return self._seen[key]

    def _fetch_once(self, name: str, version: str, platform: str) -> list[str] | WheelMetadata:
        for key in (None, (name, version)):
            if key in self._failed:
                raise InputError(f"{self._failed[key]} (asked once in this command, not again)")
        self.asked += 1
        try:
            return self.fetch(name, version, platform)
        except PipelineError as exc:
            reason = _first_line(exc)
            unreachable = NETWORK_WORDS.search(f"{exc} {getattr(exc, 'output_tail', '')}")
            self._failed[None if unreachable else (name, version)] = reason
            raise


def release_of_image(image: str) -> str | None:
    """`vllm/vllm-openai:v0.28.0` -> `0.28.0`; None for any other image or a nightly tag."""
    repository, _, tag = image.rpartition(":")
    if repository.removeprefix("docker.io/") != OFFICIAL_IMAGE:
        return None
    match = re.fullmatch(r"v(\d+\.\d+\.\d+(?:\.post\d+|rc\d+)?)", tag)
    return match.group(1) if match else None


# -- a cell's stack ---------------------------------------------------------------------------------


Lookup = Callable[[str, str], tuple[Pins | None, str]]


def cell_stack(matrix: Matrix, cell: Cell, lookup: Lookup) -> Pins:
    """What `cell`'s image is known to hold: its base's pins, then lock, uninstall, overrides."""
    base = cell.base
    notes: list[str] = []
    assumed: dict[str, str] = {}
    if isinstance(base, CellBase):
        parent = cell_stack(matrix, matrix.cell(base.cell), lookup)
        pins, complete, source = parent.as_dict(), parent.complete, f"cell {base.cell}: {parent.source}"
        assumed.update(parent.assumed)
        notes += parent.notes
    elif isinstance(base, BootstrapBase):
        pins, complete, source = {}, True, f"bootstrap base {base.name} (an empty venv)"
    elif isinstance(base, HostBase):
        pins, complete, source = {}, True, "a host environment (a new venv)"
    elif isinstance(base, ArchiveBase):  # what a local archive holds is not known without loading it
        pins, complete, source = {}, False, f"archive base {base.name} (sha256 {base.sha256[:12]}): contents not read"
    else:
        pins, complete, source = _registry_pins(base, cell.platform, lookup, assumed, notes)
    if cell.install is not None:
        from pipeline.build.lock import read_lock

        try:
            lock = read_lock(cell)
            pins.update({p.name: p.version for p in lock.packages})
            source += f"; lock {cell.install.lock.name}"
        except InputError as exc:
            pins.update({r.name: r.version for r in cell.install.requirements})
            complete = False
            notes.append(f"{cell.id}: no usable lock ({exc}); only its install requirements are known")
    for name in cell.uninstall:
        pins.pop(name, None)
        assumed.pop(name, None)
    for override in cell.overrides:
        pins[override.name] = override.version
        assumed.pop(override.name, None)
    return Pins(
        pins=_pins(pins),
        complete=complete,
        source=source,
        assumed=tuple(sorted(assumed.items())),
        absent=tuple(sorted(cell.uninstall)),
        notes=tuple(notes),
    )


def _registry_pins(
    base: RegistryBase, platform: str, lookup: Lookup, assumed: dict[str, str], notes: list[str]
) -> tuple[dict[str, str], bool, str]:
    release = release_of_image(base.image)
    if release is None:
        notes.append(f"base image {base.image}: not a vLLM release image, its contents are unknown")
        return {}, False, f"registry image {base.image} (contents unknown)"
    found, source = lookup(release, platform)
    if found is None:
        notes.append(source)
        return {"vllm": release}, False, source
    assumed.update(found.assumed)
    return found.as_dict(), False, source
