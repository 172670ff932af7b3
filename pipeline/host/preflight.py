"""Preflight of a GPU cell: can this host run the cell's image at all, before anything is built or pulled?

Five questions, each answered as an item (PASS / FAIL / WARN / SKIP) that says what to fix:
the host has an NVIDIA GPU (`gpu`); its compute capability is the cell's arch
(`compute-capability`); the driver's CUDA version meets the image's `NVIDIA_REQUIRE_CUDA`
(`driver-cuda`: the NVIDIA Container Toolkit refuses to start the container otherwise); the host
and the base have the cell's platform (`host-platform`, `base-platform`); docker knows the NVIDIA
runtime (`nvidia-runtime`: a runtime entry, a CDI spec naming nvidia.com/gpu, or the hook that
`docker --gpus` calls); and there is disk for the image and the model (`disk-images`, `disk-models`).

Facts are gathered once at the edge (`gather_facts`: nvidia-smi through `pipeline.host.geometry`,
`docker info` and `docker image inspect` through `pipeline.docker.client`, statvfs, CDI spec files) into a
frozen `PreflightFacts`; `judge_preflight(cell, facts)` is pure. What cannot be determined is a
WARN saying "unknown: ...", never a silent PASS. The host items need no docker: on a host without
docker they are still judged, and the docker items say "docker not available: ..." (a FAIL only
where docker is needed anyway, `docker_required=True`: build, run, verify, pull).
`PreflightFailed` (exit 3) lists every failing item at once.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packaging.version import InvalidVersion, Version

from pipeline.errors import InfraError
from pipeline.matrix.model import BootstrapBase, Cell, CellBase, HostBase, Matrix, RegistryBase
from pipeline.result import CheckResult, Status

if TYPE_CHECKING:
    from pipeline.docker.client import Docker

__all__ = [
    "CDI_DIRS",
    "DiskFact",
    "GpuFact",
    "PreflightFacts",
    "PreflightFailed",
    "Requirement",
    "capability_of_arch",
    "connect",
    "default_model_store",
    "enforce",
    "gather_facts",
    "judge_preflight",
    "parse_require_cuda",
    "preflight_job",
    "preflight_lines",
]

# Where the NVIDIA Container Toolkit writes CDI specs (`nvidia-ctk cdi generate`) and docker reads them.
CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))
CDI_KIND = "nvidia.com/gpu"
# `docker --gpus` without an `nvidia` runtime entry still works when the daemon finds this hook on PATH.
NVIDIA_HOOK = "nvidia-container-runtime-hook"
MACHINES = {"x86_64": "linux/amd64", "amd64": "linux/amd64", "aarch64": "linux/arm64", "arm64": "linux/arm64"}
GIB = 1024**3

_TOOLKIT_FIX = (
    "install the NVIDIA Container Toolkit and run `nvidia-ctk runtime configure --runtime=docker`, then restart "
    "dockerd; or write a CDI spec with `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`"
)


# -- the entry for commands that use docker next ----------------------------------------------------


def preflight_job(
    matrix: Matrix,
    cell: Cell,
    *,
    tag: str | None,
    model_bytes: int | None = None,
    model_store: Path | None = None,
) -> Docker:
    """Preflight before `build`, `run`, `verify` or `pull` of a GPU cell; returns the connected engine.

    Docker is asked only after the host facts are in, so a host without docker still hears about its
    GPU; docker not being available is then one more FAIL among the others. `tag` is the cell's
    content tag: when it is built already the image needs no more disk. `model_bytes` is the size of
    the model the job will download (None: not known, a WARN)."""
    docker, why = connect()
    image_bytes = None
    if docker is not None and tag is not None and docker.image(tag) is not None:
        image_bytes = 0
    facts = gather_facts(
        matrix,
        cell,
        docker=docker,
        docker_error=why,
        image_bytes=image_bytes,
        model_bytes=model_bytes,
        model_store=model_store,
    )
    items = judge_preflight(cell, facts, docker_required=True)
    for line in preflight_lines(items):
        print(line, file=sys.stderr)
    enforce(cell, items)
    if docker is None:  # only for a cell without items (a CPU cell): say what docker lacks
        raise InfraError(why or "docker not available")
    return docker


def preflight_host(matrix: Matrix, cell: Cell) -> None:
    """Preflight before `verify --runtime host` of a GPU cell: the host items only (GPU present, its
    compute capability, the platform). No docker is asked: the servers run as host processes, so
    the NVIDIA runtime, the base's platforms and docker's disk are not this job's."""
    facts = gather_facts(matrix, cell, docker=None, docker_error="docker not used: the host runtime")
    items = judge_host_preflight(cell, facts)
    for line in preflight_lines(items):
        print(line, file=sys.stderr)
    enforce(cell, items)


