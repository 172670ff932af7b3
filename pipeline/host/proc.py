"""Server processes of the host runtime: started in a session of their own, marked, found, ended.

A container is found by its labels; a host process has none. What it has is its environment, which
every child inherits (vLLM's API server forks or spawns the EngineCore and its workers), so each
server the tool starts carries two variables: `STACKPROOF_HOST_RUN` (the server's name) and
`STACKPROOF_OWNER` (this host, the owner's pid and that pid's start time, as the containers' owner
labels in pipeline/docker/gc.py). A process is this tool's when /proc/PID/environ has them; only the
processes of the same user can be read, which are the only ones this user could end anyway.

Ending one server: SIGTERM to its process group (the session `start_new_session` made), a grace
period, then SIGKILL to the group and to every process that still carries its mark (one that moved
to another group is found too). A run killed with SIGKILL ends nothing: the next run, or `stackproof
gc`, ends the marked processes whose owner is gone (`dead_runs`, `end_run`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from pipeline.docker.gc import owner_start_time, process_alive, stat_fields

__all__ = [
    "OWNER_ENV",
    "RUN_ENV",
    "Marked",
    "dead_runs",
    "end_run",
    "group_members",
    "marked_processes",
    "owner_marks",
]

RUN_ENV = "STACKPROOF_HOST_RUN"
OWNER_ENV = "STACKPROOF_OWNER"
GRACE_S = 15.0  # vLLM's API server shuts its engine down on SIGTERM in well under that


@dataclass(frozen=True, kw_only=True)
class Marked:
    """A live process carrying a host run's mark."""

    pid: int
    pgid: int
    run: str
    owner: str  # host:pid:start

    def owner_alive(self, host: str, alive: Callable[[int, str], bool] = process_alive) -> bool:
        owner_host, _, rest = self.owner.partition(":")
        pid, _, start = rest.partition(":")
        if owner_host != host or not pid.isdigit():
            return True  # another host's (a shared /proc is not expected) or unreadable: never ours to end
        return alive(int(pid), start)


def owner_marks(run: str) -> dict[str, str]:
    """The variables a server started by this process carries (and hands to all its children)."""
    pid = os.getpid()
    return {RUN_ENV: run, OWNER_ENV: f"{socket.gethostname()}:{pid}:{owner_start_time(pid) or ''}"}


def marked_processes(proc: str = "/proc") -> list[Marked]:
    """Every readable process that carries a host run's mark."""
    found = []
    for entry in _pids(proc):
        marks = _marks(f"{proc}/{entry}/environ")
        if marks is None or RUN_ENV not in marks:
            continue
        pgid = _pgid(proc, entry)
        if pgid is None:
            continue  # gone meanwhile
        found.append(Marked(pid=entry, pgid=pgid, run=marks[RUN_ENV], owner=marks.get(OWNER_ENV, "")))
    return found


def group_members(pgid: int, proc: str = "/proc") -> list[int]:
    """The live processes of process group `pgid`."""
    return [pid for pid in _pids(proc) if _pgid(proc, pid) == pgid]


def dead_runs(marked: Iterable[Marked], *, host: str | None = None) -> dict[str, list[Marked]]:
    """Pure but for the liveness check: the runs whose owner process is gone, with their processes."""
    host = host or socket.gethostname()
    runs: dict[str, list[Marked]] = {}
    for process in marked:
        if not process.owner_alive(host):
            runs.setdefault(process.run, []).append(process)
    return runs


def end_run(run: str, *, pgid: int | None = None, grace_s: float = GRACE_S, proc: str = "/proc") -> list[int]:
    """SIGTERM the run's group, wait up to `grace_s`, SIGKILL whatever of it (group or mark) is left.
    Returns the pids that were still there when it began; none is left when it returns."""

    def remaining() -> set[int]:
        members = set(group_members(pgid, proc)) if pgid is not None else set()
        return members | {m.pid for m in marked_processes(proc) if m.run == run}

    found = remaining()
    if not found:
        return []
    groups = {pgid} if pgid is not None else set()
    groups |= {g for g in (_pgid(proc, pid) for pid in found) if g is not None}
    for group in groups:
        _signal_group(group, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while remaining() and time.monotonic() < deadline:
        time.sleep(0.2)
    for _ in range(50):  # SIGKILL cannot be refused; a child forked meanwhile is caught on the next pass
        left = remaining()
        if not left:
            break
        for group in groups:
            _signal_group(group, signal.SIGKILL)
        for pid in left:
            _signal(pid, signal.SIGKILL)
        time.sleep(0.1)
    return sorted(found)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    if pgid <= 1 or pgid == os.getpgrp():
        return  # never our own group, never init's
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _pids(proc: str) -> list[int]:
    try:
        return [int(name) for name in os.listdir(proc) if name.isdigit()]
    except OSError:
        return []


def _marks(path: str) -> Mapping[str, str] | None:
    try:
        with open(path, "rb") as file:
            raw = file.read(1 << 20)
    except OSError:  # another user's process, or gone
        return None
    if RUN_ENV.encode() not in raw:
        return None
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in pairs if k in _NAMES}


_NAMES = {RUN_ENV.encode(), OWNER_ENV.encode()}


def _pgid(proc: str, pid: int) -> int | None:
    """/proc/PID/stat field 5 (pgrp); None when the process is gone or a zombie."""
    fields = stat_fields(pid, proc)
    if fields is None or len(fields) < 3 or fields[0] == "Z":
        return None
    return int(fields[2])
