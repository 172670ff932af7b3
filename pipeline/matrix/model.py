"""The resolved matrix: frozen, typed, no I/O.

`pipeline.matrix.read.load_matrix` builds these once from matrix.yaml; everything downstream takes them
as arguments and never reads YAML, dicts or the environment again.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

from pipeline.errors import InputError

__all__ = [
    "HOST_BASE",
    "STAGES",
    "Arm",
    "BootstrapBase",
    "BootstrapRecipe",
    "Cell",
    "CellBase",
    "Expectation",
    "ForensicsSpec",
    "HostBase",
    "HostExpectations",
    "Index",
    "Install",
    "LoadSpec",
    "LogRule",
    "Matrix",
    "ModelSource",
    "RegistryBase",
    "Requirement",
    "ServeSpec",
]

Pairs = tuple[tuple[str, str], ...]


# The check families, cheapest first; a FAIL stops the stages after it.
STAGES: tuple[str, ...] = ("imports", "startup", "autotune", "load")


@dataclass(frozen=True, kw_only=True)
class Index:
    """A named package index. A site's mirror map may point the name elsewhere at build time."""

    name: str
    url: str


@dataclass(frozen=True, kw_only=True)
class BootstrapRecipe:
    """A Debian root filesystem made with debootstrap, no registry involved."""

    suite: str
    variant: str
    include: tuple[str, ...]
    venv: str  # a virtualenv created in the rootfs, so pip never touches Debian's python


@dataclass(frozen=True, kw_only=True)
class RegistryBase:
    name: str
    image: str  # repository:tag
    digest: str | None  # sha256:...; None is allowed but flagged, and the build records what it got
    python: str
    # What the image is known to be without pulling it (preflight, pipeline/host/preflight.py): its
    # NVIDIA_REQUIRE_CUDA and the platforms its tag has. None / () = not declared.
    require_cuda: str | None = None
    platforms: tuple[str, ...] = ()

    @property
    def reference(self) -> str:
        return f"{self.image}@{self.digest}" if self.digest else self.image


@dataclass(frozen=True, kw_only=True)
class BootstrapBase:
    name: str
    recipe: BootstrapRecipe

    @property
    def python(self) -> str:
        return f"{self.recipe.venv}/bin/python"


@dataclass(frozen=True, kw_only=True)
class CellBase:
    """Another cell's image; resolved to that cell's content tag when planning."""

    name: str
    cell: str


@dataclass(frozen=True, kw_only=True)
class HostBase:
    """No image: a `runtime: host` cell runs in a Python environment of the host (built from its
    `install:` by pipeline/host/env.py, or given with `verify --python`)."""

    name: str = "host"
    python: str = "python3"


HOST_BASE = HostBase()

ARCHIVE_FORMATS = ("docker-archive", "oci", "rootfs")
ARCHIVE_TAG_REPOSITORY = "stackproof-base/archive"


@dataclass(frozen=True, kw_only=True)
class ArchiveBase:
    """A local image archive, for a runner without a registry: `docker load` of a docker/OCI archive
    or `docker import` of a root filesystem tarball (`format: rootfs`, its `env` set on the image),
    after the file's sha256 is checked. `archive` relative: under the site's STACKPROOF_BASE_ARCHIVES."""

    name: str
    archive: str
    sha256: str  # 64 hex digits: the file's, what pins the base in the content tag
    format: str  # one of ARCHIVE_FORMATS
    python: str = "python3"
    env: tuple[tuple[str, str], ...] = ()  # rootfs only: `docker import --change ENV`
    line: int = 0  # of `sha256:` in matrix.yaml, for the mismatch message

    @property
    def tag(self) -> str:
        """The loaded base's tag: from the sha256, so a present tag is this very file, loaded before."""
        return f"{ARCHIVE_TAG_REPOSITORY}:{self.sha256[:32]}"


Base = RegistryBase | BootstrapBase | CellBase | HostBase | ArchiveBase


@dataclass(frozen=True, kw_only=True)
class Requirement:
    """`name==version` from exactly one declared index."""

    name: str  # canonical (PEP 503) name
    version: str
    index: str

    @property
    def pin(self) -> str:
        return f"{self.name}=={self.version}"


@dataclass(frozen=True, kw_only=True)
class Install:
    """A stack resolved once into a hash-locked file; the build installs exactly that lock."""

    requirements: tuple[Requirement, ...]
    lock: Path  # absolute
    python_version: str
    python_platform: str


