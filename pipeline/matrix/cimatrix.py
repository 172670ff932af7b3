"""The GitHub Actions matrix, generated from the same `Matrix` everything else uses. Pure: no git, no reads.

`include_entries` turns cells into `include` entries; the workflow reads them with
`matrix: ${{ fromJSON(needs.plan.outputs.matrix) }}`. Each entry has exactly these keys, which
`.github/workflows/verify.yml` relies on (and `tests/unit/test_workflows.py` checks):

- `cell`: the cell id
- `arch`: GPU arch (`none`, `sm90`, `sm120`, ...)
- `platform`: `linux/amd64` or `linux/arm64`
- `runs-on`: the cell's `runner` labels, a list (`runs-on: ${{ matrix.runs-on }}`), mapped onto
  this site's labels when `STACKPROOF_RUNNER_LABELS` names a file (`pipeline.matrix.runners`)
- `build-runs-on`: the CPU runner that builds and pushes the cell's image, so GPU runners never build
- `gpu`: true when `arch` is not `none`
- `expect`: the stage a known-bad cell must fail at (`expect.stage`), or null

`changed_cells` compares the matrix at an older commit with this one, given the files that
changed since; `stackproof.cichanges` gathers those inputs from git.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import InputError
from pipeline.matrix.model import Cell, Matrix
from pipeline.matrix.runners import RunnerLabels

__all__ = [
    "ENTRY_KEYS",
    "MAX_JOBS",
    "Change",
    "MatrixEntry",
    "cell_definition",
    "cell_inputs",
    "changed_cells",
    "github_matrix",
    "include_entries",
]

ENTRY_KEYS = ("cell", "arch", "platform", "runs-on", "build-runs-on", "gpu", "expect")
MAX_JOBS = 256  # GitHub Actions refuses a matrix that expands to more jobs than this
TEMPLATES = ("cell.Dockerfile.j2", "pip-install.sh")  # images/ files every cell's Dockerfile is rendered from


@dataclass(frozen=True, kw_only=True)
class MatrixEntry:
    """One `include` entry: one verify job."""

    cell: str
    arch: str
    platform: str
    runs_on: tuple[str, ...]
    build_runs_on: tuple[str, ...]
    gpu: bool
    expect: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "cell": self.cell,
            "arch": self.arch,
            "platform": self.platform,
            "runs-on": list(self.runs_on),
            "build-runs-on": list(self.build_runs_on),
            "gpu": self.gpu,
            "expect": self.expect,
        }


@dataclass(frozen=True, kw_only=True)
class Change:
    """A cell selected by `changed_cells`, and why (one line per reason)."""

    cell: str
    reasons: tuple[str, ...]


def include_entries(
    matrix: Matrix, cells: Iterable[str] | None = None, labels: RunnerLabels | None = None
) -> tuple[MatrixEntry, ...]:
    """The entries for `cells` (ids, matrix order kept; None = every cell), with `labels` (this
    site's label mapping) applied to `runs-on`.

    An unknown id, a cell without runner labels, or more jobs than GitHub runs in one matrix is
    bad input: the workflow would fail later and less clearly.
    """
    wanted = None if cells is None else {matrix.cell(c).id for c in cells}  # matrix.cell: did-you-mean
    labels = labels or RunnerLabels()
    entries = []
    for cell in matrix.cells:
        if wanted is not None and cell.id not in wanted:
            continue
        if not cell.runner:
            raise InputError(
                f"{matrix.file}:{cell.line}: cells[{cell.id}]: no runner labels for `runs-on`: "
                "add e.g. `runner: [self-hosted, linux, x64, gpu, sm120]`"
            )
        entries.append(
            MatrixEntry(
                cell=cell.id,
                arch=cell.arch,
                platform=cell.platform,
                runs_on=labels.for_cell(cell),
                build_runs_on=labels.build_for(cell.platform),
                gpu=cell.is_gpu,
                expect=cell.expect.stage if cell.expect else None,
            )
        )
    if len(entries) > MAX_JOBS:
        raise InputError(f"{len(entries)} cells selected; GitHub Actions runs at most {MAX_JOBS} jobs per matrix")
    return tuple(entries)


def github_matrix(entries: Iterable[MatrixEntry]) -> dict[str, list[dict[str, Any]]]:
    """The document `fromJSON` turns into `strategy.matrix`. Nothing but `include`: any other
    top-level key would become a matrix axis."""
    return {"include": [e.to_json() for e in entries]}


def changed_cells(
    old: Matrix | None, new: Matrix, changed_files: Iterable[Path], images_dir: Path
) -> tuple[Change, ...]:
    """The cells of `new` whose verification may come out differently than at the older commit.

    A cell is selected when it is new (or `old` is None: no matrix there), when its resolved
    definition differs (`cell_definition`), when a file it is built from changed (`cell_inputs`:
    its lock, the Dockerfile templates unless it runs on the host, its recipes), or when a cell it
    is built on (a `{cell: ...}` base, at any depth) is selected. `changed_files` and `images_dir` are
    paths of the working tree `new` was loaded from.
    """
    before = {c.id: cell_definition(old, c) for c in old.cells} if old else {}
    changed = {_absolute(p) for p in changed_files}
    root = _absolute(new.file).parent
    direct: dict[str, list[str]] = {}
    for cell in new.cells:
        reasons = direct.setdefault(cell.id, [])
        if cell.id not in before:
            reasons.append("new cell" if old else "no usable matrix at the older commit")
        elif before[cell.id] != cell_definition(new, cell):
            reasons.append("definition changed")
        for path in cell_inputs(cell, images_dir):
            hits = sorted(f for f in changed if f == path or path in f.parents)
            reasons += [f"{_shown(f, root)} changed" for f in hits]

    def reasons_of(cell: Cell) -> tuple[str, ...]:
        reasons = list(direct[cell.id])
        below = new.lineage(cell)[1:]  # a cell whose base is rebuilt is rebuilt too
        if any(direct[c.id] for c in below):
            reasons.append(f"built on cell {below[0].id}, which is selected")
        return tuple(reasons)

    return tuple(Change(cell=c.id, reasons=reasons_of(c)) for c in new.cells if reasons_of(c))


def cell_definition(matrix: Matrix, cell: Cell) -> str:
    """Canonical JSON of the resolved cell: what the matrix says about it, wherever the file lies.

    The line number is left out (moving a cell changes nothing), paths under the matrix's folder
    are made relative to it, and the URLs of the indexes the cell installs from are added (the
    cell names an index; the URL is what pip reaches).
    """
    root = _absolute(matrix.file).parent
    data = dataclasses.asdict(cell)
    del data["line"]
    if isinstance(data.get("base"), dict):
        data["base"].pop("line", None)  # an archive base's line, for its messages: not what it is
    names = {r.index for r in (*cell.overrides, *(cell.install.requirements if cell.install else ()))}
    data["index_urls"] = {i.name: i.url for i in matrix.indexes if i.name in names}
    return json.dumps(_relative(data, root), sort_keys=True, default=str)


def cell_inputs(cell: Cell, images_dir: Path) -> tuple[Path, ...]:
    """Files and folders (absolute) the cell's build reads besides matrix.yaml."""
    images = _absolute(images_dir)
    paths = [] if cell.on_host else [images / name for name in TEMPLATES]  # a host cell renders no Dockerfile
    paths += [images / "recipes" / recipe for recipe in cell.recipes]
    if cell.install:
        paths.append(_absolute(cell.install.lock))
    return tuple(paths)


def _relative(value: Any, root: Path) -> Any:
    if isinstance(value, dict):
        return {k: _relative(v, root) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_relative(v, root) for v in value]
    if isinstance(value, Path | str):
        text = str(value)
        if text.startswith(f"{root}{os.sep}"):
            return Path(text).relative_to(root).as_posix()
    return value


def _absolute(path: Path) -> Path:
    """Absolute, with symlinks resolved: the loader resolves lock paths the same way."""
    return path.resolve()


def _shown(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)
