"""Which cell goes where: each cell's request (arch -> GRES, constraint, partition; its GPU count)
at a fleet site, decided before anything is submitted. Pure: no scheduler is asked here.

A cell whose arch the site does not serve is refused with every other such cell in one exit 2,
naming each and what the cluster offers; nothing is submitted for any of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.errors import InputError
from pipeline.fleet.site import ArchPlacement, FleetSite
from pipeline.matrix.model import Cell

__all__ = ["Placement", "gpu_count", "plan_cells"]

# The flags a vLLM or SGLang server spreads a model over GPUs with (vllm/engine/arg_utils.py
# `--tensor-parallel-size`/`-tp`, `--pipeline-parallel-size`/`-pp`; sglang server_args.py `--tp-size`).
_PARALLEL_FLAGS = {
    "--tensor-parallel-size": "tp",
    "-tp": "tp",
    "--tp-size": "tp",
    "--tp": "tp",
    "--pipeline-parallel-size": "pp",
    "-pp": "pp",
}


@dataclass(frozen=True, kw_only=True)
class Placement:
    """One cell's job request."""

    cell: str
    arch: str
    gpus: int  # 0 for a CPU cell
    gres: str | None  # the full request, `gpu:h100:2`
    constraint: str | None
    partition: str | None

    def describe(self) -> str:
        parts = [
            f"{k}={v}"
            for k, v in (("gres", self.gres), ("constraint", self.constraint), ("partition", self.partition))
            if v
        ]
        return ", ".join(parts) or "any node"


def gpu_count(cell: Cell) -> int:
    """GPUs one server of `cell` uses: tensor x pipeline parallel size from its serve args (1 each
    when absent); 0 for a CPU cell."""
    if not cell.is_gpu:
        return 0
    sizes = {"tp": 1, "pp": 1}
    args = list(cell.serve.args) if cell.serve else []
    for i, token in enumerate(args):
        flag, _, inline = token.partition("=")
        if flag in _PARALLEL_FLAGS:
            value = inline or (args[i + 1] if i + 1 < len(args) else "")
            if value.isdigit() and int(value) > 0:
                sizes[_PARALLEL_FLAGS[flag]] = int(value)
    return sizes["tp"] * sizes["pp"]


def plan_cells(cells: list[Cell], site: FleetSite) -> list[Placement]:
    """Each cell's placement; exit 2 naming every cell the site cannot serve (and what it offers)."""
    refused = [c for c in cells if c.arch not in site.arch]
    if refused:
        names = ", ".join(f"{c.id} (arch {c.arch})" for c in refused)
        raise InputError(
            f"{site.file}:{site.arch_line}: arch: no node of this site serves {names}; "
            f"the site offers {site.offers()}. Nothing was submitted."
        )
    return [_place(cell, site.arch[cell.arch], site) for cell in cells]


def _place(cell: Cell, where: ArchPlacement, site: FleetSite) -> Placement:
    gpus = gpu_count(cell)
    gres = f"{where.gres}:{gpus}" if where.gres and gpus else None
    if cell.is_gpu and where.gres is None and where.constraint is None and where.partition is None:
        raise InputError(
            f"{site.file}:{where.line}: arch.{where.arch}: GPU arch {where.arch} maps to any node: give it a gres, "
            f"constraint or partition, or cell {cell.id} may land on a node without its GPU"
        )
    return Placement(
        cell=cell.id, arch=cell.arch, gpus=gpus, gres=gres, constraint=where.constraint, partition=where.partition
    )