def connect() -> tuple[Docker | None, str | None]:
    """The engine, or None and why docker is not available (its first line: what to install or start)."""
    from pipeline.docker.client import Docker

    try:
        return Docker.connect(), None
    except InfraError as exc:
        return None, str(exc).strip().splitlines()[0]


# -- facts ------------------------------------------------------------------------------------------


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
        model_architecture_source=architecture_source,
        model_type=model.model_type if model else None,
    )


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


# -- NVIDIA_REQUIRE_CUDA ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Requirement:
    """One space-separated alternative of NVIDIA_REQUIRE_CUDA: its comma-separated constraints, all
    of which must hold (the toolkit ORs alternatives and ANDs the constraints within one)."""

    text: str
    constraints: tuple[tuple[str, str, str], ...]  # (key, operator, value): ("cuda", ">=", "13.0")


_CONSTRAINT = re.compile(r"^([a-z]+)\s*(>=|<=|==|!=|=|>|<)\s*(\S+)$")


def parse_require_cuda(text: str) -> tuple[Requirement, ...]:
    """`cuda>=13.0 brand=tesla,driver>=535,driver<536 ...` -> its alternatives. An unreadable
    constraint is kept with operator "?" so the judge can say it could not read it."""
    alternatives = []
    for chunk in text.split():
        constraints: list[tuple[str, str, str]] = []
        for part in chunk.split(","):
            match = _CONSTRAINT.match(part.strip())
            constraints.append((match[1], match[2], match[3]) if match else (part.strip(), "?", ""))
        alternatives.append(Requirement(text=chunk, constraints=tuple(constraints)))
    return tuple(alternatives)


def _compare(have: str, op: str, want: str) -> bool | None:
    """`have op want` as versions; None when either is not a version."""
    try:
        a, b = Version(have), Version(want)
    except InvalidVersion:
        return None
    return {
        ">=": a >= b,
        "<=": a <= b,
        ">": a > b,
        "<": a < b,
        "==": a == b,
        "=": a == b,
        "!=": a != b,
    }[op]


def _holds(alt: Requirement, *, cuda: str, driver: str | None) -> bool | None:
    """Whether one alternative holds on this driver; None when it names what the host facts lack
    (a brand, an unreadable constraint)."""
    verdict: bool | None = True
    for key, op, value in alt.constraints:
        have = {"cuda": cuda, "driver": driver}.get(key)
        result = _compare(have, op, value) if have is not None and op != "?" else None
        if result is False:
            return False
        if result is None:
            verdict = None
    return verdict


# -- the judge --------------------------------------------------------------------------------------


def capability_of_arch(arch: str) -> str | None:
    """`sm120` -> `12.0`, `sm90` -> `9.0`, `sm103` -> `10.3`: the inverse of `arch_of_gpu`."""
    match = re.fullmatch(r"sm(\d+)(\d)", arch)
    return f"{match.group(1)}.{match.group(2)}" if match else None


def judge_preflight(cell: Cell, facts: PreflightFacts, *, docker_required: bool = True) -> list[CheckResult]:
    """Every item, in order; pure. A CPU cell needs none (an empty list).

    `docker_required`: the caller will use docker next (build, run, verify, pull), so docker not
    being available is a FAIL; `doctor` passes False and gets a WARN instead."""
    if not cell.is_gpu:
        return []
    return [
        _gpu(facts),
        _capability(cell, facts),
        _driver_cuda(facts),
        _host_platform(cell, facts),
        _base_platform(cell, facts),
        _runtime(facts, docker_required),
        *_disks(facts, docker_required),
        *_rules(cell, facts),
    ]


