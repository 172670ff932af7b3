"""Stage `autotune`: a server that started with a fresh, empty autotune cache; judge what FlashInfer wrote.

Where the engine takes the cache root from, how it announces the file and how the file is laid
out are the serving driver's (`AutotuneFacts`, keyed by the engine's release); an engine without a
FlashInfer autotune cache SKIPs this stage. The cache directory is an anonymous volume at the
driver's cache variable inside the server container, and the file is read out with `docker cp`
while the container still exists: FlashInfer writes it as the image's user (root) with mode 0600
(`tempfile.mkstemp` then `os.replace`), which an ordinary runner user could neither read nor
delete through a bind mount. On the host runtime the same path is a directory of the server's own
(`Runtime.seen_as` says which: the server logs that path), copied out before it is removed.

What FlashInfer wrote is a legacy file (kept as autotune_configs.json) or, with vLLM 0.33 and
FlashInfer's autotune_v2, a managed store directory (kept whole as autotune-store/<env_hash>); both
are read by `verify.kernels.autotune.read_cache` into the same winners.

The server is the startup stage's when the plan says it carried the fresh cache (the usual case,
see `verify.stages.serverplan`), else one of its own with the driver's kernel-selection variables
removed unless the arm sets them (what was in force is recorded). The file the engine names in
its announcement line (or any file of the driver's layout under the directory) is judged: the
per-arch policies, the winners table, and a comparison with the winners of a previous receipt of
the same cell when one is given (`--previous RUN/receipt.json`). No file, or no entries, is
INCONCLUSIVE with the reason: it proves nothing either way.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.matrix.model import Arm, Cell
from pipeline.receipt import Receipt
from pipeline.result import CheckResult, StageResult, Status
from verify.kernels.autotune import AutotuneCache, Entry, judge_cache, load_policies, read_cache, winners
from verify.logs.catalog import Facts, catalog_for
from verify.logs.logscan import LogWatcher
from verify.runtime import Runtime
from verify.serving import AutotuneFacts, driver_for
from verify.stages.server import Server, ServerFailed
from verify.stages.serverplan import CACHE_MOUNT, tuning_facts

__all__ = ["CACHE_MOUNT", "diff_winners", "fresh_cache_server_options", "run_autotune", "winners_table"]

STAGE = "autotune"


def fresh_cache_server_options(cell: Cell, version: str | None = None) -> dict[str, Any]:
    """Server options for a server that tunes into an empty, container-owned cache."""
    tuning = tuning_facts(cell, version)
    if tuning is None:
        return {}
    return {"extra_env": {tuning.cache_env: CACHE_MOUNT}, "scratch": (CACHE_MOUNT,)}


def run_autotune(
    runtime: Runtime,
    cell: Cell,
    image: str,
    *,
    arm: Arm | None,
    out_dir: Path,
    facts: Facts,
    previous: Receipt | None = None,
    shared: Server | None = None,
    on_start: Callable[[Server], None] | None = None,
) -> StageResult:
    """Judge the cache of `shared` (the startup server, started with a fresh cache) when given,
    else start a server of its own for it."""
    started = time.monotonic()
    if not cell.is_gpu:
        reason = "CPU cell: FlashInfer autotuning runs only on CUDA GPUs (compute capability >= 9.0)"
        return StageResult.of(STAGE, [CheckResult(name="autotune", status=Status.SKIP, message=reason)], 0.0)
    if cell.serve is None:
        check = CheckResult(name="autotune", status=Status.SKIP, message="the cell has no serve spec")
        return StageResult.of(STAGE, [check], 0.0)
    tuning = tuning_facts(cell, facts.engine_version)
    if tuning is None:
        reason = f"the serving engine ({driver_for(cell.serve).title}) has no FlashInfer autotune cache to judge"
        return StageResult.of(STAGE, [CheckResult(name="autotune", status=Status.SKIP, message=reason)], 0.0)
    cache_dir = out_dir / "autotune-cache"
    if cache_dir.exists():
        shutil.rmtree(cache_dir)  # copied out by the runtime: this user's own files
    arm_env = dict(arm.env) if arm else {}
    in_force = {name: arm_env.get(name) for name in tuning.controlled_env}  # None: not set for this run
    checks: list[CheckResult] = []
    if shared is not None:
        server = shared
        message = f"the startup stage's server, started with a fresh autotune cache ({server.name})"
        checks.append(CheckResult(name="readiness", status=Status.PASS, message=message, evidence={"reused": True}))
        server.copy_out(CACHE_MOUNT, cache_dir)
    else:
        server = Server(
            runtime,
            cell,
            image,
            out_dir=out_dir / "autotune-server",
            arm=arm,
            watcher=LogWatcher(catalog_for(facts)),
            unset_env=tuple(n for n in tuning.controlled_env if n not in arm_env),
            on_start=on_start,
            **fresh_cache_server_options(cell, facts.engine_version),
        )
        with server:
            try:
                ready = server.wait_ready()
            except ServerFailed as exc:
                evidence = {"last_log_lines": exc.last_lines}
                checks.append(CheckResult(name="readiness", status=Status.FAIL, message=exc.reason, evidence=evidence))
                return StageResult.of(STAGE, checks, time.monotonic() - started)
            message = f"ready after {ready.seconds:.0f}s with a fresh autotune cache"
            checks.append(
                CheckResult(name="readiness", status=Status.PASS, message=message, evidence={"seconds": ready.seconds})
            )
            server.copy_out(CACHE_MOUNT, cache_dir)
    log = server.log_path.read_text(errors="replace") if server.log_path.exists() else ""
    checks += judge_fresh_cache(
        cell,
        log,
        cache_dir,
        out_dir,
        facts=facts,
        env=in_force,
        previous=previous,
        tuning=tuning,
        mount=server.seen_as(CACHE_MOUNT),
    )
    judged = next((c for c in checks if c.name == "autotune-cache"), None)
    kept = (judged.evidence or {}).get("file") if judged else None
    return StageResult.of(
        STAGE, checks, time.monotonic() - started, autotune_cache=str(kept or out_dir / "autotune_configs.json")
    )


def judge_fresh_cache(
    cell: Cell,
    log: str,
    cache_dir: Path,
    out_dir: Path,
    *,
    facts: Facts,
    env: dict[str, str | None],
    previous: Receipt | None = None,
    tuning: AutotuneFacts | None = None,
    mount: str = CACHE_MOUNT,
) -> list[CheckResult]:
    """Find the cache FlashInfer wrote during this start and judge it (pure but for reading files).
    `mount`: where the server saw the fresh cache directory (copied to `cache_dir`)."""
    tuning = tuning or tuning_facts(cell, facts.engine_version)
    title = driver_for(cell.serve).title
    if tuning is None:
        reason = f"the serving engine ({title}) has no FlashInfer autotune cache to judge"
        return [CheckResult(name="autotune-cache", status=Status.SKIP, message=reason)]
    logged = _announced(tuning, log)
    found = _written_cache(tuning, logged, cache_dir, mount)
    evidence: dict[str, Any] = {"env": env, "logged_path": logged}
    if found is None and _tuned_nothing(cell, tuning, log):
        return [_nothing_tuned(tuning, evidence)]
    if found is None:
        reason = (
            tuning.disabled_line
            if tuning.disabled_line and tuning.disabled_line in log
            else (
                f"{title} named no autotune cache file" if not logged else f"{title} named {logged}, which is missing"
            )
        )
        if not logged and tuning.gate and reason != tuning.disabled_line:
            reason += f"; it never reached tuning: {tuning.gate}"
        return [
            CheckResult(
                name="autotune-cache",
                status=Status.INCONCLUSIVE,
                evidence=evidence,
                message=f"no autotune cache was written ({reason}): tuning proves nothing here",
            )
        ]
    kept = _keep(found, out_dir)
    cache = read_cache(kept)
    table = winners_table(cache)
    evidence.update({"file": str(kept), "metadata": cache.metadata, "entries": len(cache.entries), "winners": table})
    if not cache.entries and cell.autotune_entries == "none":
        message = f"{_named(kept)} has no entries, as the cell declares (autotune.entries: none)"
        return [CheckResult(name="autotune-cache", status=Status.PASS, evidence=evidence, message=message)]
    if not cache.entries:
        return [
            CheckResult(
                name="autotune-cache",
                status=Status.INCONCLUSIVE,
                evidence=evidence,
                message="the autotune cache has no entries although tuning was expected",
            )
        ]
    checks = [
        CheckResult(
            name="autotune-cache",
            status=Status.PASS,
            evidence=evidence,
            message=f"{len(cache.entries)} tuned entries in {_named(kept)} ({cache.format})",
        )
    ]
    expected = {"flashinfer_version": facts.flashinfer, "cudnn_version": str(facts.cudnn) if facts.cudnn else None}
    checks += judge_cache(
        cache,
        arch=cell.arch,
        policies=load_policies(),
        expected=expected,
        extra_forbid=cell.autotune_forbid,
        allow=cell.autotune_allow,
    )
    if previous is not None:
        checks.append(diff_winners(table, previous))
    return checks


def _written_cache(tuning: AutotuneFacts, logged: str | None, cache_dir: Path, mount: str) -> Path | None:
    """The cache file this start wrote: the one the log names (seen at `mount`, copied to `cache_dir`), else
    the first of the engine's known file patterns."""
    candidates = []
    if logged and (logged == mount or logged.startswith(mount.rstrip("/") + "/")):
        named = cache_dir / logged[len(mount) :].lstrip("/")
        # A file (the legacy line), or the managed store's root (vLLM 0.33.0 kernel_warmup.py:485-489),
        # under which FlashInfer keeps <root>/v2/<env_hash>/manifest.json (autotune_cache.py:367-369).
        candidates += [named, *sorted(named.glob("v2/*/manifest.json"))] if named.is_dir() else [named]
    candidates += [found for pattern in tuning.files for found in sorted(cache_dir.glob(pattern))]
    return next((c for c in candidates if c.is_file()), None)


