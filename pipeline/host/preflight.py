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

import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packaging.version import InvalidVersion, Version

from pipeline.errors import InfraError
from pipeline.host.facts import (
    CDI_DIRS,
    CDI_KIND,
    GIB,
    MACHINES,
    NVIDIA_HOOK,
    PreflightFacts,
    gather_facts,
)
from pipeline.matrix.model import Cell, Matrix
from pipeline.result import CheckResult, Status

if TYPE_CHECKING:
    from pipeline.docker.client import Docker

__all__ = [
    "PreflightFailed",
    "Requirement",
    "capability_of_arch",
    "connect",
    "enforce",
    "gather_facts",
    "judge_preflight",
    "parse_require_cuda",
    "preflight_job",
    "preflight_lines",
]


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
    if facts.gpu_access is not None:  # the way the docker runtime will use (pipeline/docker/gpuaccess.py)
        return _item("nvidia-runtime", Status.PASS, f"GPU access: {facts.gpu_access}", **evidence)
    if facts.gpu_access_missing is not None:
        return _item("nvidia-runtime", Status.FAIL, facts.gpu_access_missing, **evidence)
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
