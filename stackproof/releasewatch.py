"""Keeping up without a person: which watched releases on the declared indexes are newer than the matrix's.

Watched: the serving engines (vllm from `pypi`, whose release images are `vllm/vllm-openai:vX.Y.Z`;
sglang from `pypi`, images `lmsysorg/sglang:vX.Y.Z-cu130`) and FlashInfer (`flashinfer-python` on
`pypi` and on FlashInfer's own index, which carries versions PyPI lacks, e.g. 0.7.3, vLLM 0.34.0's pin).
The matrix's newest of each is read from its bases (the release images) and from the pins it knows
(the release-pin table, the SGLang driver's pins, cells' overrides and given wheels). What an index
lists newer than that, final releases only, is a `NewRelease`; an index that cannot be read is said
so (`unreadable`), never taken as "nothing new".

`stackproof matrix propose --new` (stackproof/cli/propose.py) turns each new vLLM into proposed,
validated and audited cells, and writes a patch and a pull-request body (`pr_body`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from packaging.version import InvalidVersion, Version

from pipeline.errors import InfraError
from pipeline.matrix.model import Matrix, RegistryBase

__all__ = ["WATCHED", "NewRelease", "Scan", "matrix_newest", "pr_body", "scan"]

# (package, index) pairs asked, in order; an index the matrix does not declare is skipped.
WATCHED: tuple[tuple[str, str], ...] = (
    ("vllm", "pypi"),
    ("sglang", "pypi"),
    ("flashinfer-python", "pypi"),
    ("flashinfer-python", "flashinfer"),
)
Lister = Callable[[str, str], Sequence[Version]]  # (index name, package) -> versions listed there


@dataclass(frozen=True, kw_only=True)
class NewRelease:
    package: str
    version: str
    index: str
    newest_in_matrix: str | None


@dataclass(frozen=True, kw_only=True)
class Scan:
    new: tuple[NewRelease, ...]
    newest: dict[str, str | None]
    unreadable: tuple[str, ...] = field(default=())  # "index X for P: why"


def _version(text: str | None) -> Version | None:
    try:
        return Version(text) if text else None
    except InvalidVersion:
        return None


def _max(versions: Sequence[str]) -> str | None:
    parsed = [(v, p) for v in versions if (p := _version(v)) is not None]
    return max(parsed, key=lambda pair: pair[1])[0] if parsed else None


def matrix_newest(matrix: Matrix) -> dict[str, str | None]:
    """The newest vllm, sglang and flashinfer-python the matrix's bases and pins know of."""
    from pipeline.releases.pins import builtin_releases, release_of_image
    from verify.serving import DRIVERS

    images = [b.image for b in matrix.bases if isinstance(b, RegistryBase)]
    vllm = [v for image in images if (v := release_of_image(image))]
    sglang_driver = DRIVERS["sglang"]
    sglang = [v for image in images if (v := sglang_driver.release_of_image(image))]
    flashinfer = [p.get("flashinfer-python", "") for p in builtin_releases().values()]
    flashinfer += [p.get("flashinfer-python", "") for p in sglang_driver.release_pins.values()]
    for cell in matrix.cells:
        pinned = [*cell.overrides, *cell.given, *(cell.install.requirements if cell.install else ())]
        flashinfer += [r.version for r in pinned if r.name == "flashinfer-python"]
    return {"vllm": _max(vllm), "sglang": _max(sglang), "flashinfer-python": _max(flashinfer)}


def scan(matrix: Matrix, lister: Lister) -> Scan:
    """What the declared indexes list newer than the matrix's newest (final releases only)."""
    newest = matrix_newest(matrix)
    declared = {i.name for i in matrix.indexes}
    found: dict[tuple[str, str], NewRelease] = {}
    unreadable = []
    for package, index in WATCHED:
        if index not in declared:
            continue
        try:
            listed = lister(index, package)
        except InfraError as exc:
            unreadable.append(f"index {index} for {package}: {str(exc).splitlines()[0]}")
            continue
        floor = _version(newest.get(package))
        for version in listed:
            if version.is_prerelease or version.is_devrelease or version.local:
                continue
            if floor is None or version > floor:
                key = (package, str(version))
                new = NewRelease(
                    package=package, version=str(version), index=index, newest_in_matrix=newest.get(package)
                )
                found.setdefault(key, new)
    ordered = sorted(found.values(), key=lambda r: (WATCHED.index((r.package, r.index)), Version(r.version)))
    return Scan(new=tuple(ordered), newest=newest, unreadable=tuple(unreadable))


def pr_body(scan_: Scan, proposals: Sequence[dict[str, Any]], *, seconds: float) -> str:
    """The pull request's text: what is new, what changed in the pins, what the audit found."""
    lines = ["# New upstream releases: proposed matrix cells", ""]
    lines.append("Written by `stackproof matrix propose --new` (.github/workflows/releases.yml); review it.")
    lines += ["", "## New releases on the declared indexes", ""]
    for r in scan_.new:
        newest = r.newest_in_matrix or "none"
        lines.append(f"- {r.package} {r.version} (index `{r.index}`; the matrix's newest: {newest})")
    if not scan_.new:
        lines.append("- none")
    for why in scan_.unreadable:
        lines.append(f"- not read: {why}")
    for proposal in proposals:
        lines += ["", f"## vLLM {proposal['version']}", ""]
        lines.append(f"- pins: {proposal.get('pins_source')}")
        for change in proposal.get("pin_changes") or []:
            lines.append(f"  - {change}")
        cells = ", ".join(str(c) for c in proposal.get("cells") or [])
        lines.append(f"- cells: {cells} (base {proposal.get('base')})")
        audit = proposal.get("audit")
        if isinstance(audit, dict):
            lines.append(f"- audit: {audit.get('errors', '?')} errors")
            for finding in audit.get("error_findings") or []:
                lines.append(f"  - {finding}")
    others = [r for r in scan_.new if r.package != "vllm"]
    if others:
        lines += ["", "## Not proposed by this command", ""]
    for r in others:
        where = "verify/serving/sglang.py release_pins" if r.package == "sglang" else "a cell's overrides"
        lines.append(f"- {r.package} {r.version}: its pins belong in {where} first")
    lines += ["", f"From the index listing to audited cells: {seconds:.1f} s.", ""]
    return "\n".join(lines)
