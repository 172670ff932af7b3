"""`stackproof matrix propose`: candidate cells for a new vLLM release, next to the previous release's.

Pure planning: given the matrix, a release (`vllm==X.Y.Z`, optionally `flashinfer-python==V`) and
that release's pins, `plan_proposal` picks the newest older vLLM release the matrix has GPU cells
for and writes, per GPU arch, one cell that `extends` the cell of that arch with the fewest
overrides (so the same model, revision, args, arms and rules), on a new base
`vllm-openai-X.Y.Z`, with `expect: null` (an expectation describes the old stack, not this one) and
the FlashInfer trio overridden only when a FlashInfer version other than the release's pin is asked
for. `insert` puts the base after the old one and the cells after the old release's last cell, as
text, so every comment of the file stays. The caller validates and audits the result.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from pipeline.errors import InputError
from pipeline.guard.yamltext import comment, scalar
from pipeline.matrix.model import Cell, CellBase, Matrix, RegistryBase
from pipeline.releases.pins import FI_CUBIN, FI_JIT, FI_PYTHON, Pins, cuda_tag, release_of_image

__all__ = ["Proposal", "Wanted", "insert", "parse_specs", "plan_proposal"]

SUPPORTED = ("vllm", FI_PYTHON)


@dataclass(frozen=True, kw_only=True)
class Wanted:
    vllm: str
    flashinfer: str | None = None


@dataclass(frozen=True, kw_only=True)
class Proposal:
    version: str
    previous: str  # the release whose cells are the templates
    base_name: str
    base_after: str  # the base the new one goes after
    base_yaml: str  # "": the release's base is in the matrix already
    cell_ids: tuple[str, ...]
    cells_after: str  # the cell the new ones go after
    cells_yaml: str


def parse_specs(specs: list[str]) -> Wanted:
    """`vllm==X.Y.Z [flashinfer-python==V]` -> Wanted; anything else is bad input (exit 2)."""
    found: dict[str, str] = {}
    for spec in specs:
        try:
            requirement = Requirement(spec)
        except InvalidRequirement as exc:
            raise InputError(f"{spec!r}: not a requirement ({exc}); write NAME==VERSION, e.g. vllm==0.33.0") from None
        name = str(canonicalize_name(requirement.name))
        pins = list(requirement.specifier)
        if name not in SUPPORTED:
            raise InputError(f"{spec!r}: only {' and '.join(SUPPORTED)} can be proposed")
        if len(pins) != 1 or pins[0].operator != "==" or "*" in pins[0].version:
            raise InputError(f"{spec!r}: give one exact version (NAME==VERSION)")
        try:
            if Version(pins[0].version).local or Version(pins[0].version).is_devrelease:
                raise InputError(f"{spec!r}: a release on the index, not a development or local build")
        except InvalidVersion:
            raise InputError(f"{spec!r}: {pins[0].version!r} is not a version") from None
        if name in found:
            raise InputError(f"{spec!r}: {name} given twice")
        found[name] = pins[0].version
    if "vllm" not in found:
        raise InputError("name the release: vllm==X.Y.Z (and optionally flashinfer-python==V)")
    return Wanted(vllm=found["vllm"], flashinfer=found.get(FI_PYTHON))


def plan_proposal(
    matrix: Matrix, wanted: Wanted, pins: Pins, *, require_cuda: tuple[str, str] | None = None
) -> Proposal:
    """The base and cells for `wanted`, modelled on the newest older release's GPU cells.
    `require_cuda`: (value, where it was read); None copies the old base's and says so."""
    previous, templates = _templates(matrix, wanted.vllm)
    old_base = _root_base(matrix, templates[0])
    base_name = old_base.name.replace(previous, wanted.vllm)
    if base_name == old_base.name:
        base_name = f"vllm-openai-{wanted.vllm}"
    image = f"vllm/vllm-openai:v{wanted.vllm}"
    existing = next((b for b in matrix.bases if isinstance(b, RegistryBase) and b.image == image), None)
    if existing is not None:  # the release's base is there already (an earlier proposal): reuse it
        base_name, base_yaml = existing.name, ""
    else:
        if any(b.name == base_name for b in matrix.bases):
            raise InputError(f"{matrix.file}: a base {base_name!r} exists already for another image")
        if require_cuda is None and old_base.require_cuda:
            why = f"Copied from {old_base.name}: no Dockerfile was given to read CUDA_VERSION from (--dockerfile)."
            require_cuda = (old_base.require_cuda, why)
        base_yaml = _base_yaml(base_name, wanted.vllm, old_base, require_cuda)
    fi_pin = pins.get(FI_PYTHON)
    override = wanted.flashinfer if wanted.flashinfer and wanted.flashinfer != fi_pin else None
    cells = [_cell_yaml(t, wanted.vllm, base_name, override, pins, fi_pin) for t in templates]
    ids = tuple(cell_id for cell_id, _ in cells)
    for cell_id in ids:
        if any(c.id == cell_id for c in matrix.cells):
            raise InputError(f"{matrix.file}: a cell {cell_id!r} exists already: nothing to propose")
    command = f"vllm=={wanted.vllm}" + (f" {FI_PYTHON}=={wanted.flashinfer}" if wanted.flashinfer else "")
    header = comment(f"  # Proposed by `stackproof matrix propose {command}`: the {previous} cells on vLLM") + "\n"
    header += comment(f"  # {wanted.vllm}'s release image. Its pins: {pins.source}.") + "\n"
    return Proposal(
        version=wanted.vllm,
        previous=previous,
        base_name=base_name,
        base_after=old_base.name,
        base_yaml=base_yaml,
        cell_ids=ids,
        cells_after=_last_cell_on(matrix, image, default=max(templates, key=lambda c: c.line)).id,
        cells_yaml="\n" + header + "\n".join(text for _, text in cells),
    )


