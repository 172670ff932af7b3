"""What the preflight reads from the host and the image before judging them: the GPUs, the driver, the
container runtime, the CDI specs, the disks, and the image's CUDA requirement and platforms.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.matrix.model import ArchiveBase, BootstrapBase, Cell, CellBase, HostBase, Matrix, RegistryBase

if TYPE_CHECKING:
    from pipeline.docker.client import Docker

__all__ = ["CDI_DIRS", "DiskFact", "GpuFact", "PreflightFacts", "default_model_store", "gather_facts"]

# Where the NVIDIA Container Toolkit writes CDI specs (`nvidia-ctk cdi generate`) and docker reads them.
CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))
CDI_KIND = "nvidia.com/gpu"
# `docker --gpus` without an `nvidia` runtime entry still works when the daemon finds this hook on PATH.
NVIDIA_HOOK = "nvidia-container-runtime-hook"
MACHINES = {"x86_64": "linux/amd64", "amd64": "linux/amd64", "aarch64": "linux/arm64", "arm64": "linux/arm64"}
GIB = 1024**3


@dataclass(frozen=True, kw_only=True)
class GpuFact:
    index: int
    name: str
    capability: str | None  # "9.0"; None when the driver does not say


@dataclass(frozen=True, kw_only=True)
class DiskFact:
    """Free space where one kind of bytes goes; `needed` is the caller's number (None: not known)."""

    purpose: str  # "images" (docker's root dir) or "models" (the model store)
    path: str | None  # None: the location itself is unknown (e.g. docker not available)
    free: int | None
    needed: int | None
    device: int | None = None  # st_dev of the filesystem: two purposes on one filesystem add up
    error: str | None = None

    @property
    def what(self) -> str:
        return "the model" if self.purpose == "models" else "the image"


@dataclass(frozen=True, kw_only=True)
class PreflightFacts:
    machine: str  # platform.machine() of the host
    gpus: tuple[GpuFact, ...]
    gpu_error: str | None  # why no GPU was seen
    driver: str | None
    cuda_driver: str | None  # nvidia-smi's "CUDA Version": the newest CUDA the driver supports
    docker_error: str | None  # None: a daemon answered; else why docker is not available
    runtimes: tuple[str, ...] | None  # `docker info` Runtimes; None when unknown
    nvidia_hook: str | None  # path of nvidia-container-runtime-hook on PATH
    cdi_specs: tuple[str, ...]  # CDI spec files that name nvidia.com/gpu
    require_cuda: str | None  # the image's NVIDIA_REQUIRE_CUDA; "" = it declares none
    require_cuda_source: str  # where it came from, or "unknown: why"
    base_platforms: tuple[str, ...] | None  # None when unknown
    base_platforms_source: str
    disks: tuple[DiskFact, ...] = ()
    notes: tuple[str, ...] = field(default=())
    # For the preflight rules (pipeline/host/preflight_rules.yaml): GPU 0's limits and the ptrace facts
    # (`HostFingerprint.limits`; None: not gathered, and then no rule is judged), and the model's
    # architecture from its config.json (None: not on this machine; the source says why).
    host_limits: dict[str, Any] | None = None
    model_architecture: str | None = None
    model_architecture_source: str = ""
    model_type: str | None = None  # config.json's (text) model_type, read with the architecture
    # How this daemon gives containers GPUs (pipeline/docker/gpuaccess.py): the way found, described;
    # or, when none is, what to install. Both None: not gathered (recorded facts from before).
    gpu_access: str | None = None
    gpu_access_missing: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def parse(cls, data: dict[str, Any]) -> PreflightFacts:
        """The inverse of `to_json`: recorded facts (tests/fixtures/preflight/) replay through the judge."""

        def opt_tuple(value: Any) -> tuple[str, ...] | None:
            return None if value is None else tuple(str(v) for v in value)

        return cls(
            machine=str(data["machine"]),
            gpus=tuple(GpuFact(**g) for g in data.get("gpus") or ()),
            gpu_error=data.get("gpu_error"),
            driver=data.get("driver"),
            cuda_driver=data.get("cuda_driver"),
            docker_error=data.get("docker_error"),
            runtimes=opt_tuple(data.get("runtimes")),
            nvidia_hook=data.get("nvidia_hook"),
            cdi_specs=tuple(data.get("cdi_specs") or ()),
            require_cuda=data.get("require_cuda"),
            require_cuda_source=str(data.get("require_cuda_source", "")),
            base_platforms=opt_tuple(data.get("base_platforms")),
            base_platforms_source=str(data.get("base_platforms_source", "")),
            disks=tuple(DiskFact(**{k: v for k, v in d.items() if k in _DISK_FIELDS}) for d in data.get("disks") or ()),
            notes=tuple(data.get("notes") or ()),
            host_limits=dict(data["host_limits"]) if isinstance(data.get("host_limits"), dict) else None,
            model_architecture=data.get("model_architecture"),
            model_architecture_source=str(data.get("model_architecture_source", "")),
            model_type=data.get("model_type"),
            gpu_access=data.get("gpu_access"),
            gpu_access_missing=data.get("gpu_access_missing"),
        )


