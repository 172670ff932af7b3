"""A side of an A/B or a sweep: `CELL` or `CELL:ARM` from the command line, resolved to the built
runtime and image that serve it (the cell's host environment, or its image on this daemon)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.errors import InfraError, InputError
from pipeline.matrix.model import Cell, Matrix

if TYPE_CHECKING:  # the A/B run (load test, numpy) is imported when a side is built: `--help` stays quick
    from stackproof.ab import Side

__all__ = ["built_side", "parse_side", "resolve_side"]


def resolve_side(matrix: Matrix, images: Path, text: str, which: str, *, python: str | None = None) -> Side:
    """`CELL` or `CELL:ARM` on the command line: the built side that serves it (`ab`'s two and `sweep`'s one)."""
    cell, arm = parse_side(matrix, text, which)
    return built_side(matrix, images, cell, arm, text, python=python)


def parse_side(matrix: Matrix, text: str, which: str) -> tuple[Cell, str | None]:
    """The cell and arm `text` names (`CELL`, `CELL:ARM`, `CELL:default`), checked before anything is built."""
    cell_id, _, arm_name = text.partition(":")
    if not cell_id:
        raise InputError(f"{which} {text!r}: give CELL or CELL:ARM")
    cell = matrix.cell(cell_id)
    if cell.serve is None:
        raise InputError(f"{which} {text!r}: cell {cell.id} has no serve spec: nothing to load")
    if arm_name and arm_name != "default":
        cell.arm(arm_name)
        return cell, arm_name
    return cell, None


def built_side(
    matrix: Matrix, images: Path, cell: Cell, arm_name: str | None, label: str, *, python: str | None = None
) -> Side:
    """The side's runtime and image: the cell's built host environment (or the existing one `python`
    belongs to, as `verify --runtime host --python` serves it), or its built image."""
    from pipeline.matrix.site import load_site
    from stackproof.ab import Side

    arm = cell.arm(arm_name) if arm_name else None
    if python is not None and not cell.on_host:
        raise InputError(f"--python {python}: only for a host cell (runtime: host); {cell.id} runs on {cell.runtime}")
    site = load_site(matrix)
    if cell.on_host:
        from pipeline.host.env import HostEnv, built_host_env, given_env, plan_host_env
        from stackproof.runjob import host_runtime
        from verify.runtime.host import remove_dead_host_runs

        for run in remove_dead_host_runs():
            print(f"stackproof: ended {run}: its run is gone", file=sys.stderr)
        env: HostEnv | None
        if python is not None:
            env = given_env(python)  # a missing or broken interpreter is exit 2 before anything starts
        elif cell.install is None:
            raise InputError(
                f"{matrix.file}:{cell.line}: cells[{cell.id}] has no `install:` to build a host environment "
                "from: pass --python PY (the environment it was verified with)"
            )
        else:
            env = built_host_env(plan_host_env(matrix, cell, images))
        if env is None:
            raise InfraError(f"{cell.id}: its host environment is not built: run `stackproof build {cell.id}`")
        return Side(label=label, cell=cell, arm=arm, runtime=host_runtime(matrix, cell, env), image=env.ref)
    from pipeline.build.image import built_image
    from pipeline.docker.client import Docker
    from pipeline.host.modelstore import ensure_model
    from verify.runtime import as_runtime

    docker = Docker.connect()
    tag = built_image(docker, matrix, cell, site, images)[0].tag
    assert cell.serve is not None
    ensure_model(cell.serve.model, where=f"{matrix.file}:{cell.line}: cells[{cell.id}].serve.model")
    return Side(label=label, cell=cell, arm=arm, runtime=as_runtime(docker), image=tag)
