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

from pipeline.errors import CheckFailed, InfraError, PipelineError
from pipeline.guard.jsonfile import write_json_read_back
from pipeline.matrix.model import Arm, Cell, LoadSpec
from verify.load.compare import GREEDY_FILE, compare_runs, read_greedy
from verify.load.run import run_load
from verify.load.summary import summarise_load
from verify.logs.catalog import load_catalog
from verify.logs.logscan import LogWatcher
from verify.perf.ab import (
    METRICS,
    AbConfig,
    AbReport,
    Correctness,
    SliceMetrics,
    judge,
    metrics_of_summary,
    slice_order,
)
from verify.runtime import Runtime
from verify.stages.load import load_target
from verify.stages.server import Server, ServerFailed

__all__ = ["AB_FILE", "KeptServers", "Side", "measure_slices", "run_ab", "start_servers"]

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


def run_ab(
    a: Side,
    b: Side,
    *,
    spec: LoadSpec,
    slice_s: float,
    pairs: int,
    threshold: float,
    out_dir: Path,
    new_server: ServerMaker = Server,
    family: int = len(METRICS),
    kept: KeptServers | None = None,
) -> AbReport:
    """Start both servers, run the slices, judge them, write ab.json (read back before it is returned).
    `family`: how many metrics the caller decides on (verify/perf/ab.py: per_metric_confidence);
    `kept`: sides whose servers the caller keeps up across runs (the rest are removed at the end)."""
    started = time.monotonic()
    config = AbConfig(
        threshold=threshold,
        confidence=0.95,
        resamples=4000,
        slice_s=slice_s,
        pairs=pairs,
        concurrency=spec.concurrency,
        seed=spec.seed,
        max_tokens=spec.max_tokens,
        family=family,
    )
    with contextlib.ExitStack() as stack:
        servers = start_servers({"A": a, "B": b}, out_dir=out_dir, stack=stack, new_server=new_server, kept=kept)
        slices = measure_slices(servers, {"A": a, "B": b}, spec, slice_s, slice_order(pairs), out_dir)
    correctness = _correctness(out_dir / "warmup" / "A" / GREEDY_FILE, out_dir / "warmup" / "B" / GREEDY_FILE)
    report = judge(
        slices,
        a=a.label,
        b=b.label,
        config=config,
        correctness=correctness,
        seconds=time.monotonic() - started,
        files={"dir": str(out_dir), "report": str(out_dir / AB_FILE)},
    )
    path = out_dir / AB_FILE
    return AbReport.from_json(write_json_read_back(path, report.to_json(), "A/B report"), source=str(path))


def start_servers(
    sides: dict[str, Side],
    *,
    out_dir: Path,
    stack: contextlib.ExitStack,
    new_server: ServerMaker = Server,
    kept: KeptServers | None = None,
) -> dict[str, Server]:
    """One server per side (key "A", "B", ...), all started before any is waited for (their starts
    overlap), each removed when `stack` closes (a kept side's when `kept.stack` does, and one already
    kept is reused); CheckFailed naming the side whose server never got ready."""
    servers, started = {}, {}
    for key, side in sides.items():
        reused = _kept_server(kept, side)
        if reused is not None:
            servers[key] = reused
            continue
        server = new_server(
            side.runtime,
            side.cell,
            side.image,
            out_dir=out_dir / f"server-{key}",
            arm=side.arm,
            watcher=LogWatcher(load_catalog()),
        )
        keeps = kept is not None and side.label in kept.labels
        (kept.stack if kept is not None and keeps else stack).callback(server.remove)
        server.start()
        servers[key] = started[key] = server
    for key, server in started.items():
        try:
            server.wait_ready()
        except ServerFailed as exc:
            which = f"side {key} ({sides[key].label})" if len(sides) > 1 else sides[key].label
            raise CheckFailed(f"{which}: {exc.reason}") from exc
        if kept is not None and sides[key].label in kept.labels:
            kept.servers[sides[key].label] = server
    return servers


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
    outcome = run_load(target, slice_spec, out_dir, soak=True)
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
        values=metrics_of_summary(document),
    )


def _correctness(greedy_a: Path, greedy_b: Path) -> Correctness:
    """`stackproof compare` of the two warm-up slices' greedy answers."""
    try:
        comparison = compare_runs(read_greedy(greedy_a), read_greedy(greedy_b))
    except PipelineError as exc:  # no greedy answers (a side's warm-up failed): a missing column, not a lost run
        return Correctness(agreement=None, corruption=False, comparison={"error": str(exc)})
    document = comparison.to_json()
    return Correctness(agreement=document["agreement"], corruption=comparison.corrupted, comparison=document)
