"""The jobs that touch images: `verify` (stages against a built image) and `run` (build + verify).

`run` is the main job: build the cell (or reuse its content tag), then its stages in order —
imports (no server), startup (server, readiness, one completion, teardown), autotune (GPU cells),
load (a short load run on a fresh server) — stopping at the first failure. The cell's `expect`
decides whether that outcome passes the pipeline.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pipeline.build import build_cell
from pipeline.engine import Engine
from pipeline.errors import InputError
from pipeline.model import Cell, LoadSpec, Matrix
from pipeline.plan import plan_cell, python_of
from pipeline.site import SiteSettings
from verify.result import VerifyReport
from verify.runner import verify_image

__all__ = ["run_cell", "verify_cell"]


def run_cell(
    engine: Engine,
    matrix: Matrix,
    cell: Cell,
    site: SiteSettings,
    images_dir: Path,
    *,
    out_root: Path,
    stages: tuple[str, ...],
    arm_name: str | None = None,
    previous: Path | None = None,
    load: LoadSpec | None = None,
) -> VerifyReport:
    arm = cell.arm(arm_name) if arm_name else None
    build = build_cell(engine, matrix, cell, site, images_dir, out_dir=out_root / cell.id)
    return verify_image(
        engine,
        cell,
        image=build.tag,
        image_id=build.image_id,
        python=python_of(matrix, cell),
        stages=stages,
        arm=arm,
        out_dir=_run_dir(out_root, cell),
        previous=previous,
        load=load,
    )


def verify_cell(
    engine: Engine,
    matrix: Matrix,
    cell: Cell,
    site: SiteSettings,
    images_dir: Path,
    *,
    out_root: Path,
    stages: tuple[str, ...],
    arm_name: str | None = None,
    previous: Path | None = None,
    load: LoadSpec | None = None,
) -> VerifyReport:
    """Verify the cell's already-built image (its content tag); nothing is built."""
    arm = cell.arm(arm_name) if arm_name else None
    tag = plan_cell(matrix, cell, site, images_dir).tag
    image = engine.image(tag)
    if image is None:
        raise InputError(f"{cell.id}: image {tag} is not built: run `stackproof build {cell.id}` (or `stackproof run`)")
    print(f"{cell.id}: verifying {tag} ({image.id[:19]})", file=sys.stderr)
    return verify_image(
        engine,
        cell,
        image=tag,
        image_id=image.id,
        python=python_of(matrix, cell),
        stages=stages,
        arm=arm,
        out_dir=_run_dir(out_root, cell),
        previous=previous,
        load=load,
    )


def _run_dir(out_root: Path, cell: Cell) -> Path:
    return out_root / cell.id / time.strftime("run-%Y%m%dT%H%M%S")
