"""Stage `startup`: start the server, wait for readiness, answer one completion, judge the logs.

The server log streams through a `LogWatcher` (a known-fatal signature ends the readiness wait
at once); after teardown the whole log is judged against the cell's, the arm's and the built-in
rule sets and the signature catalog, and the kernel log (where readable) against the kernel
signatures. The container is removed on every path.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from pathlib import Path

from pipeline.matrix.model import Arm, Cell
from pipeline.result import CheckResult, StageResult, Status
from verify.logs.catalog import Facts, Signature, catalog_for, rules_for
from verify.logs.kernellog import read_kernel_log
from verify.logs.logscan import LogWatcher, judge, scan
from verify.runtime import Runtime
from verify.stages.autotune import fresh_cache_server_options
from verify.stages.server import Server, ServerFactory, ServerFailed, SharedServer

__all__ = ["run_startup", "warm_cache_not_reused"]

STAGE = "startup"


def run_startup(
    runtime: Runtime,
    cell: Cell,
    image: str,
    *,
    arm: Arm | None,
    out_dir: Path,
    facts: Facts,
    share: SharedServer | None = None,
    keep: bool = False,
    tune: bool = False,
    new_server: ServerFactory = Server,
) -> StageResult:
    """With `keep`, a server that passed is kept running in `share` for later stages (autotune,
    load) instead of removed; the log is then judged as it stands (the load stage judges the rest).
    With `tune`, the server starts with a fresh autotune cache for the autotune stage to judge."""
    started = time.monotonic()
    if cell.serve is None:
        check = CheckResult(name="serve", status=Status.SKIP, message="the cell has no serve spec")
        return StageResult.of(STAGE, [check], time.monotonic() - started)
    signatures = catalog_for(facts)
    checks: list[CheckResult] = []
    since = time.time()
    watcher = LogWatcher(signatures)
    server = new_server(
        runtime,
        cell,
        image,
        out_dir=out_dir,
        arm=arm,
        watcher=watcher,
        on_start=share.note_start if share else None,
        **(fresh_cache_server_options(cell, facts.engine_version) if tune else {}),
    )
    kept = False
    try:
        server.start()
        ready = server.wait_ready()
        message = f"{server.driver.endpoints.health} answered 200 after {ready.seconds:.0f}s"
        evidence: dict[str, object] = {"seconds": ready.seconds, "url": ready.url}
        checks.append(CheckResult(name="readiness", status=Status.PASS, message=message, evidence=evidence))
        completion = server.complete()
        message = f"{completion['completion_tokens']} tokens answered"
        checks.append(CheckResult(name="completion", status=Status.PASS, message=message, evidence=completion))
        if keep and share is not None:
            share.keep(server)
            kept = True
    except ServerFailed as exc:
        name = "completion" if checks else "readiness"
        evidence = {"last_log_lines": exc.last_lines}
        checks.append(CheckResult(name=name, status=Status.FAIL, message=exc.reason, evidence=evidence))
    finally:
        if not kept:
            server.remove()
    log = server.log_path.read_bytes() if server.log_path.exists() else b""
    reload_failure = warm_cache_not_reused(server, log)
    if reload_failure is not None and share is not None:
        share.note_not_reused(server, reload_failure)
    rules = rules_for(cell, arm, facts)
    checks += judge(scan(log, rules, [s for s in signatures if s.source == "server"]), rules)
    checks.append(_kernel_check(since, signatures))
    return StageResult.of(STAGE, checks, time.monotonic() - started, server_log=str(server.log_path))


def warm_cache_not_reused(server: Server, log: bytes) -> str | None:
    """The server log's line saying the engine failed to load its warm compile-cache slot and
    compiled again (the driver's `reload_failed` at its release: verify/serving/vllm.py); None when
    the start was not warm, the release has no such line, or its log does not say it."""
    if server.cache_use is None or not server.cache_use.warm or server.cache_facts is None:
        return None
    text = log.decode("utf-8", errors="replace")
    found = re.search(server.cache_facts.reload_failed, text)
    if found is None:
        return None
    start = text.rfind("\n", 0, found.start()) + 1  # the whole line, its logger prefix too
    return text[start:].split("\n", 1)[0].strip()


def _kernel_check(since: float, signatures: Sequence[Signature]) -> CheckResult:
    data, source = read_kernel_log(since)
    if data is None:
        return CheckResult(name="kernel-log", status=Status.SKIP, message=source)
    kernel = [s for s in signatures if s.source == "kernel"]
    verdict = judge(scan(data, (), kernel), (), source=source)[-1]
    return CheckResult(name="kernel-log", status=verdict.status, message=verdict.message, evidence=verdict.evidence)
