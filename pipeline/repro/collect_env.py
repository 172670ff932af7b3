"""The output of `vllm collect-env` (often inside an issue body, with a `docker run`/`vllm serve` line)
-> `Report`."""

from __future__ import annotations

import re

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from pipeline.errors import InputError
from pipeline.releases.pins import FI_CUBIN, FI_JIT, FI_PYTHON
from pipeline.repro.commands import _scan_commands
from pipeline.repro.facts import Finding, Gpu, Kind, Report, Seen
from pipeline.repro.util import OFFICIAL_USAGE_SOURCE, _check_version, _full_commit, _is_official, _known

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


def _pip_and_env(lines: list[str], name: str) -> tuple[dict[str, Seen], dict[str, Seen]]:
    """The pip/conda package lines anywhere, and the variables of the Environment Variables section."""
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
    return packages, env


def _kernel_and_machine(platform: Seen | None) -> tuple[Seen | None, Seen | None]:
    """`Python platform: Linux-6.8.0-...-x86_64-with-glibc2.35` -> the kernel and the machine."""
    if platform is None:
        return None, None
    match = re.match(r"Linux-(?P<kernel>.+?)-(?P<machine>x86_64|aarch64|arm64)-with", platform.value)
    if not match:
        return None, None
    return Seen(value=match.group("kernel"), line=platform.line), Seen(value=match.group("machine"), line=platform.line)


def _from_collect_env(lines: list[str], name: str) -> Report:
    fields = _collect_env_fields(lines)
    findings: list[Finding] = []
    packages, env = _pip_and_env(lines, name)
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
    kernel, machine = _kernel_and_machine(fields.get("Python platform"))
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
