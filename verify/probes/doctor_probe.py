"""stackproof's host fingerprint: GPUs, driver, CUDA, cuDNN and the Python stack. Stdlib only.

Runs anywhere a bug reporter can run Python, with nothing installed:

    python3 doctor_probe.py [--modules torch?,flashinfer?,vllm?] [--no-imports] [--gpu-source auto|nvidia-smi|nvml]
    python3 doctor_probe.py --limits-only    # only `cuda_devices`, `security` and `container`

It needs `inimage_probe.py` beside it (both live in stackproof's `verify/`): that probe collects the
installed distributions, import outcomes, what torch sees and the relevant env vars, and this
script adds what is not in a Python environment: the GPUs and their compute capability (nvidia-smi,
else NVML through ctypes), the driver and the CUDA version it supports, `nvcc`, the host's cuDNN
libraries, the OS and kernel, whether this is a container, and more env vars. `cuda_devices`: each
device's limits from the CUDA driver API (libcuda through ctypes: shared memory per SM, the
per-block opt-in limit, SM count, total memory, integrated), with torch's view beside them where
torch is installed; `security`: Yama's ptrace scope and this process's capabilities and seccomp
mode (a container's, inside one). The preflight rules (pipeline/host/preflight_rules.yaml) read both. Values of env vars
whose names (or values) look secret are redacted.

Prints one JSON document (doctor_schema 1) on stdout and exits 0 even when a part could not be
collected: that part then carries an `error`. `stackproof doctor` runs this on the host or in a
`--network none` container of a cell's image; `stackproof repro` turns its output into a cell.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

DOCTOR_SCHEMA = 1
HERE = Path(__file__).resolve().parent
INIMAGE_PROBE = HERE / "inimage_probe.py"
DEFAULT_MODULES = "torch?,flashinfer?,vllm?"
# Beyond the in-image probe's FLASHINFER_/VLLM_/CUDA_/NCCL_/TORCH_: what else shapes a GPU stack.
EXTRA_ENV_PREFIXES = ("CUDNN_", "NVIDIA_", "PYTORCH_", "TRITON_", "HF_", "OMP_")
EXTRA_ENV_NAMES = ("LD_LIBRARY_PATH", "LD_PRELOAD")
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|CREDENTIAL|AUTH", re.IGNORECASE)
SECRET_VALUE = re.compile(r"\bhf_[A-Za-z0-9]{20,}|\bgh[pousr]_[A-Za-z0-9]{20,}|\bsk-[A-Za-z0-9_-]{20,}")
UTC = datetime.timezone.utc  # noqa: UP017 (datetime.UTC is 3.11+; reporters may run Python 3.10)
SMI_FIELDS = ("index", "name", "compute_cap", "driver_version", "memory.total", "pci.bus_id")


def main() -> int:
    parser = argparse.ArgumentParser(description="stackproof host fingerprint (stdlib only)")
    parser.add_argument("--modules", default=DEFAULT_MODULES, help="modules the probe imports (`?` = if installed)")
    parser.add_argument("--no-imports", action="store_true", help="list distributions only; import nothing")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds allowed for each import")
    parser.add_argument("--gpu-source", choices=("auto", "nvidia-smi", "nvml"), default="auto")
    parser.add_argument("--limits-only", action="store_true", help="device limits and ptrace facts only (fast)")
    args = parser.parse_args()
    if args.limits_only:
        limits = {"cuda_devices": cuda_device_facts(), "security": security_facts(), "container": _container()}
        json.dump(limits, sys.stdout, indent=1, sort_keys=True)
        sys.stdout.write("\n")
        return 0
    document = collect(modules="" if args.no_imports else args.modules, timeout=args.timeout, gpu=args.gpu_source)
    json.dump(document, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


def collect(*, modules: str, timeout: float, gpu: str) -> dict[str, Any]:
    probe, probe_error = run_inimage_probe(modules, timeout)
    return {
        "doctor_schema": DOCTOR_SCHEMA,
        "generated_at": datetime.datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": host_facts(),
        "gpu": gpu_facts(gpu),
        "cuda_devices": cuda_device_facts(),
        "security": security_facts(),
        "nvcc": nvcc_facts(),
        "cudnn_host": cudnn_host_facts(),
        "env_extra": extra_environment(),
        "probe": probe,
        "probe_error": probe_error,
    }


# -- the Python stack: the in-image probe, run as it is run everywhere else ----------------------


def run_inimage_probe(modules: str, timeout: float) -> tuple[dict[str, Any] | None, str | None]:
    if not INIMAGE_PROBE.is_file():
        return None, f"{INIMAGE_PROBE} is missing: put inimage_probe.py (stackproof verify/) beside this script"
    argv = [sys.executable, str(INIMAGE_PROBE), "--modules", modules, "--timeout", str(timeout)]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout * 3 + 60)
    except subprocess.TimeoutExpired:
        return None, f"the in-image probe did not finish in {timeout * 3 + 60:.0f}s"
    try:
        return dict(json.loads(proc.stdout)), None
    except ValueError:
        tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
        return None, f"the in-image probe printed no JSON (exit code {proc.returncode}): {tail}"


# -- the machine ------------------------------------------------------------------------------------


def host_facts() -> dict[str, Any]:
    libc, libc_version = platform.libc_ver()
    return {
        "os": _os_release(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "libc": f"{libc} {libc_version}".strip() or None,
        "container": _container(),
        "cpu_model": _cpu_model(),
        "cpu_cores": os.cpu_count(),
    }


def _cpu_model() -> str | None:
    """/proc/cpuinfo's model name: a CPU host's tok/s compares only beside it."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model") and value.strip():
                    return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or None