def judge_host_preflight(cell: Cell, facts: PreflightFacts) -> list[CheckResult]:
    """The items of `judge_preflight` that hold for a server run as a host process; pure."""
    if not cell.is_gpu:
        return []
    return [_gpu(facts), _capability(cell, facts), _host_platform(cell, facts), *_rules(cell, facts)]


def _rules(cell: Cell, facts: PreflightFacts) -> list[CheckResult]:
    """The preflight rules' items (pipeline/host/preflight_rules.yaml), where the host's limits were gathered."""
    from pipeline.host.rules import HostLimits, cell_facts, judge_rules, load_rules

    if facts.host_limits is None:
        return []
    architecture = (facts.model_architecture, facts.model_architecture_source)
    return judge_rules(
        load_rules(),
        cell_facts(cell, architecture=architecture, model_type=facts.model_type),
        HostLimits.from_record(facts.host_limits),
    )


def _item(name: str, status: Status, message: str, **evidence: Any) -> CheckResult:
    return CheckResult(name=name, status=status, message=message, evidence=evidence)


def _gpu(facts: PreflightFacts) -> CheckResult:
    if facts.gpus:
        names = ", ".join(sorted({g.name for g in facts.gpus}))
        return _item("gpu", Status.PASS, f"{len(facts.gpus)} x {names}, driver {facts.driver}", driver=facts.driver)
    return _item(
        "gpu",
        Status.FAIL,
        f"no NVIDIA GPU seen ({facts.gpu_error}): install the NVIDIA driver (nvidia-smi must list the GPU), "
        "or run this cell on a GPU runner",
        error=facts.gpu_error,
    )


def _capability(cell: Cell, facts: PreflightFacts) -> CheckResult:
    from pipeline.repro import arch_of_gpu  # the one GPU -> arch mapping (doctor, repro)

    want = capability_of_arch(cell.arch)
    if not facts.gpus:
        return _item("compute-capability", Status.SKIP, "no GPU to compare", arch=cell.arch)
    seen = [{"index": g.index, "name": g.name, "capability": g.capability} for g in facts.gpus]
    unknown = [g for g in facts.gpus if not g.capability]
    wrong = [g for g in facts.gpus if g.capability and arch_of_gpu(g.name, g.capability) != cell.arch]
    if wrong:
        found = ", ".join(f"GPU {g.index} {g.name} has compute capability {g.capability}" for g in wrong)
        return _item(
            "compute-capability",
            Status.FAIL,
            f"{found}; the cell {cell.id} is {cell.arch} (compute capability {want}): run it on an {cell.arch} "
            f"host (runner labels {', '.join(cell.runner)}), or pick a cell for this GPU",
            arch=cell.arch,
            want=want,
            gpus=seen,
        )
    if unknown:
        return _item(
            "compute-capability",
            Status.WARN,
            f"unknown: the driver does not report the compute capability of {len(unknown)} GPU(s) "
            f"(nvidia-smi before 510): check that they are {cell.arch} ({want}), or upgrade the driver",
            arch=cell.arch,
            want=want,
            gpus=seen,
        )
    return _item(
        "compute-capability", Status.PASS, f"compute capability {want} = {cell.arch}", arch=cell.arch, gpus=seen
    )


