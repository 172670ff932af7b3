"""The geometry of the host a verification ran on: what a receipt may claim, and no more.

GPU names, compute capabilities and the driver come from `nvidia-smi` (absent: `none`, a CPU
host); the CPU model and core count from /proc/cpuinfo and the scheduler (a CPU cell's tok/s means
something only beside them); the rest from the platform and the docker daemon. Two hosts with the same `key` run the
same GPUs on the same driver and architecture: `stackproof pull` compares keys and fields to say
"verified on X, you have Y".
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pipeline import cmd

__all__ = ["HostFingerprint", "cpu_model", "differences", "host_fingerprint"]


@dataclass(frozen=True, kw_only=True)
class HostFingerprint:
    arch: str  # machine architecture: x86_64, aarch64
    kernel: str
    os: str
    docker: str  # daemon version, or "none"
    gpus: tuple[dict[str, str], ...]  # {name, compute_capability, memory}; empty on a CPU host
    driver: str  # NVIDIA driver version, or "none"
    cuda_driver: str  # the highest CUDA version the driver supports, or "none"
    cpu_model: str = ""  # /proc/cpuinfo's model name; "" in receipts made before it was recorded
    cpu_cores: int = 0  # logical CPUs this host has; 0: not recorded
    # GPU 0's limits and the ptrace facts the preflight rules read (`doctor_probe.py --limits-only`:
    # shared_memory_per_sm, shared_memory_per_block_optin, sm_count, total_memory, integrated,
    # ptrace_scope, capabilities, seccomp); None in receipts made before they were recorded.
    limits: dict[str, Any] | None = None

    @property
    def gpu_summary(self) -> str:
        if not self.gpus:
            return "no GPU"
        names = sorted({f"{g['name']} (cc {g['compute_capability']})" for g in self.gpus})
        return f"{len(self.gpus)}x " + ", ".join(names)

    @property
    def key(self) -> str:
        """Stable over reboots and tool versions: GPUs, driver and architecture only."""
        basis = {
            "arch": self.arch,
            "gpus": sorted((g["name"], g["compute_capability"]) for g in self.gpus),
            "driver": self.driver,
        }
        return hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()[:16]

    def describe(self) -> str:
        driver = f", driver {self.driver}" if self.driver != "none" else ""
        return f"{self.gpu_summary}{driver} on {self.arch}"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "gpus": list(self.gpus), "key": self.key, "summary": self.describe()}

    @classmethod
    def parse(cls, data: dict[str, Any]) -> HostFingerprint:
        return cls(
            arch=str(data.get("arch", "")),
            kernel=str(data.get("kernel", "")),
            os=str(data.get("os", "")),
            docker=str(data.get("docker", "none")),
            gpus=tuple(dict(g) for g in data.get("gpus") or ()),
            driver=str(data.get("driver", "none")),
            cuda_driver=str(data.get("cuda_driver", "none")),
            cpu_model=str(data.get("cpu_model") or ""),
            cpu_cores=int(data.get("cpu_cores") or 0),
            limits=dict(data["limits"]) if isinstance(data.get("limits"), dict) else None,
        )


def host_fingerprint(docker_version: str | None = None, *, limits: bool = True) -> HostFingerprint:
    """This host: its GPUs and driver (nvidia-smi), kernel, OS, and the docker daemon's version as
    the engine reported it (`Docker.server_version`; None: no docker asked)."""
    gpus: tuple[dict[str, str], ...] = ()
    driver = cuda_driver = "none"
    if shutil.which("nvidia-smi"):
        query = cmd.run(
            ["nvidia-smi", "--query-gpu=name,compute_cap,memory.total,driver_version", "--format=csv,noheader"],
            check=False,
            quiet=True,
            timeout=30,
        )
        if query.returncode == 0:
            rows = [[f.strip() for f in line.split(",")] for line in query.stdout.splitlines() if line.strip()]
            gpus = tuple({"name": r[0], "compute_capability": r[1], "memory": r[2]} for r in rows if len(r) >= 4)
            driver = rows[0][3] if rows and len(rows[0]) >= 4 else "none"
        banner = cmd.run(["nvidia-smi"], check=False, quiet=True, timeout=30)
        if match := re.search(r"CUDA Version:\s*([\d.]+)", banner.stdout):
            cuda_driver = match.group(1)
    docker = docker_version or "none"
    return HostFingerprint(
        arch=platform.machine(),
        kernel=platform.release(),
        os=_os_name(),
        docker=docker,
        gpus=gpus,
        driver=driver,
        cuda_driver=cuda_driver,
        cpu_model=cpu_model(),
        cpu_cores=os.cpu_count() or 0,
        limits=host_limits() if limits and gpus else None,
    )


DOCTOR_PROBE = Path(__file__).resolve().parents[2] / "verify" / "probes" / "doctor_probe.py"
LIMIT_KEYS = ("name", "capability", "shared_memory_per_sm", "shared_memory_per_block_optin", "sm_count")


def host_limits(probe: Path = DOCTOR_PROBE) -> dict[str, Any] | None:
    """The doctor probe's device limits and ptrace facts for this host, flattened (GPU 0), or None
    when the probe is not there or printed nothing readable. The probe is run as a script, never
    imported: it is stdlib-only and lives beside the in-image probe."""
    if not probe.is_file():
        return None
    result = cmd.run([sys.executable, str(probe), "--limits-only"], check=False, quiet=True, timeout=120)
    try:
        document = json.loads(result.stdout)
    except ValueError:
        return None
    return flatten_limits(document)


def flatten_limits(document: dict[str, Any]) -> dict[str, Any]:
    """`{cuda_devices, security, container}` (a doctor document or `--limits-only`) -> the flat
    record a receipt keeps: GPU 0's limits, the ptrace facts, and why devices are missing."""
    cuda = document.get("cuda_devices") or {}
    security = document.get("security") or {}
    devices = cuda.get("devices") or []
    device = devices[0] if devices and isinstance(devices[0], dict) else {}
    container = document.get("container") or (document.get("host") or {}).get("container") or {}
    flat: dict[str, Any] = {key: device.get(key) for key in (*LIMIT_KEYS, "total_memory", "integrated")}
    flat.update(
        ptrace_scope=security.get("ptrace_scope"),
        yama=security.get("yama"),
        capabilities=security.get("capabilities"),
        seccomp=security.get("seccomp"),
        in_container=container.get("detected"),
        error=cuda.get("error"),
    )
    return flat


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name (`AMD EPYC 9654 96-Core Processor`) from /proc/cpuinfo's text; on
    machines without `model name` (some ARM kernels) its `Model`/`CPU part`, else the platform."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
    for key in ("model name", "Model", "Hardware", "CPU part"):
        match = re.search(rf"^{key}\s*:\s*(.+?)\s*$", cpuinfo, re.MULTILINE)
        if match:
            return " ".join(match.group(1).split())
    return platform.processor() or platform.machine()


def differences(verified: HostFingerprint, here: HostFingerprint) -> list[str]:
    """What differs between the host a receipt was made on and this one, in the terms users compare."""
    diffs = []
    if verified.arch != here.arch:
        diffs.append(f"architecture {verified.arch} vs {here.arch}")
    if verified.gpu_summary != here.gpu_summary:
        diffs.append(f"GPUs {verified.gpu_summary} vs {here.gpu_summary}")
    if verified.driver != here.driver:
        diffs.append(f"driver {verified.driver} vs {here.driver}")
    # The limits the preflight rules compare, where both sides recorded them (older receipts did not).
    for key in ("shared_memory_per_sm", "shared_memory_per_block_optin", "integrated", "ptrace_scope"):
        a, b = (verified.limits or {}).get(key), (here.limits or {}).get(key)
        if a is not None and b is not None and a != b:
            diffs.append(f"{key.replace('_', ' ')} {a} vs {b}")
    return diffs


def _os_name() -> str:
    try:
        with open("/etc/os-release", encoding="utf-8") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return platform.system()