def _os_release() -> str | None:
    for path in ("/etc/os-release", "/usr/lib/os-release"):
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        match = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', text, re.MULTILINE)
        if match:
            return match.group(1)
    return None


def _container() -> dict[str, Any]:
    """Whether this runs in a container, and what says so (the kernel is then the host's)."""
    for marker in ("/.dockerenv", "/run/.containerenv"):
        if os.path.exists(marker):
            return {"detected": True, "evidence": marker}
    try:
        cgroup = Path("/proc/1/cgroup").read_text()
    except OSError:
        cgroup = ""
    match = re.search(r"docker|containerd|kubepods|libpod|lxc", cgroup)
    if match:
        return {"detected": True, "evidence": f"/proc/1/cgroup mentions {match.group(0)}"}
    return {"detected": False, "evidence": None}


# -- GPUs: nvidia-smi first, NVML through ctypes when it is missing ------------------------------


def gpu_facts(source: str) -> dict[str, Any]:
    errors = []
    if source in ("auto", "nvidia-smi"):
        facts = _from_nvidia_smi()
        if "error" not in facts or source == "nvidia-smi":
            return facts
        errors.append(facts["error"])
    facts = _from_nvml()
    if "error" in facts and errors:
        facts["error"] = "; ".join([*errors, facts["error"]])
    return facts


