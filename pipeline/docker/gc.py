"""Containers of dead runs: every container the tool creates names its owner (host, pid and the
pid's start time), so a later run, or `stackproof gc`, can remove those whose owner is gone
(`Docker.collect_garbage`: the labels and the rule are here, the docker calls in pipeline/docker/client.py).

A run killed with SIGKILL cleans nothing: its server container (and the `docker logs -f` that
followed it, which ends with the container) would stay forever. The owner's start time guards
against a reused pid; containers of other hosts sharing the daemon are never touched.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = [
    "JOB_LABEL",
    "OWNER_PID_LABEL",
    "Owned",
    "dead_containers",
    "job_labels",
    "owner_labels",
    "owner_start_time",
    "process_alive",
    "stat_fields",
]

OWNER_HOST_LABEL = "io.stackproof.owner-host"
OWNER_PID_LABEL = "io.stackproof.owner-pid"
OWNER_START_LABEL = "io.stackproof.owner-start"
JOB_LABEL = "io.stackproof.job"  # STACKPROOF_JOB, when set: a CI job (or a test) finds its own containers


@dataclass(frozen=True, kw_only=True)
class Owned:
    """A container as `docker ps` shows its owner labels."""

    id: str
    name: str
    host: str
    pid: str
    start: str


def owner_labels(env: Mapping[str, str] | None = None) -> list[str]:
    """The labels of a container this process creates."""
    env = os.environ if env is None else env
    labels = [
        f"{OWNER_HOST_LABEL}={socket.gethostname()}",
        f"{OWNER_PID_LABEL}={os.getpid()}",
        f"{OWNER_START_LABEL}={owner_start_time(os.getpid()) or ''}",
    ]
    labels += [f"{k}={v}" for k, v in job_labels(env).items()]
    return labels


def job_labels(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`{io.stackproof.job: STACKPROOF_JOB}` when set: on images too, so a CI job (or a test
    session) removes only what it built, never an image a concurrent job just made."""
    env = os.environ if env is None else env
    return {JOB_LABEL: env["STACKPROOF_JOB"][:128]} if env.get("STACKPROOF_JOB") else {}


def dead_containers(containers: list[Owned], *, host: str, alive: Callable[[int, str], bool]) -> list[Owned]:
    """Pure: the containers of this host whose owner process no longer runs."""
    dead = []
    for c in containers:
        if c.host != host or not c.pid.isdigit():
            continue
        if not alive(int(c.pid), c.start):
            dead.append(c)
    return dead


def process_alive(pid: int, start: str) -> bool:
    """Whether `pid` runs and is the same process (its start time, when recorded, matches)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    now = owner_start_time(pid)
    return not start or now is None or now == start


def stat_fields(pid: int, proc: str = "/proc") -> list[str] | None:
    """/proc/PID/stat after the command name, so field N of proc(5) is index N - 3 (state is 0);
    None when the process is gone. The name is cut at the last ")" since it may hold spaces."""
    try:
        with open(f"{proc}/{pid}/stat") as file:
            stat = file.read()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()


def owner_start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22)."""
    fields = stat_fields(pid)
    return fields[19] if fields and len(fields) > 19 else None
