"""How a container is given GPUs on this site: `--gpus` (the NVIDIA container runtime) or CDI device names.

Real runners offer one of two: the NVIDIA container runtime, which `docker run --gpus` drives, or a
Container Device Interface spec (`nvidia-ctk cdi generate`, NVIDIA's recommended path from container
toolkit 1.14), which Docker 25+ reads when `features.cdi` is on and injects for `--device KIND=NAME`.
Which one is a fact of the daemon (`docker info`: `Runtimes`, `CDISpecDirs`) and of the spec files in
those directories, or a site setting that forces one:

- `STACKPROOF_GPU_ACCESS`: `auto` (default), `gpus` or `cdi`.
- `STACKPROOF_CDI_KIND`: the CDI device kind to ask for (default `nvidia.com/gpu`; a test names a fake one).

Pure, apart from `cdi_spec_kinds`, which reads the spec directories the daemon names."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

__all__ = [
    "CDI_KIND_ENV",
    "DEFAULT_CDI_KIND",
    "GPU_ACCESS_ENV",
    "GpuAccess",
    "GpuAccessSetting",
    "cdi_spec_dirs",
    "cdi_spec_kinds",
    "choose_gpu_access",
    "gpu_access_setting",
    "gpu_flags",
    "missing_gpu_access_hint",
]

GPU_ACCESS_ENV = "STACKPROOF_GPU_ACCESS"
CDI_KIND_ENV = "STACKPROOF_CDI_KIND"
DEFAULT_CDI_KIND = "nvidia.com/gpu"
_MODES = ("auto", "gpus", "cdi")
_SPEC_SUFFIXES = (".yaml", ".yml", ".json")
_SPEC_LIMIT = 4 * 2**20  # a CDI spec is a few KiB; a bigger file is not one


@dataclass(frozen=True)
class GpuAccessSetting:
    """The site's word: which way (`auto` decides from the daemon) and which CDI kind."""

    mode: Literal["auto", "gpus", "cdi"] = "auto"
    cdi_kind: str = DEFAULT_CDI_KIND


@dataclass(frozen=True)
class GpuAccess:
    """The way chosen, and why (the receipt and preflight print `source`)."""

    how: Literal["gpus", "cdi"]
    cdi_kind: str
    source: str

    def describe(self) -> str:
        flag = "--gpus" if self.how == "gpus" else f"--device {self.cdi_kind}=..."
        return f"{self.how} ({flag}; {self.source})"


class GpuAccessSettingError(ValueError):
    """A site setting that names no known mode or an unusable CDI kind (the CLI's exit 2)."""


def gpu_access_setting(env: Mapping[str, str]) -> GpuAccessSetting:
    """Read the two site settings; a bad value raises `GpuAccessSettingError` naming the variable."""
    mode = env.get(GPU_ACCESS_ENV, "").strip() or "auto"
    if mode not in _MODES:
        raise GpuAccessSettingError(f"{GPU_ACCESS_ENV}={mode!r}: expected one of {', '.join(_MODES)}")
    kind = env.get(CDI_KIND_ENV, "").strip() or DEFAULT_CDI_KIND
    # CDI spec: a kind is `vendor/class` (container-device-interface SPEC.md, "kind" field).
    vendor, _, cls = kind.partition("/")
    if not vendor or not cls or "/" in cls or "=" in kind:
        raise GpuAccessSettingError(f"{CDI_KIND_ENV}={kind!r}: a CDI kind is VENDOR/CLASS, e.g. {DEFAULT_CDI_KIND}")
    return GpuAccessSetting(mode=mode, cdi_kind=kind)  # type: ignore[arg-type]


def cdi_spec_dirs(info: Mapping[str, Any]) -> tuple[str, ...]:
    """The spec directories the daemon reads: `docker info` CDISpecDirs (Docker 25+; empty when CDI
    is off or the daemon is older, which then cannot use CDI at all)."""
    return tuple(str(d) for d in info.get("CDISpecDirs") or ())