def _driver_cuda(facts: PreflightFacts) -> CheckResult:
    name = "driver-cuda"
    evidence = {
        "require_cuda": facts.require_cuda,
        "source": facts.require_cuda_source,
        "cuda_driver": facts.cuda_driver,
        "driver": facts.driver,
    }
    if not facts.gpus:
        return _item(name, Status.SKIP, "no GPU driver to compare", **evidence)
    if facts.require_cuda is None:
        return _item(
            name,
            Status.WARN,
            f"{facts.require_cuda_source}: declare `require_cuda` on the base (its NVIDIA_REQUIRE_CUDA) or pull "
            f"the base, so the driver's CUDA {facts.cuda_driver or '?'} can be compared",
            **evidence,
        )
    alternatives = parse_require_cuda(facts.require_cuda)
    if not alternatives:
        return _item(
            name, Status.PASS, f"the image declares no NVIDIA_REQUIRE_CUDA ({facts.require_cuda_source})", **evidence
        )
    if facts.cuda_driver is None:
        return _item(
            name,
            Status.WARN,
            f"unknown: nvidia-smi does not say which CUDA the driver supports; the image needs {facts.require_cuda}",
            **evidence,
        )
    verdicts = [(alt, _holds(alt, cuda=facts.cuda_driver, driver=facts.driver)) for alt in alternatives]
    held = next((alt for alt, v in verdicts if v is True), None)
    if held is not None:
        return _item(
            name, Status.PASS, f"the driver supports CUDA {facts.cuda_driver}; the image needs {held.text}", **evidence
        )
    cuda_wants = [f"cuda{op}{value}" for alt in alternatives for key, op, value in alt.constraints if key == "cuda"]
    want = " or ".join(cuda_wants) or facts.require_cuda
    maybe = [alt.text for alt, v in verdicts if v is None]
    if maybe:
        return _item(
            name,
            Status.WARN,
            f"unknown: the driver supports CUDA {facts.cuda_driver}, below {want}; it may match "
            f"{', '.join(maybe)} (a GPU brand with CUDA forward compatibility), which this host's facts cannot "
            f"tell: upgrade the driver to one that supports {want} to be sure",
            **evidence,
        )
    major = re.match(r"cuda>=?(\d+)", cuda_wants[0]) if cuda_wants else None
    target = f"a CUDA {major.group(1)} one" if major else f"one that supports {want}"
    return _item(
        name,
        Status.FAIL,
        f"the driver {facts.driver} supports CUDA {facts.cuda_driver}; the image needs {want}: "
        f"upgrade the driver to {target}",
        **evidence,
    )


def _host_platform(cell: Cell, facts: PreflightFacts) -> CheckResult:
    here = MACHINES.get(facts.machine, f"linux/{facts.machine}")
    if here == cell.platform:
        return _item("host-platform", Status.PASS, f"this host is {here}", machine=facts.machine)
    return _item(
        "host-platform",
        Status.FAIL,
        f"this host is {here}; the cell is {cell.platform}: run it on a {cell.platform} host "
        f"(runner labels {', '.join(cell.runner)})",
        machine=facts.machine,
        platform=cell.platform,
    )


def _base_platform(cell: Cell, facts: PreflightFacts) -> CheckResult:
    evidence = {"platforms": facts.base_platforms, "source": facts.base_platforms_source}
    if facts.base_platforms is None:
        return _item(
            "base-platform",
            Status.WARN,
            f"{facts.base_platforms_source}: declare `platforms` on the base, or pull it, to know it has "
            f"{cell.platform}",
            **evidence,
        )
    if cell.platform in facts.base_platforms:
        return _item(
            "base-platform", Status.PASS, f"the base has {cell.platform} ({facts.base_platforms_source})", **evidence
        )
    return _item(
        "base-platform",
        Status.FAIL,
        f"the base has {', '.join(facts.base_platforms) or 'no platform'} ({facts.base_platforms_source}), not the "
        f"cell's {cell.platform}: pick a base built for {cell.platform}, or change the cell's platform",
        **evidence,
    )