@dataclass(frozen=True, kw_only=True)
class ModelSource:
    """`hf:org/name` (with a revision) or `path:/dir/in/image`."""

    source: str
    revision: str | None

    @property
    def kind(self) -> str:
        return self.source.split(":", 1)[0]

    @property
    def location(self) -> str:
        return self.source.split(":", 1)[1]


@dataclass(frozen=True, kw_only=True)
class LoadSpec:
    """The `load` stage's workload and limits (`serve.load` in matrix.yaml); defaults are the short run.

    Questions are 2-3 chat turns sent with history; a question is clean only when every turn is.
    Timeouts bound every wait: one hung stream ends at `chunk_timeout_s`, a wedged engine at
    `stall_seconds` of no progress while requests are in flight.
    """

    questions: int = 80  # the short run's bound; a soak is bounded by duration instead
    concurrency: int = 6  # closed loop: this many questions in flight
    rate: float | None = None  # open loop: questions started per second (gamma arrivals), capped by concurrency
    burstiness: float = 1.0  # gamma shape: 1 = Poisson, < 1 burstier
    max_tokens: int = 32  # per turn
    ignore_eos: bool = True  # fixed output lengths make runs and arms comparable
    duration_s: float = 600.0  # no new question starts after this
    seed: int = 0  # the built-in question pool is generated from it
    questions_file: str | None = None  # JSONL of {"id", "turns": [...]}; relative to matrix.yaml
    ttft_timeout_s: float = 120.0
    chunk_timeout_s: float = 30.0
    stall_seconds: float = 60.0
    scrape_interval_s: float = 1.0
    warmup_s: float = 0.0  # no stall verdicts in the first seconds (compile, cudagraph capture)
    max_errors: int = 20  # the run stops after this many failed requests
    determinism_prompts: int = 3  # fixed token-ID prompts at temperature 0
    determinism_repeats: int = 3  # each run this many times alone, then as many times under load
    determinism_max_tokens: int = 16
    baseline_rate: float = 1 / 450  # fault probability per question that a clean run is measured against
    # Share of the shipped canary prompts (verify/load/canaries.jsonl) the model must answer right; None:
    # the model cannot answer (the generated tiny model), so no canary is asked.
    canary_floor: float | None = None


@dataclass(frozen=True, kw_only=True)
class HostExpectations:
    """`host:` of a cell: the facts of the box a reporter ran on (`stackproof repro` writes them). Not
    image content: `verify` and `doctor` compare them with the host they run on and WARN on a difference."""

    gpu: str | None = None  # the first GPU's name as NVML gives it
    gpu_count: int | None = None
    driver: str | None = None  # the NVIDIA driver version
    cuda_driver: str | None = None  # the CUDA version the driver supports
    kernel: str | None = None  # the Linux kernel release
    cudnn_host: tuple[str, ...] | None = None  # cuDNN libraries found on the host, outside any wheel

    def as_dict(self) -> dict[str, object]:
        """The keys that are set, as the doctor's fingerprint names them."""
        out: dict[str, object] = {}
        for name in HOST_EXPECTATION_KEYS:
            value = getattr(self, name)
            if value is not None:
                out[name] = list(value) if isinstance(value, tuple) else value
        return out


HOST_EXPECTATION_KEYS = tuple(f.name for f in fields(HostExpectations))  # the `host:` keys are its fields


@dataclass(frozen=True, kw_only=True)
class ForensicsSpec:
    """`serve.forensics`: evidence taken when the engine stalls with the API alive (verify/forensics/stall.py)."""

    cuda_coredump: bool = False  # GPU cells only: run the server ready for a user-triggered CUDA core dump


# The serving engines a cell may name (`serve.engine`, default vllm), with the modules the imports
# stage tries when a cell declares none. Each has its driver in verify/serving/<name>.py (the
# launch, endpoints, metrics, log and process facts); tests/unit/test_serving.py holds this table
# equal to the drivers' own names and imports.
SERVING_ENGINES: dict[str, tuple[str, ...]] = {
    "vllm": ("torch?", "flashinfer?", "vllm?"),
    "sglang": ("torch?", "flashinfer?", "sglang?", "sgl_kernel?"),
}
DEFAULT_ENGINE = "vllm"


@dataclass(frozen=True, kw_only=True)
class ServeSpec:
    model: ModelSource
    args: tuple[str, ...]
    env: Pairs
    readiness_timeout_s: float
    shm_size: str
    gpus: str | None  # docker --gpus value on GPU hosts; None on CPU cells
    load: LoadSpec = field(default_factory=LoadSpec)
    forensics: ForensicsSpec = field(default_factory=ForensicsSpec)
    engine: str = DEFAULT_ENGINE  # a key of SERVING_ENGINES: whose driver launches and reads the server