def _tuned_nothing(cell: Cell, tuning: AutotuneFacts, log: str) -> bool:
    """The cell declares that nothing tunes on its arch, and the engine said it tuned nothing."""
    return cell.autotune_entries == "none" and tuning.empty_line is not None and tuning.empty_line in log


def _nothing_tuned(tuning: AutotuneFacts, evidence: dict[str, Any]) -> CheckResult:
    return CheckResult(
        name="autotune-cache",
        status=Status.PASS,
        evidence={**evidence, "entries": 0},
        message=(
            f"no op was tuned, as the cell declares (autotune.entries: none); the engine said: {tuning.empty_line!r}"
        ),
    )


def _keep(found: Path, out_dir: Path) -> Path:
    """Copy what FlashInfer wrote into the report: a legacy file as autotune_configs.json, a
    managed store's directory whole, under its own env-hash name (the reader checks that name)."""
    if found.name != "manifest.json":
        kept = out_dir / "autotune_configs.json"
        shutil.copyfile(found, kept)
        return kept
    kept = out_dir / "autotune-store" / found.parent.name
    if kept.exists():
        shutil.rmtree(kept)
    shutil.copytree(found.parent, kept)
    return kept / "manifest.json"


def _named(kept: Path) -> str:
    return f"the managed store {kept.parent.name}" if kept.name == "manifest.json" else kept.name