def _from_nvidia_smi() -> dict[str, Any]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {"source": "nvidia-smi", "error": "nvidia-smi: not found on PATH", "devices": []}
    fields = list(SMI_FIELDS)
    out, err = _run([smi, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"])
    if out is None and "compute_cap" in (err or ""):  # drivers before 510 do not know the field
        fields.remove("compute_cap")
        out, err = _run([smi, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"])
    if out is None:
        return {"source": "nvidia-smi", "error": f"nvidia-smi failed: {err}", "devices": []}
    devices: list[dict[str, Any]] = []
    driver = None
    for line in out.strip().splitlines():
        row = dict(zip(fields, (cell.strip() for cell in line.split(",")), strict=False))
        driver = row.get("driver_version") or driver
        devices.append(
            {
                "index": int(row["index"]) if row.get("index", "").isdigit() else len(devices),
                "name": row.get("name", ""),
                "capability": row.get("compute_cap") or None,
                "memory_mib": int(row["memory.total"]) if row.get("memory.total", "").isdigit() else None,
                "pci_bus_id": row.get("pci.bus_id") or None,
            }
        )
    header, _ = _run([smi])
    match = re.search(r"CUDA Version:\s*([\d.]+)", header or "")
    return {
        "source": "nvidia-smi",
        "driver": driver,
        "cuda_driver": match.group(1) if match else None,
        "devices": devices,
    }


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def _from_nvml() -> dict[str, Any]:
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as exc:
        return {"source": "nvml", "error": f"libnvidia-ml.so.1: {exc}", "devices": []}
    if nvml.nvmlInit_v2() != 0:
        return {"source": "nvml", "error": "nvmlInit_v2 failed (no driver or no device)", "devices": []}
    try:
        text = ctypes.create_string_buffer(96)
        driver = text.value.decode() if nvml.nvmlSystemGetDriverVersion(text, 96) == 0 else None
        cuda = ctypes.c_int()
        cuda_driver = None
        if nvml.nvmlSystemGetCudaDriverVersion_v2(ctypes.byref(cuda)) == 0:
            cuda_driver = f"{cuda.value // 1000}.{cuda.value % 1000 // 10}"
        count = ctypes.c_uint()
        nvml.nvmlDeviceGetCount_v2(ctypes.byref(count))
        devices = []
        for index in range(count.value):
            handle = ctypes.c_void_p()
            if nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0:
                continue
            name = ctypes.create_string_buffer(96)
            nvml.nvmlDeviceGetName(handle, name, 96)
            major, minor = ctypes.c_int(), ctypes.c_int()
            ok = nvml.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor)) == 0
            memory = _Memory()
            has_memory = nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)) == 0
            devices.append(
                {
                    "index": index,
                    "name": name.value.decode(errors="replace"),
                    "capability": f"{major.value}.{minor.value}" if ok else None,
                    "memory_mib": memory.total // (1024 * 1024) if has_memory else None,
                    "pci_bus_id": None,
                }
            )
        return {"source": "nvml", "driver": driver, "cuda_driver": cuda_driver, "devices": devices}
    finally:
        nvml.nvmlShutdown()


# -- device limits: the CUDA driver API through ctypes, torch as a cross-check -------------------

# CUdevice_attribute values from the CUDA driver API header (cuda.h, enum CUdevice_attribute_enum);
# the same numbers are in numba's cuda/cudadrv/enums.py, and vLLM's csrc reads opt-in as 97.
CU_ATTRIBUTES = {
    "sm_count": 16,  # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
    "integrated": 18,  # CU_DEVICE_ATTRIBUTE_INTEGRATED (GB10 shares host memory)
    "capability_major": 75,  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
    "capability_minor": 76,  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
    "shared_memory_per_sm": 81,  # CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
    "shared_memory_per_block_optin": 97,  # CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
}


def cuda_device_facts(library: str = "libcuda.so.1") -> dict[str, Any]:
    """Per device: name, compute capability, SM count, shared memory per SM and the per-block opt-in
    limit, total memory and whether it is integrated; from the driver, so no torch is needed.
    Without a driver it says why (`error`), with no devices."""
    facts = _from_cuda_driver(library)
    facts["torch"] = _torch_cross_check()
    return facts


