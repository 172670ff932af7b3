"""This site's runner labels: the matrix's `runner` labels mapped onto the runners a site really has.

matrix.yaml names runners the way GitHub's self-hosted runners are labelled by default
(`[self-hosted, linux, x64, gpu, sm90]`). A fleet whose runners carry other labels (ARC runner
scale sets carry exactly one: the scale set's name, and none of the default ones) maps them in a
site file named by `STACKPROOF_RUNNER_LABELS`, never in matrix.yaml:

    schema_version: 1
    labels:            # a matrix label -> this site's labels ([] drops it)
      self-hosted: []
      linux: []
      x64: []
      gpu: []
      sm90: [arc-h200]
    cells:             # optional: a cell's whole label list, replacing the mapped one
      cpu-tiny: [arc-cpu]
    build:             # the CPU runners that build and push the cells' images (verify.yml), per platform
      linux/amd64: [arc-cpu]
      linux/arm64: [arc-cpu-arm]

`build` may also be one list for every platform. Without it a cell of `linux/amd64` is built on
`[self-hosted, linux, x64, docker]` and one of `linux/arm64` on `[self-hosted, linux, arm64, docker]`:
the image is built natively, never emulated.

Pure apart from reading that one file; errors name the file, line and field (exit 2).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.errors import InputError
from pipeline.matrix.model import Cell, Matrix
from pipeline.matrix.yamlsrc import YamlSource, load_site_file

__all__ = ["DEFAULT_BUILD_LABELS", "RunnerLabels", "load_runner_labels"]

# The CPU runner that builds in verify.yml when no site file says otherwise: the default labels of a
# self-hosted Linux runner of the cell's architecture plus `docker`, as the report job already uses.
DEFAULT_BUILD_LABELS = ("self-hosted", "linux", "{arch}", "docker")
_RUNNER_ARCH = {"amd64": "x64", "arm64": "arm64"}  # GitHub's default architecture labels
_KEYS = ("schema_version", "labels", "cells", "build")


@dataclass(frozen=True, kw_only=True)
class RunnerLabels:
    file: Path | None = None
    labels: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    cells: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    build: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # platform (or "*") -> labels

    def for_cell(self, cell: Cell) -> tuple[str, ...]:
        """The `runs-on` labels of `cell`'s verify job at this site (order kept, duplicates dropped)."""
        if cell.id in self.cells:
            return self.cells[cell.id]
        mapped: list[str] = []
        for label in cell.runner:
            for name in self.labels.get(label, (label,)):
                if name not in mapped:
                    mapped.append(name)
        if cell.runner and not mapped:
            raise InputError(
                f"{self.file}: labels: every runner label of cell {cell.id} ({', '.join(cell.runner)}) maps to "
                "nothing: a job needs at least one label to run on"
            )
        return tuple(mapped)

    def build_for(self, platform: str) -> tuple[str, ...]:
        """The `runs-on` labels of the CPU job that builds an image for `platform`."""
        found = self.build.get(platform) or self.build.get("*")
        if found:
            return found
        arch = platform.rpartition("/")[2]
        return tuple(label.format(arch=_RUNNER_ARCH.get(arch, arch)) for label in DEFAULT_BUILD_LABELS)


def load_runner_labels(path: Path, matrix: Matrix) -> RunnerLabels:
    """Read and check a runner label file (see the module docstring)."""
    source = load_site_file(path, named=f"STACKPROOF_RUNNER_LABELS: {path}", what="a runner label file", keys=_KEYS)
    data = source.data
    labels = {str(k): _label_list(source, ("labels", k), v) for k, v in _mapping(source, "labels").items()}
    cells = {}
    for cell_id, value in _mapping(source, "cells").items():
        known = [c.id for c in matrix.cells]
        if cell_id not in known:
            close = difflib.get_close_matches(str(cell_id), known, n=1)
            hint = f", did you mean {close[0]!r}?" if close else ""
            raise InputError(f"{source.where(('cells', cell_id))}: {matrix.file} declares no such cell{hint}")
        cells[str(cell_id)] = _label_list(source, ("cells", cell_id), value, allow_empty=False)
    build: dict[str, tuple[str, ...]] = {}
    if isinstance(data.get("build"), dict):
        for platform, value in data["build"].items():
            if not isinstance(platform, str) or not platform.startswith("linux/"):
                raise InputError(f"{source.where(('build', platform))}: a platform such as linux/amd64")
            build[platform] = _label_list(source, ("build", platform), value, allow_empty=False)
    elif "build" in data:
        build["*"] = _label_list(source, ("build",), data["build"], allow_empty=False)
    return RunnerLabels(file=path, labels=labels, cells=cells, build=build)


def _mapping(source: YamlSource, key: str) -> dict[Any, Any]:
    value = source.data.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InputError(f"{source.where((key,))}: a mapping of label -> list of labels")
    return value


def _label_list(source: YamlSource, path: tuple[Any, ...], value: Any, *, allow_empty: bool = True) -> tuple[str, ...]:
    """A list of labels as GitHub accepts them: non-empty strings without spaces or commas."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or (not value and not allow_empty):
        what = "a list of labels" if allow_empty else "a non-empty list of labels"
        raise InputError(f"{source.where(path)}: {what}")
    for i, label in enumerate(value):
        if not isinstance(label, str) or not label or any(c.isspace() or c == "," for c in label):
            raise InputError(f"{source.where((*path, i))}: {label!r} is not a runner label")
    return tuple(value)
