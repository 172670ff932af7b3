"""The seam a scheduler fills: check a request without submitting, submit a job, read job states,
cancel. Slurm's is slurm.py; a Kubernetes one would map the same calls onto Jobs (docs/fleet.md).

Job states are the scheduler's own words (Slurm's JOB_STATE_CODES, kept as it prints them), with the
reason it gives and the node; what a state means for the cell's verdict is decided here, once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pipeline.fleet.plan import Placement

__all__ = ["FAULT_STATES", "FINISHED", "JobRequest", "JobState", "Scheduler"]

# Slurm's terminal states (slurm/slurm.h job_states, squeue(1) "JOB STATE CODES"): a job in one of
# these runs no more. FAULT_STATES ended it from outside the cell's own process: the cell's verdict
# is the state itself, never a silent gap.
FINISHED = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "PREEMPTED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "REVOKED",
        "SPECIAL_EXIT",
        "GONE",
    }
)
FAULT_STATES = FINISHED - {"COMPLETED", "FAILED"}


@dataclass(frozen=True, kw_only=True)
class JobRequest:
    """What to submit: the placement, the script to run, where its output goes."""

    placement: Placement
    name: str
    script: Path
    workdir: Path
    output: Path
    time_limit_min: int


@dataclass(frozen=True, kw_only=True)
class JobState:
    job_id: str
    state: str  # PENDING, RUNNING, COMPLETED, CANCELLED, NODE_FAIL, ... (GONE: the scheduler forgot it)
    reason: str | None = None  # Slurm's Reason (Resources, Priority, NodeDown, ...); None when "None"
    node: str | None = None
    exit_code: int | None = None  # the script's exit status once finished
    signal: int | None = None
    submitted_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None

    @property
    def finished(self) -> bool:
        return self.state in FINISHED


class Scheduler(Protocol):
    name: str

    def check(self, request: JobRequest) -> str | None:
        """The scheduler's own refusal of `request` (it could never run), without submitting; None if it could."""

    def submit(self, request: JobRequest) -> str:
        """Submit; the job id."""

    def states(self, job_ids: list[str]) -> dict[str, JobState]:
        """Each job's state now."""

    def cancel(self, job_ids: list[str]) -> None:
        """Cancel every job given (finished ones are ignored)."""
