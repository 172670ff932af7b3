"""`stackproof sweep CELL --sweep concurrency=1,2,4,8`: one server kept up, a slice per load point.

The server starts once (in the cell's runtime, as `stackproof ab` starts a side: stackproof/ab.py's
`start_servers`) and stays up for every point; a warm-up slice at the first point's load goes first
and is discarded, so the start's compile and caches land in no point. Each point's slice is
`stackproof soak`'s load (verify/loadrun.run_load in soak mode: the cell's question pool from its
seed, cycled for `--slice` seconds) at that point's concurrency, or its rate (the open loop,
capped by the spec's concurrency). The judge (verify/perf/sweep.py) finds where TTFT p99 crosses the
declared limit; this module is the edge: the server, the slices, the files.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from pipeline.errors import InfraError
from pipeline.guard.jsonfile import write_json_read_back
from pipeline.matrix.model import LoadSpec
from stackproof.ab import ServerMaker, Side, start_servers
from verify.load.run import run_load
from verify.load.summary import summarise
from verify.perf.sweep import SweepAxis, SweepConfig, SweepPoint, SweepReport, judge_sweep, point_of_summary
from verify.stages.load import load_target
from verify.stages.server import Server

__all__ = ["SWEEP_FILE", "run_sweep"]

SWEEP_FILE = "sweep.json"


def run_sweep(
    side: Side,
    *,
    axis: SweepAxis,
    spec: LoadSpec,
    slice_s: float,
    ttft_p99_limit_ms: float,
    out_dir: Path,
    new_server: ServerMaker = Server,
) -> SweepReport:
    """Start the server, warm it up, run a slice per point, judge, write sweep.json (read back)."""
    started = time.monotonic()
    config = SweepConfig(
        axis=axis.name,
        values=axis.values,
        slice_s=slice_s,
        warmup_s=slice_s,
        ttft_p99_limit_ms=ttft_p99_limit_ms,
        seed=spec.seed,
        max_tokens=spec.max_tokens,
    )
    points: list[SweepPoint] = []
    with contextlib.ExitStack() as stack:
        server = start_servers({"S": side}, out_dir=out_dir, stack=stack, new_server=new_server)["S"]
        _slice(server, side, _at(spec, axis.name, axis.values[0]), slice_s, out_dir / "warmup", label="warm-up")
        for number, value in enumerate(axis.values):
            point_spec = _at(spec, axis.name, value)
            label = f"point {number + 1}/{len(axis.values)}: {axis.name}={value:g}"
            summary = _slice(server, side, point_spec, slice_s, out_dir / f"point{number:03d}", label=label)
            points.append(point_of_summary(value, summary))
    report = judge_sweep(
        points,
        target=side.label,
        config=config,
        seconds=time.monotonic() - started,
        files={"dir": str(out_dir), "report": str(out_dir / SWEEP_FILE)},
    )
    path = out_dir / SWEEP_FILE
    return SweepReport.from_json(write_json_read_back(path, report.to_json(), "sweep report"), source=str(path))


def _at(spec: LoadSpec, axis: str, value: float) -> LoadSpec:
    """The load spec at one point: that many requests in flight, or that open-loop rate."""
    if axis == "concurrency":
        return replace(spec, concurrency=int(value), rate=None)
    return replace(spec, rate=value)


def _slice(server: Server, side: Side, spec: LoadSpec, slice_s: float, out_dir: Path, *, label: str) -> dict[str, Any]:
    status, code = server.state()
    if status not in ("running", "created"):
        raise InfraError(f"{side.label}: its server {status} (exit code {code}) before the {label}")
    print(f"sweep: {label}, {slice_s:.0f}s", file=sys.stderr)
    # Greedy answers are `compare`'s and `ab`'s business: a sweep's slices carry load only.
    slice_spec = replace(spec, duration_s=slice_s, determinism_repeats=0)
    outcome = run_load(load_target(server, side.cell, side.arm), slice_spec, out_dir, soak=True)
    summary = summarise(outcome, slice_spec)
    (out_dir / "load.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