def _templates(matrix: Matrix, version: str) -> tuple[str, list[Cell]]:
    """The newest vLLM release older than `version` with GPU cells, and one cell per arch of it."""
    by_release: dict[str, list[Cell]] = {}
    for cell in matrix.cells:
        base = _root(matrix, cell).base
        release = release_of_image(base.image) if isinstance(base, RegistryBase) else None
        if release and cell.arch.startswith("sm") and cell.serve is not None:
            by_release.setdefault(release, []).append(cell)
    older = sorted((r for r in by_release if Version(r) < Version(version)), key=Version)
    if not older:
        raise InputError(
            f"{matrix.file}: no GPU cell on an older vLLM release image to model vLLM {version}'s cells on"
        )
    previous = older[-1]
    chosen: dict[str, Cell] = {}
    for cell in by_release[previous]:  # per arch, the cell closest to the release as shipped
        best = chosen.get(cell.arch)
        if best is None or (len(cell.overrides), cell.line) < (len(best.overrides), best.line):
            chosen[cell.arch] = cell
    return previous, sorted(chosen.values(), key=lambda c: c.line)


def _last_cell_on(matrix: Matrix, image: str, *, default: Cell) -> Cell:
    """The last cell of the file on `image` (the release's cells so far), else `default`."""
    on = [c for c in matrix.cells if getattr(_root(matrix, c).base, "image", None) == image]
    return max(on, key=lambda c: c.line) if on else default


def _root(matrix: Matrix, cell: Cell) -> Cell:
    while isinstance(cell.base, CellBase):
        cell = matrix.cell(cell.base.cell)
    return cell


def _root_base(matrix: Matrix, cell: Cell) -> RegistryBase:
    cell = _root(matrix, cell)
    if not isinstance(cell.base, RegistryBase):
        raise InputError(f"cell {cell.id}: not on a registry image")
    return cell.base


def _cell_yaml(
    template: Cell, version: str, base: str, fi: str | None, pins: Pins, fi_pin: str | None
) -> tuple[str, str]:
    stem = f"{template.arch}-vllm-{version}"
    cuda = cuda_tag(pins.as_dict()) or "cu130"
    cell_id = f"{stem}-fi-{fi}-{cuda}" if fi else f"{stem}-release"
    stack = f"FlashInfer {fi} overriding the release pin {fi_pin}" if fi else f"as released (FlashInfer {fi_pin})"
    description = f"vllm-openai v{version} {stack}: the model, args and arms of {template.id}"
    lines = [
        f"  - id: {cell_id}",
        f"    extends: {template.id}",
        f"    description: {scalar(description)}",
        f"    base: {base}",
        "    # The expectation of the extended cell describes its own stack; this one is unknown until a run.",
        "    expect: null",
    ]
    if fi:
        lines += [
            "    overrides:",
            f'      {FI_PYTHON}: {{version: "{fi}", index: pypi}}',
            f'      {FI_CUBIN}: {{version: "{fi}", index: flashinfer}}',
            f'      {FI_JIT}: {{version: "{fi}+{cuda}", index: flashinfer-{cuda}}}',
        ]
    elif template.overrides:
        lines.append("    overrides: null  # the release's own pins")
    return cell_id, "\n".join(lines) + "\n"


def _base_yaml(name: str, version: str, old: RegistryBase, require_cuda: tuple[str, str] | None) -> str:
    lines = [
        "",
        f"  {name}:",
        "    # Pinned by tag only until a runner records the digest it pulled; `stackproof build`",
        "    # prints that digest, and it belongs here.",
        f"    image: {scalar(f'vllm/vllm-openai:v{version}')}",
        f"    python: {old.python}",
    ]
    if require_cuda:
        lines += [f"    # {comment(require_cuda[1])}", f"    require_cuda: {scalar(require_cuda[0])}"]
    if old.platforms:
        lines += [
            f"    # The platforms of {old.name}'s tag: not read from the registry for this one.",
            f"    platforms: [{', '.join(old.platforms)}]",
        ]
    return "\n".join(lines) + "\n"


def insert(text: str, proposal: Proposal) -> str:
    """`text` (matrix.yaml) with the proposal's base and cells in place; comments untouched."""
    lines = text.splitlines(keepends=True)
    if proposal.base_yaml:
        base_at = _end_of_block(lines, rf"^  {re.escape(proposal.base_after)}:", r"^  \S|^\S")
        lines[base_at:base_at] = [proposal.base_yaml]
    cell_at = _end_of_block(lines, rf"^  - id: {re.escape(proposal.cells_after)}\s*$", r"^  - id:|^\S")
    lines[cell_at:cell_at] = [proposal.cells_yaml]
    return "".join(lines)


def _end_of_block(lines: list[str], start: str, next_block: str) -> int:
    """The line index after the block that begins at `start`: before the next block's leading
    comments and blank lines."""
    begin = next((i for i, line in enumerate(lines) if re.match(start, line)), None)
    if begin is None:
        raise InputError(f"matrix.yaml: no line matching {start!r} to insert after")
    end = next((i for i in range(begin + 1, len(lines)) if re.match(next_block, lines[i])), len(lines))
    while end > begin + 1 and (not lines[end - 1].strip() or lines[end - 1].lstrip().startswith("#")):
        end -= 1
    return end
