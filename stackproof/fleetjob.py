"""`stackproof fleet run`: each cell one scheduler job, placed by the fleet site file, running the
cell's own `stackproof run` on the node it gets, its outputs under the site's shared directory.

Before anything is submitted every cell is placed (plan.py: an arch the site does not serve is exit
2) and the scheduler is asked whether it could ever run each job (`sbatch --test-only`: a request
no node meets is exit 2, naming the cell and the scheduler's words). Then the jobs are submitted and
followed: each change of state is one line (PENDING with its reason, RUNNING on NODE, done). Each cell
ends with a fleet receipt (fleet-receipt.json): the scheduler's state, reason, node, exit code and
times, and the verification receipt the job wrote, if any. A job cancelled, timed out, preempted or
lost with its node gets a receipt of that state: never a silent gap. An interrupted run (SIGINT,
SIGTERM) cancels every job it submitted that is not finished, records them, then exits 130.
"""

from __future__ import annotations

import shlex
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import InfraError, InputError
from pipeline.fleet.plan import Placement, plan_cells
from pipeline.fleet.scheduler import FAULT_STATES, JobRequest, JobState, Scheduler
from pipeline.fleet.site import FleetSite
from pipeline.guard.jsonfile import read_json, write_json_read_back
from pipeline.matrix.model import Matrix

__all__ = ["FLEET_KIND", "CellRecord", "FleetRun", "exit_code", "run_fleet"]

FLEET_KIND = "stackproof.fleet-cell"
_CANCEL_WAIT_S = 30.0  # after scancel, how long to wait for the jobs to reach a finished state
# The cell's exit by its job's status: stackproof's own codes (0 pass, 1 a check failed, 2 bad input,
# 3 infrastructure); a fault state (cancelled, lost...) is infrastructure.
_STATUS_BY_EXIT = {0: "PASS", 1: "FAIL", 2: "ERROR", 3: "ERROR"}


@dataclass(kw_only=True)
class CellRecord:
    placement: Placement
    folder: Path
    job_id: str | None = None
    submitted_at: float | None = None  # this tool's clock, at sbatch's return
    seen_running_at: float | None = None  # this tool's clock, the first poll that saw it running
    last: JobState | None = None
    status: str | None = None  # PASS, FAIL, ERROR, INCONCLUSIVE, NOT_REPRODUCED, or the fault state
    receipt: Path | None = None
    exit: int | None = None

    def to_json(self) -> dict[str, Any]:
        s = self.last
        return {
            "kind": FLEET_KIND,
            "cell": self.placement.cell,
            "status": self.status,
            "exit_code": self.exit,
            "scheduler": {
                "job_id": self.job_id,
                "state": s.state if s else None,
                "reason": s.reason if s else None,
                "node": s.node if s else None,
                "job_exit_code": s.exit_code if s else None,
                "signal": s.signal if s else None,
                "request": self.placement.describe(),
            },
            "times": {
                "submitted_at": self.submitted_at,
                "started_at": s.started_at if s else None,
                "ended_at": s.ended_at if s else None,
                "dispatch_s": _dispatch(self),
            },
            "receipt": str(self.receipt) if self.receipt else None,
            "output": str(self.folder / "job.out"),
        }


@dataclass(kw_only=True)
class FleetRun:
    folder: Path
    cells: list[CellRecord]

    @property
    def exit_code(self) -> int:
        return exit_code(self.cells)


def exit_code(cells: list[CellRecord]) -> int:
    """The worst cell's: 3 (infrastructure or a fault) over 2 over 1 over 0."""
    return max((c.exit if c.exit is not None else 3 for c in cells), default=0)


