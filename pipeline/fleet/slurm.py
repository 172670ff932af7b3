"""Slurm through its own commands, as sites script against it: `sbatch --parsable` to submit (and
`--test-only` to ask without submitting), `scontrol show job -o` for states (it needs no accounting
database, which `sacct` does), `scancel` to cancel. The only module of the fleet that runs anything.

Every command has a deadline; a controller that does not answer is exit 3 saying what to check.
"""

from __future__ import annotations

import os
import re
import shutil
import time

from pipeline import cmd
from pipeline.cmd import CommandResult
from pipeline.errors import InfraError
from pipeline.fleet.scheduler import JobRequest, JobState

__all__ = ["Slurm", "parse_job_line", "sbatch_argv"]

_TIMEOUT_S = 30
_FIELD = re.compile(r"(\w+)=(\S*)")


class Slurm:
    name = "slurm"

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.env = env
        for tool in ("sbatch", "scontrol", "scancel"):
            if shutil.which(tool, path=(env or os.environ).get("PATH")) is None:
                raise InfraError(f"no `{tool}` on PATH: install Slurm's client commands (Debian: slurm-client)")

    def check(self, request: JobRequest) -> str | None:
        done = self._run([*sbatch_argv(request), "--test-only", str(request.script)], check=False)
        if done.returncode == 0:
            return None
        return _last_error(done.stderr) or f"sbatch --test-only exited {done.returncode}"

    def submit(self, request: JobRequest) -> str:
        done = self._run([*sbatch_argv(request), "--parsable", str(request.script)], check=False)
        job_id = done.stdout.strip().split(";")[0]
        if done.returncode != 0 or not job_id.isdigit():
            raise InfraError(
                f"sbatch of {request.placement.cell} failed: {_last_error(done.stderr) or done.stdout.strip()}"
            )
        return job_id

    def states(self, job_ids: list[str]) -> dict[str, JobState]:
        out: dict[str, JobState] = {}
        for job_id in job_ids:
            done = self._run(["scontrol", "show", "job", "-o", job_id], check=False)
            line = done.stdout.strip().splitlines()[0] if done.stdout.strip() else ""
            if done.returncode != 0 or not line:
                if "Invalid job id" in done.stderr:  # aged out of the controller (MinJobAge): it forgot the job
                    out[job_id] = JobState(job_id=job_id, state="GONE", reason="the controller no longer knows the job")
                    continue
                raise InfraError(
                    f"scontrol show job {job_id}: {_last_error(done.stderr) or 'no answer'}: is slurmctld up?"
                )
            out[job_id] = parse_job_line(line)
        return out

    def cancel(self, job_ids: list[str]) -> None:
        if job_ids:
            self._run(["scancel", *job_ids], check=False)

    def _run(self, argv: list[str], *, check: bool) -> CommandResult:
        """Through pipeline.cmd (the one subprocess caller), quietly: polls would flood the console."""
        try:
            return cmd.run(argv, env=self.env, timeout=_TIMEOUT_S, check=check, quiet=True)
        except InfraError as exc:
            raise InfraError(f"{exc}: is slurmctld running (SLURM_CONF, `scontrol ping`)?") from None


def sbatch_argv(request: JobRequest) -> list[str]:
    """sbatch's options for `request` (the script path follows). --no-requeue: a job lost with its
    node is reported as NODE_FAIL, not silently started again elsewhere (docs/fleet.md)."""
    p = request.placement
    argv = [
        "sbatch",
        f"--job-name={request.name}",
        f"--output={request.output}",
        f"--chdir={request.workdir}",
        f"--time={request.time_limit_min}",
        "--nodes=1",
        "--ntasks=1",
        "--no-requeue",
    ]
    argv += [f"--gres={p.gres}"] if p.gres else []
    argv += [f"--constraint={p.constraint}"] if p.constraint else []
    argv += [f"--partition={p.partition}"] if p.partition else []
    return argv


def parse_job_line(line: str) -> JobState:
    """One line of `scontrol show job -o` (KEY=VALUE pairs) as a JobState."""
    fields = dict(_FIELD.findall(line))
    state = fields.get("JobState", "UNKNOWN")
    exit_code, signal = _exit(fields.get("ExitCode"))
    node = fields.get("BatchHost") or fields.get("NodeList")
    reason = fields.get("Reason")
    return JobState(
        job_id=fields.get("JobId", "?"),
        state=state,
        reason=None if reason in (None, "None", "(null)") else reason,
        node=None if node in (None, "", "(null)", "None") else node,
        exit_code=exit_code if state not in ("PENDING", "RUNNING") else None,
        signal=signal,
        submitted_at=_time(fields.get("SubmitTime")),
        started_at=_time(fields.get("StartTime")) if state != "PENDING" else None,
        ended_at=_time(fields.get("EndTime")) if state not in ("PENDING", "RUNNING") else None,
    )


def _exit(text: str | None) -> tuple[int | None, int | None]:
    """`ExitCode=3:0`: the script's status and the signal that ended it."""
    code, _, sig = (text or "").partition(":")
    return (int(code) if code.isdigit() else None), (int(sig) if sig.isdigit() and int(sig) else None)


def _time(text: str | None) -> float | None:
    """scontrol's local time, 2026-12-06T20:10:00 (`Unknown`/`None` when not yet)."""
    try:
        return time.mktime(time.strptime(text or "", "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def _last_error(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return lines[-1].removeprefix("sbatch: error: ") if lines else ""