_DISK_FIELDS = {f.name for f in fields(DiskFact)}


def default_model_store() -> Path:
    """Where the model store lives (`pipeline.host.modelstore.store_dir`): the filesystem to measure."""
    from pipeline.host.modelstore import store_dir

    return store_dir()


def gather_facts(
    matrix: Matrix,
    cell: Cell,
    *,
    docker: Docker | None,
    docker_error: str | None = None,
    image_bytes: int | None = None,
    model_bytes: int | None = None,
    model_store: Path | None = None,
    cdi_dirs: Sequence[Path] = CDI_DIRS,
    rules: bool = True,
) -> PreflightFacts:
    """Everything the judge needs, read from this host. `engine` None: docker is not available,
    `docker_error` says why. `image_bytes` / `model_bytes` are what the caller will write (None:
    not known); the model store is measured only for a cell whose model is downloaded (`hf:`).
    `rules`: gather the facts the preflight rules read (device limits, the model's architecture)."""
    from pipeline.host.geometry import host_fingerprint
    from pipeline.host.rules import cell_facts

    host = host_fingerprint(None, limits=rules)  # nvidia-smi only; docker is asked below, once
    model = cell_facts(cell, model_store=model_store) if rules else None
    architecture, architecture_source = (model.architecture, model.architecture_source) if model else (None, "")
    gpus = tuple(
        GpuFact(index=i, name=g.get("name", ""), capability=g.get("compute_capability") or None)
        for i, g in enumerate(host.gpus)
    )
    gpu_error = None
    if not gpus:
        gpu_error = (
            "nvidia-smi: not found on PATH" if shutil.which("nvidia-smi") is None else "nvidia-smi listed no GPU"
        )
    info: dict[str, Any] | None = None
    if docker is not None:
        info, docker_error = _docker_info(docker)
    runtimes = tuple(sorted((info.get("Runtimes") or {}).keys())) if info is not None else None
    access, access_missing = _gpu_access(info)
    require, require_source, platforms, platforms_source = _image_facts(matrix, cell, docker)
    disks = [_images_disk(info, docker_error, image_bytes)]
    if cell.serve is not None and cell.serve.model.kind == "hf":
        disks.append(_measure("models", model_store or default_model_store(), model_bytes))
    return PreflightFacts(
        machine=platform.machine(),
        gpus=gpus,
        gpu_error=gpu_error,
        driver=None if host.driver == "none" else host.driver,
        cuda_driver=None if host.cuda_driver == "none" else host.cuda_driver,
        docker_error=docker_error,
        runtimes=runtimes,
        nvidia_hook=shutil.which(NVIDIA_HOOK),  # our PATH, standing in for the daemon's (same host)
        cdi_specs=_cdi_specs(cdi_dirs),
        require_cuda=require,
        require_cuda_source=require_source,
        base_platforms=platforms,
        base_platforms_source=platforms_source,
        disks=tuple(disks),
        host_limits=host.limits if rules else None,
        model_architecture=architecture,
        gpu_access=access,
        gpu_access_missing=access_missing,
        model_architecture_source=architecture_source,
        model_type=model.model_type if model else None,
    )


def _gpu_access(info: dict[str, Any] | None) -> tuple[str | None, str | None]:
    """The GPU access the docker runtime will choose (the same rule, pipeline/docker/gpuaccess.py),
    or what to install; (None, None) without a daemon or with a bad site setting (the run says it)."""
    from pipeline.docker.gpuaccess import (
        GpuAccessSettingError,
        cdi_spec_dirs,
        cdi_spec_kinds,
        choose_gpu_access,
        gpu_access_setting,
        missing_gpu_access_hint,
    )

    if info is None:
        return None, None
    try:
        setting = gpu_access_setting(os.environ)
    except GpuAccessSettingError:
        return None, None
    chosen = choose_gpu_access(info, cdi_spec_kinds(cdi_spec_dirs(info)), setting)
    return (chosen.describe(), None) if chosen else (None, missing_gpu_access_hint(info, setting))


def _docker_info(docker: Docker) -> tuple[dict[str, Any] | None, str | None]:
    info = docker.info()
    if isinstance(info, str):
        return None, f"`docker info` printed no JSON object: {info[-300:]}"
    return info, None