def _runtime(facts: PreflightFacts, docker_required: bool) -> CheckResult:
    evidence = {"runtimes": facts.runtimes, "cdi_specs": list(facts.cdi_specs), "hook": facts.nvidia_hook}
    if facts.docker_error is not None or facts.runtimes is None:
        status = Status.FAIL if docker_required else Status.WARN
        return _item(
            "nvidia-runtime",
            status,
            f"docker not available: {facts.docker_error or 'docker info has no runtimes'}; once it is, docker "
            f"must know the NVIDIA runtime: {_TOOLKIT_FIX}",
            **evidence,
        )
    if "nvidia" in facts.runtimes:
        return _item("nvidia-runtime", Status.PASS, "docker has the nvidia runtime", **evidence)
    if facts.cdi_specs:
        return _item(
            "nvidia-runtime", Status.PASS, f"CDI spec for {CDI_KIND}: {', '.join(facts.cdi_specs)}", **evidence
        )
    if facts.nvidia_hook:
        return _item(
            "nvidia-runtime", Status.PASS, f"{facts.nvidia_hook} is on PATH (docker --gpus calls it)", **evidence
        )
    return _item(
        "nvidia-runtime",
        Status.FAIL,
        f"docker knows no NVIDIA runtime (runtimes: {', '.join(facts.runtimes) or 'none'}; no CDI spec for "
        f"{CDI_KIND} under {', '.join(str(d) for d in CDI_DIRS)}; no {NVIDIA_HOOK} on PATH): {_TOOLKIT_FIX}",
        **evidence,
    )


def _disks(facts: PreflightFacts, docker_required: bool) -> list[CheckResult]:
    # Purposes on one filesystem share its free bytes: judge their sum against it.
    by_device: dict[int, int] = {}
    for d in facts.disks:
        if d.device is not None and d.needed is not None:
            by_device[d.device] = by_device.get(d.device, 0) + d.needed
    items = []
    for d in facts.disks:
        name = f"disk-{d.purpose}"
        evidence = asdict(d)
        if d.free is None:
            docker_down = d.error is not None and d.error.startswith("docker not available")
            status = Status.FAIL if docker_down and docker_required else Status.WARN
            prefix = "" if docker_down else "unknown: "
            items.append(
                _item(name, status, f"{prefix}{d.error}: cannot measure free space for {d.purpose}", **evidence)
            )
            continue
        if d.needed is None:
            items.append(
                _item(
                    name,
                    Status.WARN,
                    f"unknown: the size of {d.what}; {_gib(d.free)} free at {d.path}",
                    **evidence,
                )
            )
            continue
        total = by_device.get(d.device, d.needed) if d.device is not None else d.needed
        shared = f" (with the other downloads on this filesystem: {_gib(total)})" if total != d.needed else ""
        if total > d.free:
            items.append(
                _item(
                    name,
                    Status.FAIL,
                    f"{_gib(d.free)} free at {d.path}; {d.what} needs {_gib(d.needed)}{shared}: free "
                    f"{_gib(total - d.free)} there, or move it ({_move_hint(d.purpose)})",
                    **evidence,
                )
            )
        else:
            items.append(_item(name, Status.PASS, f"{_gib(d.free)} free at {d.path}; needs {_gib(total)}", **evidence))
    return items


def _move_hint(purpose: str) -> str:
    return "STACKPROOF_MODEL_STORE" if purpose == "models" else "dockerd's data-root"


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


# -- enforcing and printing -------------------------------------------------------------------------


class PreflightFailed(InfraError):
    """The host cannot run the cell: every failing item, each saying what to fix (exit 3)."""

    def __init__(self, cell: str, items: Iterable[CheckResult]) -> None:
        self.cell = cell
        self.items = tuple(items)
        failing = [i for i in self.items if i.status is Status.FAIL]
        lines = [f"preflight of {cell}: {len(failing)} item(s) failed; nothing was built, pulled or run"]
        lines += [f"  {i.name}: {i.message}" for i in failing]
        lines.append("  (`--no-preflight` skips these checks, for those who know better)")
        super().__init__("\n".join(lines))


def enforce(cell: Cell, items: Sequence[CheckResult]) -> None:
    """Raise `PreflightFailed` when any item failed; WARNs are printed by the caller, not fatal."""
    if any(i.status is Status.FAIL for i in items):
        raise PreflightFailed(cell.id, items)


def preflight_lines(items: Sequence[CheckResult]) -> list[str]:
    return [f"preflight {i.status:<5} {i.name}: {i.message}" for i in items]