def _announced(tuning: AutotuneFacts, log: str) -> str | None:
    """The cache path or root the engine's announcement line names, first found."""
    for pattern in tuning.announcements:
        match = re.search(pattern, log, re.MULTILINE)
        if match:
            return match.group("path")
    return None


def winners_table(cache: AutotuneCache) -> list[dict[str, Any]]:
    return [
        {
            "op": op,
            "n": n,
            "k": k,
            "rows": [_winner_row(e) for e in rows],
        }
        for (op, n, k), rows in winners(cache).items()
    ]


def _winner_row(entry: Entry) -> dict[str, Any]:
    row = {"m_bucket": entry.m_bucket, "runner": entry.runner, "tactic": entry.tactic}
    return row if entry.profile is None else {**row, "profile": entry.profile}


def diff_winners(table: list[dict[str, Any]], previous: Receipt) -> CheckResult:
    """Buckets whose winning runner changed since a previous receipt of the same cell."""
    which = f"the previous receipt ({previous.cell}, {previous.finished_at})"
    if not previous.autotune:
        return CheckResult(name="winners-diff", status=Status.SKIP, message=f"{which} has no autotune winners")
    old = list(previous.autotune)

    def keyed(tables: list[dict[str, Any]]) -> dict[tuple[Any, ...], str]:
        return {
            (t["op"], t["n"], t["k"], r["m_bucket"], r.get("profile")): r["runner"] for t in tables for r in t["rows"]
        }

    before, now = keyed(old), keyed(table)
    changed = [
        {"op": key[0], "n": key[1], "k": key[2], "m_bucket": key[3], "before": before.get(key), "now": now.get(key)}
        | ({"profile": key[4]} if key[4] else {})
        for key in sorted(set(before) | set(now))
        if before.get(key) != now.get(key)
    ]
    message = f"{len(changed)} bucket(s) changed winner since {which}" if changed else f"same winners as {which}"
    return CheckResult(name="winners-diff", status=Status.PASS, message=message, evidence={"changed": changed})
