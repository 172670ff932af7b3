"""`stackproof ab A B`: one server per side, kept up for the whole run, loaded in interleaved slices.

The load of every slice is `stackproof soak`'s (verify/loadrun.run_load in soak mode: the same
question pool from the same seed, cycled until the slice's seconds are spent, at the same
concurrency), on one host; the order is verify/ab.slice_order's (a warm-up pair, then A B, B A,
...). Unlike soak, which starts a fresh server per slice to count faults, an A/B keeps each side's
server up from the first slice to the last: a server start (compile, caches, allocator) must not
land inside a measurement. The greedy answers of each side are taken once, alone, in its warm-up
slice and compared as `stackproof compare` does. The judge (verify/perf/ab.py) turns the slices into the
report; this module is the edge: servers, slices, files.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pipeline.errors import CheckFailed, InfraError, PipelineError
from pipeline.guard.jsonfile import write_json_read_back
from pipeline.matrix.model import Arm, Cell, LoadSpec
from verify.load.compare import GREEDY_FILE, compare_runs, read_greedy
from verify.load.run import run_load
from verify.load.summary import summarise_load
from verify.logs.catalog import load_catalog
from verify.logs.logscan import LogWatcher
from verify.perf.ab import (
    CLIENT_CPU,
    METRICS,
    AbConfig,
    AbReport,
    Correctness,
    SliceMetrics,
    decided,
    judge,
    look_sizes,
    metrics_of_summary,
    refused,
    slice_order,
)
from verify.perf.engines import KV_TOLERANCE, engine_facts, mismatch
from verify.runtime import Runtime
from verify.stages.load import load_target
from verify.stages.server import Server, ServerFailed

__all__ = [
    "AB_FILE",
    "KeptServers",
    "Plan",
    "Side",
    "Started",
    "defaults_for",
    "measure_slices",
    "run_ab",
    "start_servers",
]

AB_FILE = "ab.json"


@dataclass(frozen=True, kw_only=True)
class Side:
    """One side of the comparison: a cell (and arm) on the runtime that serves it."""

    label: str  # "cell" or "cell:arm"
    cell: Cell
    arm: Arm | None
    runtime: Runtime
    image: str  # the image tag, or a host environment's ref


ServerMaker = Callable[..., Server]


@dataclass(frozen=True, kw_only=True)
class KeptServers:
    """Servers that outlive one A/B: a side whose label is in `labels` is started once, by the first
    A/B that needs it, and reused by every later one; `stack` removes them when it closes.

    `stackproof bisect` runs every step against the same good end: its server is started once for
    the whole search, not once per step (on two cores a vLLM start is a minute of compiling that also
    slows the other side's start)."""

    stack: contextlib.ExitStack
    labels: frozenset[str]
    servers: dict[str, Server]  # label -> the running server; filled as the sides are first started


@dataclass(frozen=True, kw_only=True)
class Plan:
    """How an A/B is run, beside its load: the schedule, how its servers start, what makes it refused.
    `defaults_for` gives the GPU's or the CPU's; the command line overrides each."""

    slice_s: float
    pairs: int  # the first look
    max_pairs: int  # looks double the pairs up to this while a metric is UNDECIDED (= pairs: one look)
    threshold: float = 0.05
    apart: bool = False  # start the sides one after another, each ready before the next starts
    restart_first: bool = False  # once both are ready, start the first-started side again
    kv_tolerance: float | None = KV_TOLERANCE  # None: a KV cache mismatch is compared anyway
    # When the looks stop (default verify/perf/ab.py `decided`: every metric decided, or a
    # REGRESSION); `bisect` stops on its one metric, judged one-sided as its steps are.
    stop: Callable[[AbReport], bool] = decided


def defaults_for(cell: Cell) -> Plan:
    """GPU cells: 3 s slices, 12 pairs doubling to 96, the sides started apart and the first restarted.
    From the H100 (shared/reference/gpu-docker.md, sections 3-4): per-pair noise 2.3-3.6% for the
    medians (9-20 pairs decide them at 5%), 6-8.5% for the p90s and TTFT (about 72 pairs); two
    servers started at once on one GPU split its memory 40 to 1, and the side started second (on a
    warm JIT cache) was 2% faster. CPU cells keep 20 s slices and 5 pairs, started together: there
    one pair varies by 38-70%, and a start is minutes of compiling."""
    if cell.is_gpu:
        return Plan(slice_s=3.0, pairs=12, max_pairs=96, apart=True, restart_first=True)
    return Plan(slice_s=20.0, pairs=5, max_pairs=5)


def run_ab(
    a: Side,
    b: Side,
    *,
    spec: LoadSpec,
    plan: Plan,
    out_dir: Path,
    new_server: ServerMaker = Server,
    family: int = len(METRICS),
    kept: KeptServers | None = None,
) -> AbReport:
    """Start both servers, compare their engines (REFUSED on a mismatch), run the slices in looks
    until every metric is decided or `plan.max_pairs` are spent, write ab.json (read back before it
    is returned). `family`: how many metrics the caller decides on (verify/perf/ab.py:
    per_metric_confidence); `kept`: sides whose servers the caller keeps up across runs."""
    started = time.monotonic()
    sizes = look_sizes(plan.pairs, max(plan.pairs, plan.max_pairs))
    config = AbConfig(
        threshold=plan.threshold, confidence=0.95, resamples=4000, slice_s=plan.slice_s, pairs=plan.pairs,
        concurrency=spec.concurrency, seed=spec.seed, max_tokens=spec.max_tokens, family=family,
        looks=len(sizes), max_pairs=sizes[-1],
    )  # fmt: skip
    sides = {"A": a, "B": b}
    files = {"dir": str(out_dir), "report": str(out_dir / AB_FILE)}
    with contextlib.ExitStack() as stack:
        servers = start_servers(
            sides, out_dir=out_dir, stack=stack, new_server=new_server, kept=kept, apart=plan.apart,
            restart_first=plan.restart_first,
        )  # fmt: skip
        engines = {key: engine_facts(_log_head(servers[key].log_path), **servers.facts[key]) for key in sides}
        why = None if plan.kv_tolerance is None else mismatch(engines["A"], engines["B"], tolerance=plan.kv_tolerance)
        if why is not None:
            report = refused(
                a=a.label, b=b.label, config=config, reason=why, seconds=time.monotonic() - started, files=files,
                engines={k: f.to_json() for k, f in engines.items()},
            )  # fmt: skip
            return _written(report, out_dir)
        slices: list[SliceMetrics] = []
        done = 0
        for size in sizes:
            order = [entry for entry in slice_order(size) if entry[0] >= done or (entry[0] < 0 and done == 0)]
            slices += measure_slices(servers, sides, spec, plan.slice_s, order, out_dir, first_position=len(slices))
            done = size
            look = judge(slices, a=a.label, b=b.label, config=replace(config, pairs=size))
            if plan.stop(look):
                break
            if size < sizes[-1]:
                following = sizes[sizes.index(size) + 1]
                print(f"ab: {size} pairs leave {_undecided(look)} UNDECIDED: on to {following}", file=sys.stderr)
    correctness = _correctness(out_dir / "warmup" / "A" / GREEDY_FILE, out_dir / "warmup" / "B" / GREEDY_FILE)
    report = judge(
        slices, a=a.label, b=b.label, config=replace(config, pairs=done), correctness=correctness,
        seconds=time.monotonic() - started, files=files, engines={k: f.to_json() for k, f in engines.items()},
    )  # fmt: skip
    return _written(report, out_dir)


def _undecided(report: AbReport) -> str:
    return ", ".join(m.name for m in report.metrics if m.verdict == "UNDECIDED")


def _written(report: AbReport, out_dir: Path) -> AbReport:
    path = out_dir / AB_FILE
    return AbReport.from_json(write_json_read_back(path, report.to_json(), "A/B report"), source=str(path))


def _log_head(path: Path, cap: int = 16 * 2**20) -> str:
    """The first `cap` bytes of a server log (its engine facts are written before it is ready)."""
    try:
        with path.open("rb") as log:
            return log.read(cap).decode("utf-8", errors="replace")
    except OSError:
        return ""


class Started(dict[str, Server]):
    """The servers by side key, with what their starts were: order, seconds to ready, restarted."""

    def __init__(self) -> None:
        super().__init__()
        self.facts: dict[str, dict[str, Any]] = {}


def start_servers(
    sides: dict[str, Side],
    *,
    out_dir: Path,
    stack: contextlib.ExitStack,
    new_server: ServerMaker = Server,
    kept: KeptServers | None = None,
    apart: bool = False,
    restart_first: bool = False,
) -> Started:
    """One server per side (key "A", "B", ...), each removed when `stack` closes (a kept side's when
    `kept.stack` does, and one already kept is reused); CheckFailed naming the side whose server never
    got ready. Together (the default), all are started before any is waited for; `apart`, each is
    ready before the next starts (on one GPU, a start profiles the free memory: two at once each count
    the other's allocation as their own). `restart_first`: once all are ready, the one started first
    is started again, so every side started with the caches (compile, JIT) the others left."""
    servers, waiting = Started(), dict[str, float]()
    for key, side in sides.items():
        reused = _kept_server(kept, side)
        if reused is not None:
            servers[key] = reused
            servers.facts[key] = {"started_order": 0, "start_s": None, "restarted": False}
            continue
        keeps = kept is not None and side.label in kept.labels
        servers[key] = _new(new_server, side, out_dir / f"server-{key}")
        (kept.stack if kept is not None and keeps else stack).callback(_remover(servers, key))
        servers.facts[key] = {"started_order": len(waiting) + 1, "start_s": None, "restarted": False}
        waiting[key] = time.monotonic()
        servers[key].start()
        servers.facts[key]["compile_cache"] = _cache_state(servers[key])
        if apart:
            _ready(servers, sides, key, waiting[key])
    for key, at in waiting.items():
        if not apart:
            _ready(servers, sides, key, at)
        if kept is not None and sides[key].label in kept.labels:
            kept.servers[sides[key].label] = servers[key]
    # Only when this call started more than one: a side started beside a kept one (bisect's later
    # steps) already started on the caches the kept one warmed.
    first = next(iter(waiting), None)
    if restart_first and first is not None and len(waiting) > 1:
        print(f"ab: restarting side {first} ({sides[first].label}), started first, on the caches now warm",
              file=sys.stderr)  # fmt: skip
        servers[first].remove()
        servers[first] = _new(new_server, sides[first], out_dir / f"server-{first}-restart")
        at = time.monotonic()
        servers[first].start()
        servers.facts[first]["compile_cache"] = _cache_state(servers[first])
        _ready(servers, sides, first, at)
        servers.facts[first]["restarted"] = True
        if kept is not None and sides[first].label in kept.labels:
            kept.servers[sides[first].label] = servers[first]
    return servers


def _cache_state(server: Server) -> str | None:
    """ "warm" or "cold": what the server's start found in its compile/JIT cache slot; None without one."""
    use = server.cache_use
    return None if use is None else "warm" if use.warm else "cold"


def _remover(servers: Started, key: str) -> Callable[[], None]:
    """Removes whichever server holds the side's key when the stack closes (a restart replaces it)."""
    return lambda: servers[key].remove()


def _new(new_server: ServerMaker, side: Side, out_dir: Path) -> Server:
    return new_server(
        side.runtime, side.cell, side.image, out_dir=out_dir, arm=side.arm, watcher=LogWatcher(load_catalog())
    )


def _ready(servers: Started, sides: dict[str, Side], key: str, since: float) -> None:
    try:
        servers[key].wait_ready()
    except ServerFailed as exc:
        which = f"side {key} ({sides[key].label})" if len(sides) > 1 else sides[key].label
        raise CheckFailed(f"{which}: {exc.reason}") from exc
    servers.facts[key]["start_s"] = round(time.monotonic() - since, 1)


def _kept_server(kept: KeptServers | None, side: Side) -> Server | None:
    """The running server kept for this side, if any; InfraError when it has died since."""
    server = kept.servers.get(side.label) if kept is not None else None
    if server is None:
        return None
    status, code = server.state()
    if status not in ("running", "created"):
        raise InfraError(
            f"{side.label}: its kept server {status} (exit code {code}) between runs; log: {server.log_path}"
        )
    return server


def measure_slices(
    servers: dict[str, Server],
    sides: dict[str, Side],
    spec: LoadSpec,
    slice_s: float,
    order: list[tuple[int, str]],
    out_dir: Path,
    *,
    first_position: int = 0,
) -> list[SliceMetrics]:
    """The slices of `order` ((pair, side key); pair -1 the warm-up, whose slices also take the
    greedy answers) on servers kept up; each slice's files under out_dir/pairNNN/KEY (warmup/KEY)."""
    slices: list[SliceMetrics] = []
    total = first_position + len(order)
    for offset, (pair, key) in enumerate(order):
        position = first_position + offset
        side = sides[key]
        slice_dir = out_dir / ("warmup" if pair < 0 else f"pair{pair:03d}") / key
        print(
            f"ab: slice {position + 1}/{total}: {'warm-up' if pair < 0 else f'pair {pair}'} "
            f"side {key} ({side.label}), {slice_s:.0f}s",
            file=sys.stderr,
        )
        slices.append(_one_slice(servers[key], side, spec, slice_s, slice_dir, key=key, pair=pair, position=position))
    return slices


def _one_slice(
    server: Server, side: Side, spec: LoadSpec, slice_s: float, out_dir: Path, *, key: str, pair: int, position: int
) -> SliceMetrics:
    status, code = server.state()
    if status not in ("running", "created"):
        raise InfraError(f"{side.label}: its server {status} (exit code {code}) before slice {position + 1}")
    # Greedy answers once per side, alone, in the warm-up; the measured slices carry load only.
    slice_spec = replace(spec, duration_s=slice_s, determinism_repeats=1 if pair < 0 else 0)
    target = load_target(server, side.cell, side.arm)
    cpu = time.process_time()  # this process is the client: the servers are processes of their own
    outcome = run_load(target, slice_spec, out_dir, soak=True)
    share = (time.process_time() - cpu) / max(outcome.seconds, 1e-9)
    summary = summarise_load(outcome, slice_spec)
    document = summary.to_dict()
    (out_dir / "load.json").write_text(json.dumps(document, indent=2) + "\n")
    return SliceMetrics(
        side=key,
        pair=pair,
        position=position,
        seconds=round(outcome.seconds, 3),
        questions=summary.questions.attempted,
        faulted=summary.questions.faulted,
        # Beside the metrics, not judged: how much of a core the client used (verify/perf/ab.py client_bound).
        values={**metrics_of_summary(document), CLIENT_CPU: round(share, 3)},
    )


def _correctness(greedy_a: Path, greedy_b: Path) -> Correctness:
    """`stackproof compare` of the two warm-up slices' greedy answers."""
    try:
        comparison = compare_runs(read_greedy(greedy_a), read_greedy(greedy_b))
    except PipelineError as exc:  # no greedy answers (a side's warm-up failed): a missing column, not a lost run
        return Correctness(agreement=None, corruption=False, comparison={"error": str(exc)})
    document = comparison.to_json()
    return Correctness(agreement=document["agreement"], corruption=comparison.corrupted, comparison=document)
