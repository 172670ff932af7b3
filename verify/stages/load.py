"""Stage `load`: a short load run: questions, stall watchdog, determinism, statistics.

The server is the startup stage's, kept running for it, or (when autotune started a server in
between, or load runs alone) a fresh one started the same way. The load runs against it with the
container's state watched beside the /metrics scrapes, and it is removed on every path. What the
run measured goes to `load.json` (the receipt's load section), `requests.jsonl` and
`scrapes.jsonl` in the stage's directory.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path

from pipeline.findings import LoadSection
from pipeline.matrix.model import Arm, Cell, LoadSpec
from pipeline.result import CheckResult, StageResult, Status
from verify.forensics.stall import LoadInstruments
from verify.load.canary import CanaryAnswer
from verify.load.correctness import ask_for_cell, judge_correctness
from verify.load.outcome import LoadTarget
from verify.load.run import run_load
from verify.load.summary import judge_load, summarise_load
from verify.logs.catalog import Facts, catalog_for
from verify.logs.logscan import LogWatcher, judge, scan
from verify.runtime import Runtime
from verify.stages.server import Server, ServerFailed

__all__ = ["load_target", "run_load_stage"]

STAGE = "load"


def load_target(server: Server, cell: Cell, arm: Arm | None, *, engine_version: str | None = None) -> LoadTarget:
    """What the load run may know about this server beyond HTTP: its engine, container, log and env."""

    def server_alive() -> str | None:
        status, code = server.state()
        if status in ("running", "created"):
            return None
        return f"{status} (exit code {code})"

    return LoadTarget(
        base_url=server.base_url,
        label=f"{cell.id}{'/' + arm.name if arm else ''}",
        driver=server.driver,
        engine_version=engine_version,
        batch_invariant=server.driver.batch_invariant(cell.serve_env(arm)),
        gpu=cell.is_gpu,
        server_alive=server_alive,
        # 2000 lines: the watchdog keeps the last 30 as evidence; the engine-death cause (verify/load/death.py)
        # lies above the failed requests' lines and tracebacks (a real SGLang kill: 870 lines after it).
        last_log_lines=lambda: server.last_lines(2000).splitlines(),
    )


def _ready(server: Server, *, reused: bool) -> CheckResult:
    """The readiness check: the startup stage's server as it is, else a fresh one started and waited for
    (`ServerFailed` when it never gets ready)."""
    if reused:
        return CheckResult(
            name="readiness",
            status=Status.PASS,
            message=f"the startup stage's server, kept running ({server.name})",
            evidence={"reused": True, "url": server.base_url},
        )
    server.start()
    ready = server.wait_ready()
    return CheckResult(
        name="readiness",
        status=Status.PASS,
        message=f"ready after {ready.seconds:.0f}s",
        evidence={"seconds": ready.seconds, "reused": False},
    )


def run_load_stage(
    runtime: Runtime,
    cell: Cell,
    image: str,
    *,
    arm: Arm | None,
    out_dir: Path,
    spec: LoadSpec | None = None,
    shared: Server | None = None,
    on_ready: Callable[[Server], None] | None = None,  # fault-injection tests use it
    facts: Facts | None = None,
    on_start: Callable[[Server], None] | None = None,
) -> StageResult:
    """Load `shared` (the startup stage's server, still running) when given, else a fresh server.

    Either way the server is removed at the end and its whole log is scanned for failure
    signatures: a fault under load often shows only in the log (an illegal memory access, a
    watchdog timeout) while the API still answers.
    """
    started = time.monotonic()
    if cell.serve is None:
        check = CheckResult(name="load", status=Status.SKIP, message="the cell has no serve spec")
        return StageResult.of(STAGE, [check], 0.0)
    spec = spec or cell.serve.load
    stage_dir = out_dir / "load"
    stage_dir.mkdir(parents=True, exist_ok=True)
    checks: list[CheckResult] = []
    signatures = catalog_for(facts)
    server = shared or Server(
        runtime, cell, image, out_dir=stage_dir, arm=arm, watcher=LogWatcher(signatures), on_start=on_start
    )
    artifacts: dict[str, str] = {"server_log": str(server.log_path)}
    outcome = None
    canaries: list[CanaryAnswer] = []
    # GPU cost sampled beside the load; stall forensics taken before the server is removed.
    instruments = LoadInstruments.for_cell(runtime, cell, run_dir=out_dir)
    try:
        checks.append(_ready(server, reused=shared is not None))
        if on_ready is not None:
            on_ready(server)
        instruments.start(server.name)
        target = dataclasses.replace(
            load_target(server, cell, arm, engine_version=facts.engine_version if facts else None),
            on_stall=instruments.on_stall(server.name, image),
        )
        outcome = run_load(target, spec, stage_dir)
        canaries = ask_for_cell(target.base_url, outcome, spec, driver=target.driver)
    except ServerFailed as exc:
        evidence = {"last_log_lines": exc.last_lines}
        checks.append(CheckResult(name="readiness", status=Status.FAIL, message=exc.reason, evidence=evidence))
    finally:
        instruments.stop()  # the GPU sampler ends with the load, on every path
        server.remove()
    section: LoadSection | None = None
    if outcome is not None:
        typed = summarise_load(outcome, spec)
        load_checks = judge_load(outcome, typed, batch_invariant=target.batch_invariant)
        correctness, correctness_section = judge_correctness(
            cell, arm, spec, outcome, [*checks, *load_checks], canaries, source=image
        )
        # load.json: the summary, then the cost sampled over it, then the correctness judged from it
        section = LoadSection(summary=typed, cost=instruments.cost_of(outcome, typed), correctness=correctness_section)
        summary_path = stage_dir / "load.json"
        summary_path.write_text(json.dumps(section.to_json(), indent=2) + "\n")
        checks += load_checks + correctness
        artifacts.update(outcome.files, summary=str(summary_path))
    log = server.log_path.read_bytes() if server.log_path.exists() else b""
    server_signatures = [s for s in signatures if s.source == "server"]
    checks += [c for c in judge(scan(log, (), server_signatures), ()) if c.name == "signatures"]
    result = StageResult.of(STAGE, checks, time.monotonic() - started, load_section=section)
    return dataclasses.replace(result, artifacts=dict(artifacts))  # names `of` would read as its own keywords