@dataclass(frozen=True, kw_only=True)
class LogRule:
    """A pattern the server log must show (`expect`), must not show (`forbid`), or whose named
    groups are captured into the report (`evidence`)."""

    id: str
    kind: str  # expect | forbid | evidence
    pattern: str
    if_absent: str = "fail"  # expect only: fail | inconclusive (absence proves nothing)
    # Whose text the pattern quotes, for `stackproof matrix audit`: a package's (the default), or
    # `external` (the kernel log, the CUDA runtime, the driver, the interpreter): listed, not checked.
    source: str = "package"
    package: str | None = None  # the one package to look in (e.g. flashinfer-python); None: any


LOG_RULE_KINDS = ("expect", "forbid", "evidence")


def parse_log_rule(value: object, default_id: str) -> tuple[LogRule | None, list[tuple[tuple[str, ...], str]]]:
    """One rule from its mapping form, e.g. `{expect: 'regex', id: x, if_absent: inconclusive}`.

    Returns the rule (or None) and the problems found, each as (sub-path, message), so both
    matrix.yaml and the built-in rule sets report located errors the same way.
    """
    import re

    if not isinstance(value, dict):
        return None, [((), "must be a mapping like {expect: 'regex'}")]
    problems: list[tuple[tuple[str, ...], str]] = []
    allowed = (*LOG_RULE_KINDS, "id", "if_absent", "source", "package")
    for key in value:
        if key not in allowed:
            problems.append(((str(key),), f"unknown key{_suggest(str(key), list(allowed))}"))
    kinds = [k for k in LOG_RULE_KINDS if k in value]
    if len(kinds) != 1:
        problems.append(((), "needs exactly one of expect, forbid, evidence"))
        return None, problems
    kind = kinds[0]
    pattern = value[kind]
    if not isinstance(pattern, str):
        problems.append(((kind,), "must be a string (a regular expression)"))
        return None, problems
    try:
        re.compile(pattern)
    except re.error as exc:
        problems.append(((kind,), f"{pattern!r} is not a valid regular expression: {exc}"))
    if_absent = str(value.get("if_absent", "fail"))
    if if_absent not in ("fail", "inconclusive"):
        problems.append((("if_absent",), f"must be fail or inconclusive, got {if_absent!r}"))
    elif "if_absent" in value and kind != "expect":
        problems.append((("if_absent",), "only an expect rule has if_absent"))
    source = str(value.get("source", "package"))
    if source not in ("package", "external"):
        problems.append((("source",), f"must be package or external, got {source!r}"))
    package = value.get("package")
    if package is not None and (not isinstance(package, str) or not package):
        problems.append((("package",), "must be a distribution name, e.g. flashinfer-python"))
    rule = LogRule(
        id=str(value.get("id", default_id)),
        kind=kind,
        pattern=pattern,
        if_absent=if_absent,
        source=source,
        package=str(package) if package else None,
    )
    return (None if problems else rule), problems


