"""Plain environment blocks (`GPU: ...`, `Driver: ...`, `FlashInfer: ...`, as lines, list items or
table rows) -> `Report`."""

from __future__ import annotations

import re
import shlex

from pipeline.errors import InputError
from pipeline.releases.pins import FI_CUBIN, FI_JIT, FI_PYTHON
from pipeline.repro.collect_env import _ENV_LINE, _torch_from_dunder_version
from pipeline.repro.commands import _scan_commands, _vllm_args
from pipeline.repro.facts import Finding, Gpu, Kind, Report, Seen
from pipeline.repro.util import VERSION_TOKEN, _check_version, _first_word, _is_official, _version_in

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


def _block_values(lines: list[str], name: str) -> tuple[dict[str, Seen], dict[str, Seen], dict[str, Seen]]:
    """The block's `key: value` lines by kind, the FlashInfer versions, and the engine variables it lists."""
    packages: dict[str, Seen] = {}
    env: dict[str, Seen] = {}
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
    return values, packages, env


def _ambiguous(values: dict[str, Seen], findings: list[Finding]) -> None:
    """NCCL, cuDNN and CUDA versions in a block do not say whose they are: each is a finding."""
    if "nccl" in values:
        findings.append(
            Finding(
                topic="NCCL",
                kind=Kind.AMBIGUOUS,
                line=values["nccl"].line,
                message=f"{values['nccl'].value}: the nvidia-nccl-cu* wheel torch loads, or the system's? not pinned",
            )
        )
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


def _block_gpus(values: dict[str, Seen]) -> tuple[Gpu, ...]:
    """`GPU: 8x H200` -> eight H200s; no count is one."""
    if "gpu" not in values:
        return ()
    seen = values["gpu"]
    match = re.match(r"(?:(?P<count>\d+)\s*[xX\u00d7]\s*)?(?P<name>[^(,;]+)", seen.value)
    gpu_name = match.group("name").strip() if match else seen.value
    count = int(match.group("count")) if match and match.group("count") else 1
    return tuple(Gpu(name=gpu_name, capability=None, line=seen.line) for _ in range(count))


def _from_env_block(lines: list[str], name: str) -> Report:
    findings: list[Finding] = []
    settings: dict[str, Seen] = {}
    values, packages, env = _block_values(lines, name)
    for kind, package in (("vllm", "vllm"), ("triton", "triton"), ("transformers", "transformers")):
        if kind in values:
            packages[package] = _version_in(values[kind], name, package)
    if "torch" in values:
        packages["torch"] = _torch_from_dunder_version(_version_in(values["torch"], name, "torch"), findings)
    _ambiguous(values, findings)
    gpus = _block_gpus(values)
    cudnn, cuda = values.get("cudnn"), values.get("cuda")
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
