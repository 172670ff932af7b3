"""The main job: build a cell, start its server, prove it answers, tear it down on every path.

Later stages (imports, startup, autotune, load) plug in between readiness and teardown.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.build import BuildResult, build_cell
from pipeline.engine import Engine
from pipeline.errors import CheckFailed, InputError
from pipeline.model import Cell, Matrix
from pipeline.site import SiteSettings
from verify.server import ServerContainer

__all__ = ["RunResult", "run_cell"]


@dataclass(frozen=True, kw_only=True)
class RunResult:
    cell: str
    arm: str | None
    image: str
    image_id: str
    build: dict[str, object]
    readiness_seconds: float
    completion: dict[str, object]
    seconds: float
    out_dir: str

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def run_cell(
    engine: Engine,
    matrix: Matrix,
    cell: Cell,
    site: SiteSettings,
    images_dir: Path,
    *,
    out_root: Path,
    arm_name: str | None = None,
) -> RunResult:
    if cell.serve is None:
        raise InputError(f"{matrix.file}:{cell.line}: cell {cell.id!r} has no serve spec, so it cannot run")
    arm = cell.arm(arm_name) if arm_name else None
    started = time.monotonic()
    cell_dir = out_root / cell.id
    build: BuildResult = build_cell(engine, matrix, cell, site, images_dir, out_dir=cell_dir)
    run_dir = cell_dir / time.strftime("run-%Y%m%dT%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "run.json").write_text(json.dumps({"cell": cell.id, "image": build.tag, "status": "started"}) + "\n")
    with ServerContainer(engine, cell, build.tag, out_dir=run_dir, arm=arm) as server:
        readiness = server.wait_ready()
        completion = server.complete()
        print(
            f"{cell.id}: completion {completion['completion_tokens']} tokens: {completion['text']!r}", file=sys.stderr
        )
    result = RunResult(
        cell=cell.id,
        arm=arm.name if arm else None,
        image=build.tag,
        image_id=build.image_id,
        build=build.to_json(),
        readiness_seconds=readiness.seconds,
        completion=completion,
        seconds=round(time.monotonic() - started, 1),
        out_dir=str(run_dir),
    )
    (run_dir / "run.json").write_text(json.dumps({**result.to_json(), "status": "pass"}, indent=2) + "\n")
    if cell.expect is not None:
        raise CheckFailed(
            f"{cell.id}: expected to fail at stage {cell.expect.stage!r} ({cell.expect.reason}) but the run passed"
        )
    return result