def _from_cuda_driver(library: str) -> dict[str, Any]:
    try:
        cuda = ctypes.CDLL(library)
    except OSError as exc:
        return {"source": "cuda-driver", "error": f"no libcuda ({library}: {exc})", "devices": []}
    try:
        status = cuda.cuInit(0)
        if status != 0:
            return {"source": "cuda-driver", "error": f"cuInit failed (CUresult {status})", "devices": []}
        count = ctypes.c_int()
        if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return {"source": "cuda-driver", "error": "cuDeviceGetCount failed", "devices": []}
        devices = [_cuda_device(cuda, index) for index in range(count.value)]
    except AttributeError as exc:  # a libcuda without the entry points (a stub, or not the driver)
        return {"source": "cuda-driver", "error": f"{library}: {exc}", "devices": []}
    return {"source": "cuda-driver", "devices": devices}


def _cuda_device(cuda: Any, index: int) -> dict[str, Any]:
    device = ctypes.c_int()
    if cuda.cuDeviceGet(ctypes.byref(device), index) != 0:
        return {"index": index, "error": "cuDeviceGet failed"}
    name = ctypes.create_string_buffer(256)
    cuda.cuDeviceGetName(name, 256, device)
    values: dict[str, int | None] = {}
    for key, attribute in CU_ATTRIBUTES.items():
        value = ctypes.c_int()
        ok = cuda.cuDeviceGetAttribute(ctypes.byref(value), attribute, device) == 0
        values[key] = value.value if ok else None
    total = ctypes.c_size_t()
    has_total = cuda.cuDeviceTotalMem_v2(ctypes.byref(total), device) == 0
    major, minor = values.pop("capability_major"), values.pop("capability_minor")
    integrated = values.pop("integrated")
    return {
        "index": index,
        "name": name.value.decode(errors="replace"),
        "capability": f"{major}.{minor}" if major is not None and minor is not None else None,
        "integrated": bool(integrated) if integrated is not None else None,
        "total_memory": total.value if has_total else None,
        **values,
    }


