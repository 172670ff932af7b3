"""What a load run costs on the CPU: the server's CPU-seconds per output token, its peak RSS, and
output tokens per second per core.

The server runs in a container, and a container is a cgroup: its CPU time (`cpu.stat` usage_usec
on cgroup v2, `cpuacct.usage` on v1) counts every process in it, workers included, and its
anonymous memory (`anon` in v2's memory.stat, `total_rss` in v1's) is its RSS without the page
cache (a 2 GB model file read once is not memory the server needs). The host finds the cgroup
from the container's init process (`/proc/PID/cgroup`, PID from `docker inspect` through the
engine); the cores are that process's CPU affinity, capped by the cgroup's CPU quota.

`CgroupReader` is the edge (files under /proc and /sys/fs/cgroup, their root injectable for the
tests); `CpuSampler` reads it once a second beside the load; `cpu_cost_fields` is the arithmetic,
pure, every field a value with its unit or the reason it is empty.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "CPU_FIELDS",
    "CgroupReader",
    "CpuReader",
    "CpuSample",
    "CpuSampler",
    "ProcessTreeReader",
    "cpu_cost_fields",
    "empty_cpu_fields",
    "parse_proc_cgroup",
    "reader_for",
]

_UNITS = {
    "cpu_seconds": "CPU-s",
    "cpu_seconds_per_output_token": "CPU-s/token",
    "peak_rss_bytes": "bytes",
    "output_tok_s_per_core": "tokens/s/core",
    "cores": "cores",
}
CPU_FIELDS = tuple(_UNITS)  # the receipt's CPU cost fields, in this order


@dataclass(frozen=True, kw_only=True)
class CpuSample:
    at: float  # time.monotonic()
    cpu_seconds: float  # the cgroup's CPU time since the container started
    rss_bytes: int | None  # anonymous memory now; None where the memory controller cannot say


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """`/proc/PID/cgroup` -> {controller: path}; cgroup v2's one line is under the key ""."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller.removeprefix("name=")] = path
    return paths


CGROUP_SOURCE = "the server container's cgroup (CPU time of all its processes; RSS = anonymous memory)"
PROCESS_TREE_SOURCE = (
    "the server's processes on the host (user + system time of each and of its reaped children; RSS = RssAnon)"
)


class CpuReader(Protocol):
    """One reading of a server's CPU time and RSS, and the cores it may use."""

    @property
    def source(self) -> str: ...

    def read(self) -> CpuSample: ...

    def cores(self) -> float: ...


@dataclass(frozen=True, kw_only=True)
class CgroupReader:
    """The cgroup of one process, as the host sees it (`root`: "/" but for the tests)."""

    pid: int
    root: Path = Path("/")
    source: str = CGROUP_SOURCE

    def read(self) -> CpuSample:
        """One sample; OSError or ValueError when the cgroup is gone or unreadable."""
        paths = parse_proc_cgroup((self.root / f"proc/{self.pid}/cgroup").read_text())
        fs = self.root / "sys/fs/cgroup"
        if "cpuacct" in paths:  # cgroup v1: one hierarchy per controller
            cpu_ns = int((fs / "cpuacct" / paths["cpuacct"].lstrip("/") / "cpuacct.usage").read_text())
            memory = _stat(fs / "memory" / paths.get("memory", "/").lstrip("/") / "memory.stat")
            return CpuSample(at=time.monotonic(), cpu_seconds=cpu_ns / 1e9, rss_bytes=memory.get("total_rss"))
        if "" in paths:  # cgroup v2: one unified hierarchy
            group = fs / paths[""].lstrip("/")
            usage_us = _stat(group / "cpu.stat")["usage_usec"]
            memory = _stat(group / "memory.stat")
            return CpuSample(at=time.monotonic(), cpu_seconds=usage_us / 1e6, rss_bytes=memory.get("anon"))
        raise ValueError(f"/proc/{self.pid}/cgroup names neither a cpuacct (v1) nor a unified (v2) cgroup")

    def cores(self) -> float:
        """The CPUs the container may run on: its affinity, capped by a CPU quota (`--cpus`)."""
        try:
            affinity = float(len(os.sched_getaffinity(self.pid)))
        except OSError:
            affinity = float(os.cpu_count() or 1)
        quota = self._quota()
        return min(affinity, quota) if quota else affinity

    def _quota(self) -> float | None:
        try:
            paths = parse_proc_cgroup((self.root / f"proc/{self.pid}/cgroup").read_text())
            fs = self.root / "sys/fs/cgroup"
            if "cpu" in paths:
                group = fs / "cpu" / paths["cpu"].lstrip("/")
                quota, period = (int((group / name).read_text()) for name in ("cpu.cfs_quota_us", "cpu.cfs_period_us"))
            else:
                text = (fs / paths.get("", "/").lstrip("/") / "cpu.max").read_text().split()
                if text[0] == "max":
                    return None
                quota, period = int(text[0]), int(text[1])
        except (OSError, ValueError, IndexError, KeyError):
            return None
        return quota / period if quota > 0 and period > 0 else None