def _image_facts(
    matrix: Matrix, cell: Cell, docker: Docker | None
) -> tuple[str | None, str, tuple[str, ...] | None, str]:
    """The image's NVIDIA_REQUIRE_CUDA and the base's platforms, with where each came from.

    A cell's own env wins (it is the image's last word); then the root registry base as docker
    has it locally; then what matrix.yaml declares for that base; else unknown."""
    chain = [cell]
    base = cell.base
    while isinstance(base, CellBase):  # a cell built on another cell's image: follow to the root
        parent = matrix.cell(base.cell)
        chain.append(parent)
        base = parent.base
    platforms: tuple[str, ...] | None = None
    platforms_source = ""
    if isinstance(cell.base, CellBase):
        parent_cell = matrix.cell(cell.base.cell)
        platforms, platforms_source = (parent_cell.platform,), f"the base is cell {parent_cell.id}'s image"
    require: str | None = None
    require_source = ""
    for c in chain:  # the nearest cell's env decides, as image env does in a Dockerfile chain
        if "NVIDIA_REQUIRE_CUDA" in dict(c.env):
            require, require_source = dict(c.env)["NVIDIA_REQUIRE_CUDA"], f"cell {c.id}'s env"
            break
    if isinstance(base, HostBase):
        return require, require_source or "a host environment: no image", None, "a host environment: no base image"
    if isinstance(base, BootstrapBase):
        machine = MACHINES.get(platform.machine(), f"linux/{platform.machine()}")
        if platforms is None:
            platforms, platforms_source = (machine,), f"base {base.name} is bootstrapped on this host"
        if require is None:
            require, require_source = "", f"base {base.name} is bootstrapped: no NVIDIA_REQUIRE_CUDA"
        return require, require_source, platforms, platforms_source
    if isinstance(base, ArchiveBase):
        if require is None:  # an archive's own config is read only once it is loaded; a rootfs has none
            require, require_source = "", f"base {base.name} is a local archive: no NVIDIA_REQUIRE_CUDA declared"
        if platforms is None:
            platforms_source = f"unknown: base {base.name} is a local archive (its platform is read when loaded)"
        return require, require_source, platforms, platforms_source
    assert isinstance(base, RegistryBase)
    local = _inspect(docker, base.reference) if docker is not None else None
    if require is None and local is not None:
        env = dict(e.split("=", 1) for e in (local.get("Config") or {}).get("Env") or () if "=" in e)
        require, require_source = env.get("NVIDIA_REQUIRE_CUDA", ""), f"image {base.reference} (local) config"
    if require is None and base.require_cuda is not None:
        require, require_source = base.require_cuda, f"base {base.name} declares it in {matrix.file.name}"
    if require is None:
        why = "docker not available" if docker is None else f"image {base.reference} is not local"
        require_source = f"unknown: {why} and base {base.name} declares no require_cuda"
    if platforms is None and base.platforms:
        platforms, platforms_source = base.platforms, f"base {base.name} declares them in {matrix.file.name}"
    if platforms is None and local is not None and local.get("Architecture"):
        # A local image is one platform of a possibly multi-platform tag: enough to say yes, not no.
        here = f"{local.get('Os', 'linux')}/{local['Architecture']}"
        if here == cell.platform:
            platforms, platforms_source = (here,), f"image {base.reference} (local) is {here}"
    if platforms is None:
        why = "docker not available" if docker is None else f"image {base.reference} is not local for it"
        platforms_source = f"unknown: {why} and base {base.name} declares no platforms"
    return require, require_source, platforms, platforms_source


def _inspect(docker: Docker, ref: str) -> dict[str, Any] | None:
    try:
        return docker.image_config(ref)
    except ValueError:  # not JSON: nothing to learn from it
        return None


def _cdi_specs(directories: Sequence[Path]) -> tuple[str, ...]:
    """CDI spec files (yaml or json) whose `kind` is nvidia.com/gpu; read as text, no yaml parse
    needed for one key."""
    found = []
    for directory in directories:
        try:
            entries = sorted(directory.iterdir())
        except OSError:
            continue
        for path in entries:
            if path.suffix not in (".yaml", ".yml", ".json"):
                continue
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            if re.search(r'["\']?kind["\']?\s*:\s*["\']?' + re.escape(CDI_KIND), text):
                found.append(str(path))
    return tuple(found)


def _images_disk(info: dict[str, Any] | None, docker_error: str | None, needed: int | None) -> DiskFact:
    if info is None:
        return DiskFact(
            purpose="images", path=None, free=None, needed=needed, error=f"docker not available: {docker_error}"
        )
    root = info.get("DockerRootDir")
    if not root:
        return DiskFact(purpose="images", path=None, free=None, needed=needed, error="docker info has no DockerRootDir")
    return _measure("images", Path(root), needed)


def _measure(purpose: str, path: Path, needed: int | None) -> DiskFact:
    """Free bytes on the filesystem that holds `path` (its nearest existing parent: the store may
    not exist yet)."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        st = os.statvfs(probe)
        device = os.stat(probe).st_dev
    except OSError as exc:
        return DiskFact(purpose=purpose, path=str(path), free=None, needed=needed, error=f"{probe}: {exc.strerror}")
    return DiskFact(
        purpose=purpose,
        path=str(path),
        free=st.f_bavail * st.f_frsize,
        needed=needed,
        device=device,
    )