def _torch_cross_check() -> dict[str, Any] | None:
    """torch's view of the same limits, when torch imports here (None: not installed)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return None
    code = (
        "import json, torch\n"
        "out = []\n"
        "for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):\n"
        "    p = torch.cuda.get_device_properties(i)\n"
        "    out.append({'index': i, 'name': p.name, 'sm_count': p.multi_processor_count,\n"
        "        'total_memory': p.total_memory, 'integrated': bool(getattr(p, 'is_integrated', 0)),\n"
        "        'shared_memory_per_sm': getattr(p, 'shared_memory_per_multiprocessor', None),\n"
        "        'shared_memory_per_block_optin': getattr(p, 'shared_memory_per_block_optin', None)})\n"
        "print(json.dumps(out))\n"
    )
    out, err = _run([sys.executable, "-c", code])
    if out is None:
        return {"error": f"torch: {err}", "devices": []}
    try:
        return {"devices": json.loads(out.strip().splitlines()[-1])}
    except (ValueError, IndexError):
        return {"error": "torch printed no JSON", "devices": []}


# -- what may trace what: Yama, and a container's capabilities and seccomp -------------------------

# Linux capability bit numbers (include/uapi/linux/capability.h); CapEff is a hex mask of them.
CAPABILITIES = (
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
    "SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW",
    "IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT",
    "SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD",
    "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG",
    "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE",
)  # fmt: skip
SECCOMP_MODES = {0: "disabled", 1: "strict", 2: "filter"}


def security_facts(proc: Path = Path("/proc")) -> dict[str, Any]:
    """Yama's ptrace scope (None: no Yama, nothing restricts ptrace beyond the usual checks) and
    this process's effective capabilities and seccomp mode. Inside a container they are the
    container's: SYS_PTRACE missing, or seccomp `filter` (docker's default profile), refuses the
    ptrace a PLE offload handshake needs (vllm-project/vllm#53960)."""
    scope: int | None = None
    try:
        scope = int((proc / "sys/kernel/yama/ptrace_scope").read_text().strip())
    except (OSError, ValueError):
        scope = None
    status: dict[str, str] = {}
    try:
        for line in (proc / "self/status").read_text().splitlines():
            key, _, value = line.partition(":")
            status[key.strip()] = value.strip()
    except OSError:
        pass
    cap_eff = status.get("CapEff")
    seccomp = status.get("Seccomp")
    return {
        "ptrace_scope": scope,
        "yama": scope is not None,
        "cap_eff": cap_eff,
        "capabilities": decode_capabilities(cap_eff) if cap_eff else None,
        "seccomp": SECCOMP_MODES.get(int(seccomp), seccomp) if seccomp and seccomp.isdigit() else seccomp,
    }


def decode_capabilities(mask: str) -> list[str]:
    """`00000000a80425fb` -> ["CHOWN", ...]; bits past the known names read as `CAP_<bit>`."""
    value = int(mask, 16)
    names = []
    bit = 0
    while value >> bit:
        if value >> bit & 1:
            names.append(CAPABILITIES[bit] if bit < len(CAPABILITIES) else f"CAP_{bit}")
        bit += 1
    return names


# -- CUDA toolkit and the host's cuDNN --------------------------------------------------------------


def nvcc_facts() -> dict[str, Any]:
    """`nvcc --version`: what vLLM's collect-env reports as "CUDA runtime version" (a toolkit on
    PATH, not necessarily what torch loads)."""
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    if nvcc is None:
        return {"path": None, "version": None}
    out, err = _run([nvcc, "--version"])
    match = re.search(r"release .+ V(\S+)", out or "")
    return {"path": nvcc, "version": match.group(1) if match else None, "error": None if out else err}


def cudnn_host_facts() -> dict[str, Any]:
    """cuDNN libraries the dynamic loader knows (`ldconfig -p`), with the version each file is.

    These are the system's libraries; a pip-installed torch loads nvidia-cudnn-cu* from
    site-packages instead, which the probe's distributions and torch's cuDNN version show.
    """
    ldconfig = shutil.which("ldconfig") or ("/sbin/ldconfig" if os.path.exists("/sbin/ldconfig") else None)
    libraries: list[str] = []
    if ldconfig is not None:
        out, _ = _run([ldconfig, "-p"])
        for line in (out or "").splitlines():
            match = re.search(r"=>\s*(\S*libcudnn\.so\S*)", line)
            if match and match.group(1) not in libraries:
                libraries.append(match.group(1))
    versions = sorted({v for v in (_cudnn_file_version(p) for p in libraries) if v})
    header = _cudnn_header_version()
    return {"libraries": libraries, "versions": versions, "header_version": header}


def _cudnn_file_version(path: str) -> str | None:
    match = re.search(r"libcudnn\.so\.(\d+\.\d+\.\d+)", os.path.realpath(path))
    return match.group(1) if match else None


def _cudnn_header_version() -> str | None:
    for path in (
        "/usr/include/cudnn_version.h",
        "/usr/include/x86_64-linux-gnu/cudnn_version_v9.h",
        "/usr/include/aarch64-linux-gnu/cudnn_version_v9.h",
        "/usr/local/cuda/include/cudnn_version.h",
    ):
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        parts = [re.search(rf"#define CUDNN_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCHLEVEL")]
        if all(parts):
            return ".".join(m.group(1) for m in parts if m)
    return None


# -- env --------------------------------------------------------------------------------------------


def extra_environment() -> dict[str, str]:
    return {
        name: redact(name, value)
        for name, value in sorted(os.environ.items())
        if name.startswith(EXTRA_ENV_PREFIXES) or name in EXTRA_ENV_NAMES
    }


def redact(name: str, value: str) -> str:
    if SECRET_NAME.search(name):
        return "***"
    return SECRET_VALUE.sub("***", value)


def _run(argv: list[str]) -> tuple[str | None, str | None]:
    """stdout, or None and why."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    if proc.returncode != 0:
        return None, (proc.stderr or proc.stdout).strip()[-500:] or f"exit code {proc.returncode}"
    return proc.stdout, None


if __name__ == "__main__":
    sys.exit(main())
