"""`stackproof fleet run`'s bookkeeping (stackproof/fleetjob.py) against a scripted scheduler: the
cell's status from its job's state and receipt, refusal before any submit, cancel on interrupt.
The real Slurm behind the same calls is tests/integration/test_slurm.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.errors import InputError
from pipeline.fleet.scheduler import JobRequest, JobState
from pipeline.fleet.site import load_fleet_site
from pipeline.matrix.read import load_matrix
from stackproof.fleetjob import run_fleet

REPO = Path(__file__).resolve().parents[2]
MATRIX = load_matrix(REPO / "matrix.yaml", images_dir=REPO / "images")


class Scripted:
    """Each job's states in turn (the last repeats); `refuse` maps a cell to a refusal."""

    name = "scripted"

    def __init__(self, script: dict[str, list[tuple[str, int | None]]], refuse: dict[str, str] | None = None) -> None:
        self.script, self.refuse = script, refuse or {}
        self.submitted: list[JobRequest] = []
        self.cancelled: list[str] = []
        self.interrupt_on_poll: int | None = None
        self.polls = 0

    def check(self, request: JobRequest) -> str | None:
        return self.refuse.get(request.placement.cell)

    def submit(self, request: JobRequest) -> str:
        self.submitted.append(request)
        return str(len(self.submitted))

    def states(self, job_ids: list[str]) -> dict[str, JobState]:
        self.polls += 1
        if self.polls == self.interrupt_on_poll:
            raise KeyboardInterrupt
        out = {}
        for job_id in job_ids:
            request = self.submitted[int(job_id) - 1]
            steps = self.script[request.placement.cell]
            state, code = steps[min(self.polls - 1, len(steps) - 1)]
            if job_id in self.cancelled:
                state, code = "CANCELLED", None
            if state == "COMPLETED":  # what the job's `stackproof run` leaves behind
                run = request.workdir / "out" / request.placement.cell / "run-1"
                run.mkdir(parents=True, exist_ok=True)
                (run / "receipt.json").write_text(json.dumps({"status": "PASS"}))
            node = None if state == "PENDING" else "vm"
            out[job_id] = JobState(
                job_id=job_id,
                state=state,
                node=node,
                exit_code=code,
                reason="NodeDown" if state == "NODE_FAIL" else None,
            )
        return out

    def cancel(self, job_ids: list[str]) -> None:
        self.cancelled += job_ids


def site(tmp_path: Path):  # type: ignore[no-untyped-def]
    path = tmp_path / "fleet.yaml"
    path.write_text(
        f"schema_version: 1\nscheduler: slurm\nshared_dir: {tmp_path}\n"
        "arch: {none: {}, sm90: {gres: 'gpu:h100'}}\n"
    )
    return load_fleet_site(path)


def run(tmp_path: Path, scheduler: Scripted, cells: list[str]):  # type: ignore[no-untyped-def]
    return run_fleet(MATRIX, cells, site(tmp_path), scheduler, matrix_file=REPO / "matrix.yaml",
                     images=REPO / "images", poll_s=0, say=lambda line: None)  # fmt: skip


def test_states_become_statuses_and_the_worst_exit(tmp_path: Path) -> None:
    scheduler = Scripted({
        "cpu-tiny-host": [("PENDING", None), ("RUNNING", None), ("COMPLETED", 0)],
        "h200-vllm-0.26.0-tiny": [("RUNNING", None), ("FAILED", 3)],
        "cpu-tiny": [("RUNNING", None), ("NODE_FAIL", None)],
    })  # fmt: skip
    fleet = run(tmp_path, scheduler, ["cpu-tiny-host", "h200-vllm-0.26.0-tiny", "cpu-tiny"])
    rows = {r.placement.cell: r.to_json() for r in fleet.cells}
    assert rows["cpu-tiny-host"]["status"] == "PASS" and rows["cpu-tiny-host"]["exit_code"] == 0
    assert rows["cpu-tiny-host"]["times"]["dispatch_s"] is not None
    assert (rows["h200-vllm-0.26.0-tiny"]["status"], rows["h200-vllm-0.26.0-tiny"]["exit_code"]) == ("ERROR", 3)
    assert rows["cpu-tiny"]["status"] == "NODE_FAIL" and rows["cpu-tiny"]["scheduler"]["reason"] == "NodeDown"
    assert fleet.exit_code == 3
    assert json.loads((fleet.folder / "cpu-tiny" / "fleet-receipt.json").read_text())["status"] == "NODE_FAIL"
    script = (fleet.folder / "cpu-tiny-host" / "job.sh").read_text()
    assert "-m pipeline run cpu-tiny-host" in script and "verdict.json" in script


def test_a_refusal_submits_nothing_and_leaves_no_folder(tmp_path: Path) -> None:
    scheduler = Scripted(
        {"cpu-tiny-host": [("COMPLETED", 0)]}, refuse={"h200-vllm-0.26.0-tiny": "Invalid feature specification"}
    )
    with pytest.raises(InputError, match=r"h200-vllm-0\.26\.0-tiny: Invalid feature specification"):
        run(tmp_path, scheduler, ["cpu-tiny-host", "h200-vllm-0.26.0-tiny"])
    assert scheduler.submitted == [] and list(tmp_path.glob("fleet-*")) == []


def test_an_interrupt_cancels_what_is_not_finished(tmp_path: Path) -> None:
    scheduler = Scripted({"cpu-tiny-host": [("COMPLETED", 0)], "cpu-tiny": [("RUNNING", None)]})
    scheduler.interrupt_on_poll = 2
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, scheduler, ["cpu-tiny-host", "cpu-tiny"])
    assert scheduler.cancelled == ["2"]  # the finished job is not cancelled
    rows = {r["cell"]: r for r in json.loads(next(tmp_path.glob("fleet-*/fleet.json")).read_text())}
    assert rows["cpu-tiny-host"]["status"] == "PASS" and rows["cpu-tiny"]["status"] == "CANCELLED"