def cdi_spec_kinds(directories: Iterable[str | Path]) -> dict[str, tuple[str, ...]]:
    """Each CDI device kind the spec files in `directories` declare -> the files declaring it. A file
    that does not parse, or is not a spec, declares nothing (the daemon skips it the same way)."""
    found: dict[str, list[str]] = {}
    for directory in directories:
        try:
            entries = sorted(Path(directory).iterdir())
        except OSError:
            continue
        for path in entries:
            kind = _spec_kind(path)
            if kind:
                found.setdefault(kind, []).append(str(path))
    return {kind: tuple(paths) for kind, paths in found.items()}


def _spec_kind(path: Path) -> str | None:
    if path.suffix not in _SPEC_SUFFIXES:
        return None
    try:
        if not path.is_file() or path.stat().st_size > _SPEC_LIMIT:
            return None
        text = path.read_text(errors="replace")
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("devices"), list):
        return None
    kind = data.get("kind")
    return kind if isinstance(kind, str) else None


def choose_gpu_access(
    info: Mapping[str, Any], spec_kinds: Mapping[str, tuple[str, ...]], setting: GpuAccessSetting
) -> GpuAccess | None:
    """The way this daemon gives GPUs: the setting when it forces one, else the NVIDIA runtime first
    (what `--gpus` has always meant here), else CDI when the daemon reads a spec declaring the kind.
    None: neither (`missing_gpu_access_hint` says what to install)."""
    kind = setting.cdi_kind
    if setting.mode == "gpus":
        return GpuAccess("gpus", kind, f"{GPU_ACCESS_ENV}=gpus")
    if setting.mode == "cdi":
        return GpuAccess("cdi", kind, f"{GPU_ACCESS_ENV}=cdi")
    if "nvidia" in (info.get("Runtimes") or {}):
        return GpuAccess("gpus", kind, "docker info lists the nvidia runtime")
    if cdi_spec_dirs(info) and spec_kinds.get(kind):
        return GpuAccess("cdi", kind, f"CDI spec for {kind}: {', '.join(spec_kinds[kind])}")
    return None


def missing_gpu_access_hint(info: Mapping[str, Any], setting: GpuAccessSetting) -> str:
    """What to install when `choose_gpu_access` found nothing: said for this daemon."""
    dirs = cdi_spec_dirs(info)
    runtimes = ", ".join(sorted(info.get("Runtimes") or {})) or "none"
    cdi = (
        f"CDI is on (spec dirs {', '.join(dirs)}) but no spec there declares {setting.cdi_kind}: "
        f"write one with `nvidia-ctk cdi generate --output={dirs[0]}/nvidia.yaml`"
        if dirs
        else 'CDI is off in this daemon (Docker 25+ with `"features": {"cdi": true}` in daemon.json), '
        "then `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`"
    )
    return (
        f"docker can give this container no GPU: no nvidia runtime (runtimes: {runtimes}), and {cdi}. "
        f"Or install the NVIDIA container toolkit and `nvidia-ctk runtime configure --runtime=docker`; "
        f"{GPU_ACCESS_ENV}=gpus|cdi forces one way"
    )


def gpu_flags(access: GpuAccess | None, request: str) -> list[str]:
    """The `docker run` flags for the cell's `serve.gpus` request (`all`, `N` indices as `device=0,1`
    or `0,1`). No access chosen: `--gpus`, what the runtime always passed. CDI names one device per
    index (`nvidia-ctk cdi generate` names devices by index and `all`)."""
    if access is None or access.how == "gpus":
        return ["--gpus", request]
    names = _device_names(request)
    return [arg for name in names for arg in ("--device", f"{access.cdi_kind}={name}")]


def _device_names(request: str) -> tuple[str, ...]:
    bare = request.strip().strip('"')
    text = bare.removeprefix("device=").strip('"')
    if text == "all":
        return ("all",)
    if text == bare and text.isdigit():  # `--gpus 2` is a count (docker run reference): the first two
        return tuple(str(i) for i in range(int(text)))
    if text == "all":
        return ("all",)
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    if not names:
        raise ValueError(f"gpus {request!r}: expected `all` or device indices")
    return names