def run_fleet(
    matrix: Matrix,
    cell_ids: list[str],
    site: FleetSite,
    scheduler: Scheduler,
    *,
    matrix_file: Path,
    images: Path,
    stages: str | None = None,
    poll_s: float = 1.0,
    say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> FleetRun:
    cells = [matrix.cell(c) for c in cell_ids] if cell_ids else list(matrix.cells)
    placements = plan_cells(cells, site)  # exit 2 before anything is written or submitted
    folder = _run_folder(site)
    records = [CellRecord(placement=p, folder=folder / p.cell) for p in placements]
    requests = {r.placement.cell: _request(r, site, matrix_file.resolve(), images.resolve(), stages) for r in records}
    refused = [f"{cell}: {why}" for cell, why in _checked(records, requests, scheduler)]
    if refused:
        shutil.rmtree(folder, ignore_errors=True)  # only its job scripts: nothing was submitted
        raise InputError(
            f"{scheduler.name} refuses before anything is submitted: {'; '.join(refused)}. "
            f"The site ({site.file}) offers {site.offers()}."
        )
    run = FleetRun(folder=folder, cells=records)
    try:
        for record in records:
            record.job_id = scheduler.submit(requests[record.placement.cell])
            record.submitted_at = time.time()
            say(f"fleet: {record.placement.cell}: submitted job {record.job_id} ({record.placement.describe()})")
        _follow(records, scheduler, poll_s, say)
    except BaseException:
        _cancel_unfinished(records, scheduler, say)
        raise
    finally:
        for record in records:
            if record.job_id is not None:
                write_json_read_back(record.folder / "fleet-receipt.json", record.to_json(), "fleet receipt")
        write_json_read_back(folder / "fleet.json", [r.to_json() for r in records], "fleet summary")
    return run


def _checked(records: list[CellRecord], requests: dict[str, JobRequest], scheduler: Scheduler) -> list[tuple[str, str]]:
    """(cell, the scheduler's refusal) for each job it could never run."""
    out = []
    for record in records:
        why = scheduler.check(requests[record.placement.cell])
        if why is not None:
            out.append((record.placement.cell, why))
    return out


def _run_folder(site: FleetSite) -> Path:
    """`SHARED/fleet-<time>` (or `-2`, `-3`...), made by this run alone (an exclusive mkdir)."""
    if not site.shared_dir.is_dir():
        raise InfraError(f"{site.file}: shared_dir {site.shared_dir} is not a directory here: mount or create it")
    stem = time.strftime("fleet-%Y%m%dT%H%M%S")
    for n in range(1, 1000):
        path = site.shared_dir / (stem if n == 1 else f"{stem}-{n}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        except OSError as exc:
            raise InfraError(f"{path}: cannot create the fleet run's folder: {exc.strerror}") from exc
        return path
    raise InfraError(f"{site.shared_dir}: 1,000 fleet runs named {stem}")


def _request(record: CellRecord, site: FleetSite, matrix_file: Path, images: Path, stages: str | None) -> JobRequest:
    """The job script: the site's setup lines, then the cell's own `stackproof run`, its verdict (the
    receipt document) on stdout into verdict.json and its progress in the job's output."""
    cell = record.placement.cell
    record.folder.mkdir(parents=True)
    python = site.python or sys.executable
    argv = [python, "-m", "pipeline", "run", cell, "--matrix", str(matrix_file), "--images", str(images)]
    argv += ["--out", str(record.folder / "out"), "--json"] + (["--stages", stages] if stages else [])
    lines = [
        "#!/bin/bash",
        f"# stackproof fleet job: cell {cell} ({record.placement.describe()}), written by `stackproof fleet run`",
        "set -u",
        'echo "stackproof-fleet: cell ' + cell + ' job ${SLURM_JOB_ID:-?} on ${SLURMD_NODENAME:-$(hostname)}" >&2',
        *site.setup,
        f"exec {shlex.join(argv)} > {shlex.quote(str(record.folder / 'verdict.json'))}",
    ]
    script = record.folder / "job.sh"
    script.write_text("\n".join(lines) + "\n")
    script.chmod(0o755)
    return JobRequest(
        placement=record.placement,
        name=f"stackproof-{cell}",
        script=script,
        workdir=record.folder,
        output=record.folder / "job.out",
        time_limit_min=site.time_limit_min,
    )


def _follow(records: list[CellRecord], scheduler: Scheduler, poll_s: float, say: Callable[[str], None]) -> None:
    waiting = {r.job_id: r for r in records if r.job_id}
    while waiting:
        states = scheduler.states(list(waiting))
        now = time.time()
        for job_id, state in states.items():
            record = waiting[job_id]
            if record.last is None or (state.state, state.reason, state.node) != (
                record.last.state,
                record.last.reason,
                record.last.node,
            ):
                say(f"fleet: {record.placement.cell}: job {job_id} {_describe(state)}")
            if state.state == "RUNNING" and record.seen_running_at is None:
                record.seen_running_at = now
            record.last = state
            if state.finished:
                _conclude(record)
                say(f"fleet: {record.placement.cell}: done: {record.status} (exit {record.exit})")
                del waiting[job_id]
        if waiting:
            time.sleep(poll_s)


def _describe(state: JobState) -> str:
    if state.state == "PENDING":
        return f"PENDING ({state.reason or 'queued'})"
    if state.state == "RUNNING":
        return f"RUNNING on {state.node}"
    reason = f" ({state.reason})" if state.reason else ""
    return f"{state.state}{reason}" + (f" on {state.node}" if state.node else "")


def _conclude(record: CellRecord) -> None:
    """The cell's status from its job: a fault state is the status itself (exit 3); else the
    verification receipt the job wrote, and the job's exit code."""
    state = record.last
    assert state is not None
    found = sorted((record.folder / "out").glob(f"{record.placement.cell}/run-*/receipt.json"))
    record.receipt = found[-1] if found else None
    if state.state in FAULT_STATES:
        record.status, record.exit = state.state, 3
        return
    code = state.exit_code if state.exit_code is not None else 3
    record.exit = code if code in _STATUS_BY_EXIT else 3
    status = None
    if record.receipt is not None:
        try:
            status = read_json(record.receipt, "receipt").get("status")
        except InputError:
            status = None
    record.status = str(status) if status else _STATUS_BY_EXIT.get(code, "ERROR")


def _cancel_unfinished(records: list[CellRecord], scheduler: Scheduler, say: Callable[[str], None]) -> None:
    """Cancel what this run submitted and has not finished; wait (bounded) to record their end."""
    open_ = [r for r in records if r.job_id and r.status is None]
    if not open_:
        return
    say(f"fleet: interrupted: cancelling {len(open_)} job(s): {', '.join(str(r.job_id) for r in open_)}")
    scheduler.cancel([str(r.job_id) for r in open_])
    deadline = time.monotonic() + _CANCEL_WAIT_S
    while open_ and time.monotonic() < deadline:
        try:
            states = scheduler.states([str(r.job_id) for r in open_])
        except InfraError:
            break
        for record in list(open_):
            state = states.get(str(record.job_id))
            if state is not None:
                record.last = state
                if state.finished:
                    _conclude(record)
                    open_.remove(record)
        if open_:
            time.sleep(0.5)
    for record in open_:
        record.status, record.exit = "CANCELLED", 3  # asked; the scheduler did not confirm in time


def _dispatch(record: CellRecord) -> float | None:
    """Submit to running, by this tool's clock (the scheduler's own times are whole seconds)."""
    if record.submitted_at is None or record.seen_running_at is None:
        return None
    return round(record.seen_running_at - record.submitted_at, 2)
