"""The fleet site file: what a cluster offers, per GPU arch, the way the runner-label file maps a
matrix's runner labels onto a site's runners (pipeline/matrix/runners.py).

    schema_version: 1
    scheduler: slurm
    shared_dir: /shared/stackproof-fleet   # every node reads and writes it: job scripts, outputs, receipts
    time_limit_min: 60                     # each job's Slurm --time (optional, default 60)
    setup: ["source /opt/venvs/stackproof/bin/activate"]   # shell lines a job runs first (optional)
    python: /usr/bin/python3.11            # the nodes' interpreter with stackproof (default: this one)
    arch:                                  # a cell's `arch` -> how to ask the scheduler for it
      none:  {partition: cpu}
      sm90:  {gres: "gpu:h100", constraint: sm90, partition: gpu}
      sm120: {gres: "gpu:rtx5090"}

An arch the file does not name is one no node of this site serves: such a cell is refused before
anything is submitted (plan.py). Pure apart from reading the file; every error names the file, line
and field (exit 2).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.errors import InputError
from pipeline.matrix.yamlsrc import YamlSource, known_keys, load_site_file

__all__ = ["SCHEDULERS", "ArchPlacement", "FleetSite", "load_fleet_site"]

SCHEDULERS = ("slurm",)  # kubernetes: on paper (docs/fleet.md) until a real API server can be had
_KEYS = ("schema_version", "scheduler", "shared_dir", "time_limit_min", "setup", "python", "arch")
_ARCH_KEYS = ("gres", "constraint", "partition")
# Slurm's own spellings: a GRES `name:type` (slurm.conf GresTypes, gres.conf Type), a feature
# expression of names joined by & | (sbatch --constraint), a partition name.
_GRES = re.compile(r"^[A-Za-z0-9_.-]+(:[A-Za-z0-9_.-]+)?$")
_CONSTRAINT = re.compile(r"^[A-Za-z0-9_.-]+([&|][A-Za-z0-9_.-]+)*$")
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_ARCH = re.compile(r"^(none|sm[0-9]+[a-z]?)$")


@dataclass(frozen=True, kw_only=True)
class ArchPlacement:
    """How to ask for a node of one arch: a GRES `name:type` (the cell's GPU count is appended), a
    feature constraint, a partition; any may be absent (a CPU arch usually names a partition only)."""

    arch: str
    gres: str | None = None
    constraint: str | None = None
    partition: str | None = None
    line: int = 0

    def describe(self) -> str:
        parts = [
            f"{k}={v}"
            for k, v in (("gres", self.gres), ("constraint", self.constraint), ("partition", self.partition))
            if v
        ]
        return f"{self.arch} ({', '.join(parts) or 'any node'})"


@dataclass(frozen=True, kw_only=True)
class FleetSite:
    file: Path
    scheduler: str
    shared_dir: Path
    time_limit_min: int = 60
    setup: tuple[str, ...] = ()
    python: str | None = None
    arch: Mapping[str, ArchPlacement] = field(default_factory=dict)
    arch_line: int = 1  # where `arch:` is written (a refusal names it)

    def offers(self) -> str:
        """What the cluster offers, in one line (for a refusal)."""
        return "; ".join(p.describe() for p in self.arch.values()) or "nothing (no `arch:` entries)"


def load_fleet_site(path: Path) -> FleetSite:
    """Read and check a fleet site file (see the module docstring)."""
    source = load_site_file(path, named=f"--site {path}", what="a fleet site file", keys=_KEYS)
    data = source.data
    scheduler = data.get("scheduler")
    if scheduler not in SCHEDULERS:
        raise InputError(
            f"{source.where(('scheduler',))}: {scheduler!r} is not a scheduler here (known: {', '.join(SCHEDULERS)})"
        )
    shared = data.get("shared_dir")
    if not isinstance(shared, str) or not shared.startswith("/"):
        raise InputError(f"{source.where(('shared_dir',))}: an absolute directory every node can read and write")
    limit = data.get("time_limit_min", 60)
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 7 * 24 * 60:
        raise InputError(f"{source.where(('time_limit_min',))}: whole minutes, 1 to 10080")
    setup = data.get("setup", [])
    if isinstance(setup, str):
        setup = [setup]
    if not isinstance(setup, list) or not all(isinstance(s, str) and "\n" not in s for s in setup):
        raise InputError(f"{source.where(('setup',))}: a list of shell lines, one line each")
    python = data.get("python")
    if python is not None and (not isinstance(python, str) or not python.startswith("/")):
        raise InputError(f"{source.where(('python',))}: an absolute path to the nodes' python")
    return FleetSite(
        file=path,
        scheduler=str(scheduler),
        shared_dir=Path(shared),
        time_limit_min=limit,
        setup=tuple(setup),
        python=python,
        arch=_arches(source, data.get("arch")),
        arch_line=source.line_of(("arch",)),
    )


def _arches(source: YamlSource, value: Any) -> dict[str, ArchPlacement]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InputError(f"{source.where(('arch',))}: a mapping of arch (none, sm90, ...) -> gres/constraint/partition")
    out: dict[str, ArchPlacement] = {}
    for arch, entry in value.items():
        if not isinstance(arch, str) or not _ARCH.match(arch):
            raise InputError(
                f"{source.where(('arch', arch))}: {arch!r} is not an arch (none, or sm followed by digits)"
            )
        entry = entry or {}
        if not isinstance(entry, dict):
            raise InputError(f"{source.where(('arch', arch))}: a mapping with gres, constraint and/or partition")
        known_keys(source, ("arch", arch), entry, _ARCH_KEYS)
        checks = (
            ("gres", _GRES, "a GRES name:type such as gpu:h100"),
            ("constraint", _CONSTRAINT, "feature names joined by & or |"),
            ("partition", _NAME, "a partition name"),
        )
        for key, pattern, what in checks:
            text = entry.get(key)
            if text is not None and (not isinstance(text, str) or not pattern.match(text)):
                raise InputError(f"{source.where(('arch', arch, key))}: {text!r} is not {what}")
        out[arch] = ArchPlacement(
            arch=arch, line=source.line_of(("arch", arch)), **{k: entry.get(k) for k in _ARCH_KEYS}
        )
    return out
