"""What a base carries, as exact pins: a vLLM release image's own metadata, or a cell's stack.

`release_pins` answers "what does `vllm/vllm-openai:vX.Y.Z` pin?" from, in order:
1. the built-in table below (read from PyPI once; the raw metadata it came from is kept in
   tests/fixtures/repro/pypi-metadata-vllm-0.28.0.json and a unit test re-derives the table from it),
2. PyPI itself, when fetching is allowed: `pip install --dry-run --no-deps --report -` with
   `--use-feature=fast-deps` reads each wheel's METADATA through HTTP range requests (PyPI's
   `/pypi/NAME/VERSION/json` answers 404 for these releases, and the simple index carries no
   PEP 658 metadata for them), first for vllm, then for the torch it pins,
3. nothing: the pins are unknown, and the caller says so.
Every answer carries `source`, which the caller prints.

The release's pins are vllm's own `==` Requires-Dist and torch's (torch brings cuDNN and NCCL). The
image also carries flashinfer-cubin and flashinfer-jit-cache, which no metadata pins: they are
assumed to follow flashinfer-python in lockstep (jit-cache with torch's `+cuXY`), and marked so.

`cell_stack` answers the same for a cell of matrix.yaml: its base's pins, then its lock, its
uninstalls and its overrides.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from packaging.markers import InvalidMarker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from pipeline import cmd
from pipeline.errors import InputError, PipelineError
from pipeline.model import BootstrapBase, Cell, CellBase, HostBase, Matrix, RegistryBase

__all__ = [
    "BUILTIN_RELEASES",
    "FI_CUBIN",
    "FI_JIT",
    "FI_PYTHON",
    "IMAGE_DOCKERFILE_OVERRIDES",
    "Lookup",
    "Pins",
    "ReleaseLookup",
    "cell_stack",
    "exact_pins",
    "fetch_requires_dist",
    "release_of_image",
    "release_pins",
]

FI_PYTHON, FI_CUBIN, FI_JIT = "flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache"
OFFICIAL_IMAGE = "vllm/vllm-openai"
LOCKSTEP = "assumed to follow flashinfer-python in lockstep (no metadata pins it)"

# Exact pins of vLLM release images, read from PyPI on 2026-11-30 (vllm and torch wheels for
# cp312 manylinux_2_28, x86_64 and aarch64 alike). Re-derived from the raw metadata by
# tests/unit/test_repro.py::test_builtin_table_is_what_pypi_said.
BUILTIN_RELEASES: dict[str, dict[str, str]] = {
    "0.28.0": {
        # vllm 0.28.0 Requires-Dist, exact pins
        "vllm": "0.28.0",
        "lm-format-enforcer": "0.11.3",
        "outlines-core": "0.2.14",
        "lark": "1.2.2",
        "compressed-tensors": "0.17.0",
        "depyf": "0.20.0",
        "numba": "0.65.0",
        "torch": "2.13.0",
        "torchaudio": "2.11.0",
        "torchvision": "0.28.0",
        "pynvvideocodec": "2.0.4",
        "flashinfer-python": "0.6.16.post3",
        "apache-tvm-ffi": "0.1.11",
        "tilelang": "0.1.12",
        "nvtx": "0.2.15",
        "nvidia-cutlass-dsl": "4.6.2",
        "quack-kernels": "0.6.4",
        "tokenspeed-mla": "0.1.8",
        "humming-kernels": "0.1.12",
        # torch 2.13.0 Requires-Dist, exact pins (Linux)
        "cuda-toolkit": "13.0.3",
        "nvidia-cudnn-cu13": "9.20.0.48",
        "nvidia-cusparselt-cu13": "0.8.1",
        "nvidia-nccl-cu13": "2.29.7",
        "nvidia-nvshmem-cu13": "3.4.5",
        "triton": "3.7.1",
    },
}
BUILTIN_SOURCE = "built-in table (vllm {v} and torch {t} METADATA, read from PyPI 2026-11-30)"

# What a release image's Dockerfile installs over its wheels' metadata. v0.28.0 (release commit
# 2cf0a691, docker/Dockerfile, runtime stage): `ARG NCCL_VERSION=2.30.7`, then
# `echo "nvidia-nccl-cu${CUDA_MAJOR}==${NCCL_VERSION}" > /etc/uv-overrides.txt` with
# `ENV UV_OVERRIDE=/etc/uv-overrides.txt` before the requirements install, so the image has NCCL
# 2.30.7 although torch 2.13.0 requires ==2.29.7: a conflict the untouched image itself carries.
IMAGE_DOCKERFILE_OVERRIDES: dict[str, dict[str, str]] = {
    "0.28.0": {"nvidia-nccl-cu13": "2.30.7"},
}


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


def release_pins(
    version: str,
    platform: str,
    *,
    online: bool,
    fetch: Callable[[str, str, str], list[str]] | None = None,
) -> tuple[Pins | None, str]:
    """The pins of `vllm/vllm-openai:v{version}`, and a line saying where they came from (or why none)."""
    try:
        parsed = Version(version)
    except InvalidVersion:
        return None, f"vLLM {version!r} is not a version: its image's pins are unknown"
    if parsed.is_devrelease or parsed.local:
        return None, f"vLLM {version} is a development build, not on PyPI: its image's pins are unknown"
    table = BUILTIN_RELEASES.get(version)
    if table is not None:
        pins = dict(table)
        source = BUILTIN_SOURCE.format(v=version, t=pins.get("torch", "?"))
    elif not online:
        return None, f"vLLM {version} is not in the built-in table and fetching is off (--offline): pins unknown"
    else:
        fetch = fetch or fetch_requires_dist
        try:
            environment = marker_environment(platform)
            pins = exact_pins(fetch("vllm", version, platform), environment)
            pins["vllm"] = version
            if "torch" in pins:
                pins.update(exact_pins(fetch("torch", pins["torch"], platform), environment))
        except PipelineError as exc:
            return None, f"vLLM {version}: reading its metadata from PyPI failed ({exc}): pins unknown"
        source = f"PyPI (vllm {version} and torch {pins.get('torch', '?')} METADATA, fetched now)"
    extra = lockstep(pins)
    pins.update(extra)
    dockerfile = IMAGE_DOCKERFILE_OVERRIDES.get(version, {})
    pins.update(dockerfile)
    if dockerfile:
        moved = ", ".join(f"{name} {v}" for name, v in sorted(dockerfile.items()))
        source += f"; {moved} as the image's Dockerfile installs it (UV_OVERRIDE)"
    assumed = tuple((name, LOCKSTEP) for name in sorted(extra))
    return Pins(pins=_pins(pins), complete=False, source=source, assumed=assumed), source


def fetch_requires_dist(
    name: str,
    version: str,
    platform: str,
    *,
    index_url: str = "https://pypi.org/simple",
    cert: Path | None = None,
    redact: tuple[str, ...] = (),
) -> list[str]:
    """`Requires-Dist` of the cp312 manylinux wheel of name==version, read through range requests.

    `--isolated` keeps the host's pip configuration (extra indexes, constraints) out of the
    answer; `cert` is then the CA bundle to pass on (the site's, see pipeline/site.py).
    """
    machine = "aarch64" if platform == "linux/arm64" else "x86_64"
    with tempfile.TemporaryDirectory(prefix="stackproof-pins-") as target:
        argv = [sys.executable, "-m", "pip", "install", "--isolated", "--dry-run", "--no-deps", "--ignore-installed"]
        argv += ["--quiet", "--report", "-", "--index-url", index_url, "--only-binary=:all:", "--python-version"]
        argv += ["3.12", "--platform", f"manylinux_2_28_{machine}", "--target", target, "--use-feature=fast-deps"]
        argv += ([f"--cert={cert}"] if cert else []) + [f"{name}=={version}"]
        result = cmd.run(argv, timeout=180, redact=redact)
    try:
        report = json.loads(result.stdout)
        return list(report["install"][0]["metadata"].get("requires_dist") or [])
    except (ValueError, KeyError, IndexError) as exc:
        raise InputError(f"pip's report for {name}=={version} has no metadata ({exc})") from exc


class ReleaseLookup:
    """`release_pins` with a cache and one setting for the whole command (online or not)."""

    def __init__(self, *, online: bool, fetch: Callable[[str, str, str], list[str]] | None = None) -> None:
        self.online = online
        self.fetch = fetch
        self._seen: dict[tuple[str, str], tuple[Pins | None, str]] = {}

    def __call__(self, version: str, platform: str) -> tuple[Pins | None, str]:
        key = (version, platform)
        if key not in self._seen:
            self._seen[key] = release_pins(version, platform, online=self.online, fetch=self.fetch)
        return self._seen[key]


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
    else:
        pins, complete, source = _registry_pins(base, cell.platform, lookup, assumed, notes)
    if cell.install is not None:
        from pipeline.lock import read_lock

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
