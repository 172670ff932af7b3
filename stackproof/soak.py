"""`stackproof soak`: arms of one cell, alternated on one host, until the duration is spent.

Each round starts a fresh server per arm and gives it one slice of load (same questions, same
seed), so slow drift of the host (heat, other tenants) falls on every arm alike. Rounds are whole:
a round started before the duration ran out finishes, so every arm gets the same exposure. A slice that
ends on a fault verdict counts that fault and the soak goes on with the next arm. At the end each
arm's fault statistics, and for two arms the one-sided comparison, go to soak.json.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pipeline.docker.client import Docker
from pipeline.matrix.model import Arm, Cell, LoadSpec, Matrix
from verify.forensics.stall import LoadInstruments
from verify.load.run import run_load
from verify.load.stats import compare_arms, fault_stats
from verify.load.summary import summarise_load
from verify.logs.catalog import load_catalog
from verify.logs.logscan import LogWatcher
from verify.stages.load import load_target
from verify.stages.server import Server, ServerFactory, ServerFailed

__all__ = ["ArmTally", "soak", "soak_cell"]

DEFAULT_ARM = "default"  # the cell as declared, no arm


@dataclass(kw_only=True)
class ArmTally:
    name: str
    questions: int = 0
    clean: int = 0
    faults: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)
    slices: list[dict[str, Any]] = field(default_factory=list)
    output_tokens: int = 0
    seconds: float = 0.0


def soak(
    docker: Docker,
    cell: Cell,
    image: str,
    *,
    arms: list[str],
    spec: LoadSpec,
    duration_s: float,
    slice_s: float,
    out_dir: Path,
    new_server: ServerFactory = Server,
) -> dict[str, Any]:
    chosen: list[Arm | None] = [None if name == DEFAULT_ARM else cell.arm(name) for name in arms]
    tallies = {name: ArmTally(name=name) for name in arms}
    # Whole rounds only: every arm gets the same slice in every round, so their exposure stays
    # equal for the comparison; a new round starts only while the duration lasts.
    deadline = time.monotonic() + duration_s
    round_no = 0
    while round_no == 0 or time.monotonic() < deadline:
        for name, arm in zip(arms, chosen, strict=True):
            tally = tallies[name]
            slice_dir = out_dir / f"round{round_no:03d}-{name}"
            left = max(0.0, deadline - time.monotonic())
            print(
                f"{cell.id}: soak round {round_no} arm {name}: {tally.questions} questions so far, "
                f"{tally.faults} faulted, {left:.0f}s of {duration_s:.0f}s left",
                file=sys.stderr,
            )
            _one_slice(docker, cell, image, arm, replace(spec, duration_s=slice_s), slice_dir, tally, new_server)
        round_no += 1
    document: dict[str, Any] = {
        "cell": cell.id,
        "image": image,
        "arms": {},
        "config": {"duration_s": duration_s, "slice_s": slice_s, "rounds": round_no},
    }
    for name, tally in tallies.items():
        stats = fault_stats(spec.baseline_rate, tally.questions, tally.faults).to_json() if tally.questions else None
        document["arms"][name] = {
            "questions": tally.questions,
            "clean": tally.clean,
            "faults": tally.faults,
            "output_tokens": tally.output_tokens,
            "seconds": round(tally.seconds, 1),
            "events": tally.events,
            "slices": tally.slices,
            "stats": stats,
        }
    if len(arms) == 2 and all(tallies[a].questions for a in arms):
        a, b = (tallies[n] for n in arms)
        document["comparison"] = {
            "a": a.name,
            "b": b.name,
            **compare_arms(a.faults, a.questions, b.faults, b.questions).to_json(),
        }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "soak.json").write_text(json.dumps(document, indent=2) + "\n")
    return document


def _one_slice(
    docker: Docker,
    cell: Cell,
    image: str,
    arm: Arm | None,
    spec: LoadSpec,
    out_dir: Path,
    tally: ArmTally,
    new_server: ServerFactory,
) -> None:
    server = new_server(docker, cell, image, out_dir=out_dir, arm=arm, watcher=LogWatcher(load_catalog()))
    with server:
        try:
            server.wait_ready()
        except ServerFailed as exc:
            tally.events.append({"type": "SERVER_START_FAILED", "reason": exc.reason, "dir": str(out_dir)})
            tally.faults += 1
            tally.questions += 1
            return
        # GPU cost and stall forensics per slice, as in the load stage (verify/forensics/stall.py).
        instruments = LoadInstruments.for_cell(docker, cell, run_dir=out_dir, forensics_dir=out_dir / "forensics")
        instruments.start(server.name)
        target = replace(
            load_target(server, cell, arm),
            prior=(tally.questions, tally.clean),
            on_stall=instruments.on_stall(server.name, image),
        )
        try:
            outcome = run_load(target, spec, out_dir, soak=True)
        finally:
            instruments.stop()
    summary = summarise_load(outcome, spec)
    document = {**summary.to_dict(), "cost": instruments.cost_of(outcome, summary)}
    (out_dir / "load.json").write_text(json.dumps(document, indent=2) + "\n")
    tally.questions += summary.questions.attempted
    tally.clean += summary.questions.clean
    tally.faults += summary.questions.faulted
    tally.output_tokens += summary.output_tokens
    tally.seconds += outcome.seconds
    tally.events += [{**e, "dir": str(out_dir)} for e in summary.events if e["type"] != "UNKNOWN"]
    tally.slices.append({"dir": str(out_dir), "questions": document["questions"], "stop_reason": outcome.stop_reason})


def soak_cell(
    matrix: Matrix,
    cell: Cell,
    images: Path,
    *,
    arms: list[str],
    spec: LoadSpec,
    duration_s: float,
    slice_s: float,
    out_root: Path,
) -> tuple[dict[str, Any], Path]:
    """`stackproof soak`: the cell's built image (with its model in the store) soaked under a
    fresh directory of `out_root/CELL`; the document and where its soak.json is."""
    from pipeline.build.image import built_image
    from pipeline.host.modelstore import ensure_model
    from pipeline.matrix.site import load_site
    from stackproof.runjob import exclusive_dir

    assert cell.serve is not None  # the command refused a cell without one
    docker = Docker.connect()
    tag = built_image(docker, matrix, cell, load_site(matrix), images)[0].tag
    ensure_model(cell.serve.model, where=f"{matrix.file}:{cell.line}: cells[{cell.id}].serve.model")
    out = exclusive_dir(out_root / cell.id, time.strftime("soak-%Y%m%dT%H%M%S"))
    document = soak(docker, cell, tag, arms=arms, spec=spec, duration_s=duration_s, slice_s=slice_s, out_dir=out)
    return document, out / "soak.json"
