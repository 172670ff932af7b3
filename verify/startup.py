"""Stage `startup` (its first part): start the server, wait for readiness, answer one completion.

The container is removed on every path. Log rules and failure signatures (a later issue) plug in
here, over the same server log.
"""

from __future__ import annotations

import time
from pathlib import Path

from pipeline.engine import Engine
from pipeline.model import Arm, Cell
from verify.result import CheckResult, StageResult, Status
from verify.server import ServerContainer, ServerFailed

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
            ready = server.wait_ready()
            message = f"/health answered 200 after {ready.seconds:.0f}s"
            evidence: dict[str, object] = {"seconds": ready.seconds, "url": ready.url}
            checks.append(CheckResult(name="readiness", status=Status.PASS, message=message, evidence=evidence))
            completion = server.complete()
            message = f"{completion['completion_tokens']} tokens answered"
            checks.append(CheckResult(name="completion", status=Status.PASS, message=message, evidence=completion))
        except ServerFailed as exc:
            name = "completion" if checks else "readiness"
            evidence = {"last_log_lines": exc.last_lines}
            checks.append(CheckResult(name=name, status=Status.FAIL, message=exc.reason, evidence=evidence))
    return StageResult.of(STAGE, checks, time.monotonic() - started, server_log=str(server.log_path))
