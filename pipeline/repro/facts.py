"""What a source states: each value with the line it stands on (`Seen`), what the source is silent or
ambiguous about (`Finding`), and the parsed whole (`Report`)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from packaging.utils import canonicalize_name


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