def _stat(path: Path) -> dict[str, int]:
    """`key value` lines (cpu.stat, memory.stat) as integers."""
    values: dict[str, int] = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            values[key] = int(value)
    return values


@dataclass(frozen=True, kw_only=True)
class ProcessTreeReader:
    """The processes of a host-runtime server (no cgroup of its own: it shares the user's).

    CPU time is the sum over its live processes of their own and their reaped children's user and
    system time (/proc/PID/stat fields 14-17, in clock ticks); RSS is the sum of their anonymous
    resident memory (`RssAnon` in /proc/PID/status, the cgroup's `anon`). A process that exits
    unreaped takes its time with it, so a worker ended mid-load can make the total drop:
    `cpu_cost_fields` says so rather than counting it."""

    pids: Callable[[], list[int]]
    root: Path = Path("/")
    source: str = PROCESS_TREE_SOURCE

    def read(self) -> CpuSample:
        pids = self.pids()
        if not pids:
            raise ValueError("the server has no live process")
        ticks = float(os.sysconf("SC_CLK_TCK"))
        cpu = 0.0
        rss = 0
        for pid in pids:
            try:
                fields = (self.root / f"proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
                status = (self.root / f"proc/{pid}/status").read_text()
            except OSError:
                continue  # ended between the listing and the reading
            cpu += sum(int(v) for v in fields[11:15]) / ticks
            rss += next((int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("RssAnon:")), 0)
        return CpuSample(at=time.monotonic(), cpu_seconds=cpu, rss_bytes=rss)

    def cores(self) -> float:
        pids = self.pids()
        try:
            return float(len(os.sched_getaffinity(pids[0]))) if pids else float(os.cpu_count() or 1)
        except OSError:
            return float(os.cpu_count() or 1)


@dataclass(kw_only=True)
class CpuSampler:
    """Samples `reader` every `interval_s` on a thread until `stop()`; one failed read is a gap."""

    reader: CpuReader
    interval_s: float = 1.0
    samples: list[CpuSample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> CpuSampler:
        self.sample_once()  # the first reading is the load's start
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._thread.start()
        return self

    def sample_once(self) -> None:
        try:
            self.samples.append(self.reader.read())
        except (OSError, ValueError, KeyError) as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}"[:300])

    def stop(self) -> list[CpuSample]:
        if not self._stop.is_set():
            self._stop.set()
            if self._thread is not None:
                self._thread.join(timeout=10)
            self.sample_once()  # the last reading is the load's end
        return list(self.samples)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample_once()


# -- the arithmetic (pure) -------------------------------------------------------------------------


def _field(value: float | int | None, name: str, reason: str | None = None) -> dict[str, Any]:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return {"value": None, "unit": _UNITS[name], "reason": reason or "not measured"}
    return {"value": round(value, 9) if isinstance(value, float) else value, "unit": _UNITS[name]}


def empty_cpu_fields(reason: str) -> dict[str, Any]:
    return {name: _field(None, name, reason) for name in CPU_FIELDS}


def cpu_cost_fields(
    samples: Sequence[CpuSample],
    *,
    output_tokens: int,
    seconds: float,
    cores: float | None,
    source: str = CGROUP_SOURCE,
) -> dict[str, Any]:
    """The CPU half of the load's cost section, from the samples taken over it."""
    if len(samples) < 2:
        return empty_cpu_fields(f"{len(samples)} cgroup reading(s) during the load: two are needed")
    spent = samples[-1].cpu_seconds - samples[0].cpu_seconds
    if spent < 0:
        return empty_cpu_fields(
            "the server's CPU time went backwards (a process ended unreaped, or another container under the same name)"
        )
    rss = [s.rss_bytes for s in samples if s.rss_bytes is not None]
    per_token = spent / output_tokens if output_tokens > 0 else None
    per_core = output_tokens / seconds / cores if seconds > 0 and cores else None
    return {
        "cpu_seconds": _field(spent, "cpu_seconds"),
        "cpu_seconds_per_output_token": _field(per_token, "cpu_seconds_per_output_token", "no output tokens"),
        "peak_rss_bytes": _field(max(rss) if rss else None, "peak_rss_bytes", "the memory controller gave no RSS"),
        "output_tok_s_per_core": _field(per_core, "output_tok_s_per_core", "the load took no time or no core"),
        "cores": _field(cores, "cores", "the container's CPUs are unknown"),
        "cpu_samples": len(samples),
        "cpu_source": source,
    }


def reader_for(pid_of: Callable[[], int | None], root: Path = Path("/")) -> CgroupReader | str:
    """The reader of the container whose init process `pid_of` names, or why there is none."""
    try:
        pid = pid_of()
    except Exception as exc:  # the engine's error (a container gone): the field says so
        return f"the server's PID is unknown: {type(exc).__name__}: {exc}"[:300]
    if not pid:
        return "the server container has no running process (docker inspect .State.Pid is 0)"
    reader = CgroupReader(pid=pid, root=root)
    try:
        reader.read()
    except (OSError, ValueError, KeyError) as exc:
        return f"the server's cgroup is not readable from this host: {type(exc).__name__}: {exc}"[:300]
    return reader