@dataclass(frozen=True, kw_only=True)
class Arm:
    """A variant of the same image: other env or args at serve time."""

    name: str
    description: str
    env: Pairs
    args: tuple[str, ...]
    log_rules: tuple[LogRule, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Expectation:
    """A known-bad stack kept in the matrix: it must fail at `stage`, for `reason`.

    `match` is a regex that the failure's evidence must contain: failing for another reason is a
    pipeline failure too. `may_not_reproduce` says why the failure depends on the host (a timing
    outcome, e.g. which runner the autotuner finds fastest on this card): when the stage then
    passes, the outcome is NOT_REPRODUCED, neither a pipeline failure nor a pass of the fix.
    """

    stage: str
    reason: str
    match: str
    may_not_reproduce: str | None = None


@dataclass(frozen=True, kw_only=True)
class Cell:
    id: str
    line: int
    base: Base
    platform: str
    arch: str
    runner: tuple[str, ...]
    system_packages: tuple[str, ...]
    install: Install | None
    overrides: tuple[Requirement, ...]
    uninstall: tuple[str, ...]
    recipes: tuple[str, ...]
    env: Pairs
    serve: ServeSpec | None
    arms: tuple[Arm, ...]
    expect: Expectation | None
    imports: tuple[str, ...] = ()  # modules the imports stage must import; `name?` = only where installed
    accepted_conflicts: Pairs = ()  # required package -> why its conflict or absence is accepted
    log_rules: tuple[LogRule, ...] = ()  # applied to the server log, with the arm's and the built-in sets
    autotune_forbid: tuple[tuple[str, str], ...] = ()  # (op, runner) that must not win, beyond the policies
    autotune_allow: tuple[tuple[str, str], ...] = ()  # (op, runner) a built-in policy forbids, allowed here
    # "expected": a fresh start must write tuned entries; "none": the cell's model has no op that
    # FlashInfer tunes on its arch, so "no entries" (said by the engine) passes the autotune stage.
    autotune_entries: str = "expected"
    notes: tuple[str, ...] = ()  # flagged-but-allowed findings, e.g. a base without digest
    runtime: str = "docker"  # where its servers run: "docker" (an image) or "host" (verify/runtime/)
    # A host cell verified in an environment that exists (`--python`): the versions it must hold,
    # checked against its inventory before any stage, and what `matrix audit` reads rules against.
    given: tuple[Requirement, ...] = ()
    host: HostExpectations | None = None  # the reporter's box (repro cells): checked, never built

    @property
    def on_host(self) -> bool:
        return self.runtime == "host"

    @property
    def is_gpu(self) -> bool:
        return self.arch != "none"

    def pinned_versions(self) -> dict[str, str]:
        """The versions the cell itself names: its install requirements, its overrides on top (an
        override is the pin the user chose over everything else)."""
        pins = {r.name: r.version for r in (self.install.requirements if self.install else ())}
        return pins | {o.name: o.version for o in self.overrides}

    def serve_env(self, arm: Arm | None = None) -> dict[str, str]:
        """The environment the server gets: the serve spec's, then the arm's on top."""
        env = dict(self.serve.env if self.serve else ())
        env.update(arm.env if arm else ())
        return env

    def arm(self, name: str) -> Arm:
        for arm in self.arms:
            if arm.name == name:
                return arm
        raise InputError(f"cell {self.id!r} has no arm {name!r}{_suggest(name, [a.name for a in self.arms])}")


@dataclass(frozen=True, kw_only=True)
class Matrix:
    file: Path
    digest: str  # sha256 of the matrix file's bytes
    indexes: tuple[Index, ...]
    bases: tuple[Base, ...]
    cells: tuple[Cell, ...] = field(default=())

    def cell(self, cell_id: str) -> Cell:
        for cell in self.cells:
            if cell.id == cell_id:
                return cell
        raise InputError(f"{self.file}: no cell {cell_id!r}{_suggest(cell_id, [c.id for c in self.cells])}")

    def lineage(self, cell: Cell) -> tuple[Cell, ...]:
        """The cell, then the cell its image is built on, and so on to the cell on a registry or
        bootstrap base: the one walk of the base chain (the loader has rejected cycles)."""
        return lineage(cell, {c.id: c for c in self.cells})

    def root_base(self, cell: Cell) -> RegistryBase | BootstrapBase | HostBase | ArchiveBase:
        """The registry or bootstrap base at the bottom of the cell's chain."""
        base = self.lineage(cell)[-1].base
        if isinstance(base, CellBase):
            raise InputError(f"{self.file}: cell {cell.id!r} stands on cell {base.cell!r}, which is not in it")
        return base

    def python_of(self, cell: Cell) -> str:
        """The python the cell's image installs into: its root base's."""
        return self.root_base(cell).python

    def index(self, name: str) -> Index:
        for index in self.indexes:
            if index.name == name:
                return index
        raise InputError(f"{self.file}: no index {name!r}")


def lineage(cell: Cell, by_id: Mapping[str, Cell], *, limit: int | None = None) -> tuple[Cell, ...]:
    """`Matrix.lineage` over any cells by id (the loader uses it before the Matrix exists). A base
    cell missing from `by_id` ends the chain there; a cycle raises, naming it. `limit`: stop after
    that many bases (the loader's depth bound), so a hostile chain costs no more than that."""
    chain, seen = [cell], {cell.id}
    while isinstance(chain[-1].base, CellBase) and (parent := by_id.get(chain[-1].base.cell)) is not None:
        if parent.id in seen:
            names = " -> ".join(c.id for c in [*chain, parent])
            raise InputError(f"cell {cell.id!r} is its own base through {names}")
        if limit is not None and len(chain) - 1 > limit:  # limit + 1 bases: enough to say "too deep"
            break
        chain.append(parent)
        seen.add(parent.id)
    return tuple(chain)


def _suggest(word: str, choices: list[str]) -> str:
    matches = difflib.get_close_matches(word, choices, n=1)
    if matches:
        return f", did you mean {matches[0]!r}?"
    return f" (known: {', '.join(choices)})" if choices else ""
