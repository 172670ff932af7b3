"""Stage `load`: a short load run on a fresh server: questions, stall watchdog, determinism, statistics.

The server is started like `startup` starts it (the same container, log and fatal-signature
watcher), the load runs against it with the container's state watched beside the /metrics
scrapes, and it is removed on every path. What the run measured goes to `load.json` (the receipt's
load section), `requests.jsonl` and `scrapes.jsonl` in the stage's directory.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from pipeline.engine import Engine
from pipeline.model import Arm, Cell, LoadSpec
from verify.loadrun import LoadTarget, judge_load, run_load, summarise
from verify.logscan import LogWatcher, load_catalog
from verify.result import CheckResult, StageResult, Status
from verify.server import ServerContainer, ServerFailed

__all__ = ["load_target", "run_load_stage"]

STAGE = "load"


def load_target(server: ServerContainer, cell: Cell, arm: Arm | None) -> LoadTarget:
    """What the load run may know about this server beyond HTTP: its container, its log, its env."""

    def server_alive() -> str | None:
        status, code = server.state()
        if status in ("running", "created"):
            return None
        return f"{status} (exit code {code})"

    return LoadTarget(
        base_url=server.base_url,
        label=f"{cell.id}{'/' + arm.name if arm else ''}",
        batch_invariant=cell.serve_env(arm).get("VLLM_BATCH_INVARIANT") == "1",
        gpu=cell.is_gpu,
        server_alive=server_alive,
        last_log_lines=lambda: server.last_lines(30).splitlines(),
    )


def run_load_stage(
    engine: Engine,
    cell: Cell,
    image: str,
    *,
    arm: Arm | None,
    out_dir: Path,
    spec: LoadSpec | None = None,
    on_ready: Any = None,  # called with the server once it is ready: fault-injection tests use it
) -> StageResult:
    started = time.monotonic()
    if cell.serve is None:
        check = CheckResult(name="load", status=Status.SKIP, message="the cell has no serve spec")
        return StageResult.of(STAGE, [check], 0.0)
    spec = spec or cell.serve.load
    stage_dir = out_dir / "load"
    checks: list[CheckResult] = []
    server = ServerContainer(engine, cell, image, out_dir=stage_dir, arm=arm, watcher=LogWatcher(load_catalog()))
    artifacts: dict[str, str] = {"server_log": str(server.log_path)}
    with server:
        try:
            ready = server.wait_ready()
        except ServerFailed as exc:
            evidence = {"last_log_lines": exc.last_lines}
            checks.append(CheckResult(name="readiness", status=Status.FAIL, message=exc.reason, evidence=evidence))
            return StageResult.of(STAGE, checks, time.monotonic() - started, **artifacts)
        checks.append(
            CheckResult(
                name="readiness",
                status=Status.PASS,
                message=f"ready after {ready.seconds:.0f}s",
                evidence={"seconds": ready.seconds},
            )
        )
        if on_ready is not None:
            on_ready(server)
        target = load_target(server, cell, arm)
        outcome = run_load(target, spec, stage_dir)
    summary = summarise(outcome, spec)
    summary_path = stage_dir / "load.json"
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    checks += judge_load(outcome, summary, batch_invariant=target.batch_invariant)
    artifacts.update(outcome.files, summary=str(summary_path))
    return StageResult.of(STAGE, checks, time.monotonic() - started, **artifacts)


def with_overrides(spec: LoadSpec, **changes: Any) -> LoadSpec:
    """The cell's load spec with command-line overrides (None = keep the cell's value)."""
    return replace(spec, **{k: v for k, v in changes.items() if v is not None})
