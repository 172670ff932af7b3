"""Stage `startup` (its first part): start the server, wait for readiness, answer one completion.

The container is removed on every path. Log rules and failure signatures (a later issue) plug in
here, over the same server log.
"""

from __future__ import annotations

import time
from pathlib import Path

from pipeline.engine import Engine
from pipeline.errors import CheckFailed
from pipeline.model import Arm, Cell
from verify.result import CheckResult, StageResult, Status
from verify.server import ServerContainer

__all__ = ["run_startup"]

STAGE = "startup"


def run_startup(engine: Engine, cell: Cell, image: str, *, arm: Arm | None, out_dir: Path) -> StageResult:
    started = time.monotonic()
    if cell.serve is None:
        check = CheckResult(name="serve", status=Status.SKIP, message="the cell has no serve spec")
        return StageResult.of(STAGE, [check], time.monotonic() - started)
    checks: list[CheckResult] = []
    with ServerContainer(engine, cell, image, out_dir=out_dir, arm=arm) as server:
        try:
            readiness = server.wait_ready()
            checks.append(
                CheckResult(
                    name="readiness",
                    status=Status.PASS,
                    message=f"/health answered 200 after {readiness.seconds:.0f}s",
                    evidence={"seconds": readiness.seconds, "url": readiness.url},
                )
            )
            completion = server.complete()
            checks.append(
                CheckResult(
                    name="completion",
                    status=Status.PASS,
                    message=f"{completion['completion_tokens']} tokens answered",
                    evidence=completion,
                )
            )
        except CheckFailed as exc:
            checks.append(
                CheckResult(
                    name="readiness" if not checks else "completion",
                    status=Status.FAIL,
                    message=str(exc).splitlines()[0],
                    evidence={"last_log_lines": server.last_lines().splitlines()},
                )
            )
    return StageResult.of(STAGE, checks, time.monotonic() - started, server_log=str(server.log_path))
