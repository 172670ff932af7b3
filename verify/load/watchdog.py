"""Engine progress versus API liveness, live: scrape /metrics every second, probe when progress stops.

Runs beside the load on its own connection pool, so a saturated load client cannot starve it.
Every scrape is kept (scrapes.jsonl); the `Tracker` applies the stall rule; when it fires, or
when requests fail the way a dead server makes them fail, /health, /v1/models and /metrics are
probed and the verdict is recorded as an `Event` with the evidence of that moment: engine steps,
cumulative tokens, gauges, the last server log lines, GPU utilisation and power where NVML is
available, and kernel-log Xid lines where readable.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import IO, Any

from verify.load.progress import Probe, Progress, StallVerdict, Tracker, parse_metrics, verdict_of
from verify.logs.kernellog import read_kernel_log
from verify.serving import MetricNames
from verify.serving.openai import ServerAPI

__all__ = ["Event", "Scrape", "Watchdog", "gpu_snapshot", "scrape"]

# A verdict ends the run: these say the server cannot serve (or restarted under the load).
FATAL = (
    StallVerdict.ENGINE_STALL_API_ALIVE,
    StallVerdict.ENGINE_DEAD,
    StallVerdict.API_UNRESPONSIVE,
    StallVerdict.RESTART_DETECTED,
)


@dataclass(frozen=True, kw_only=True)
class Scrape:
    at: float  # seconds from the run's start
    progress: Progress | None  # None: the scrape failed (unknown, never idle)
    in_flight: int
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"t": round(self.at, 3), "in_flight": self.in_flight}
        data.update(asdict(self.progress) if self.progress else {"error": self.error})
        return data


@dataclass(frozen=True, kw_only=True)
class Event:
    """A verdict of the watchdog, with what was true when it was reached."""

    type: StallVerdict
    at: float
    reason: str
    progress_age_s: float
    in_flight: int
    engine_steps: float | None
    cum_tokens: float | None
    generated_tokens: float | None
    running: float | None
    waiting: float | None
    api: dict[str, int | None]
    gpu: dict[str, Any]
    last_log_lines: list[str] = field(default_factory=list)
    kernel_xid: list[str] | str = field(default_factory=list)
    forensics: dict[str, Any] | None = None  # ENGINE_STALL_API_ALIVE: stacks, GPU spin rule, core dump
    death: dict[str, Any] | None = None  # ENGINE_DEAD told by behaviour: verify/load/death.py's Death

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


async def scrape(api: ServerAPI, names: MetricNames) -> tuple[Progress | None, str | None]:
    """One /metrics scrape reduced to progress, or why it failed (unknown, never idle)."""
    text, error = await api.metrics_text()
    if text is None:
        return None, error
    try:
        return parse_metrics(text, names), None
    except ValueError as exc:  # the parser rejected the exposition
        return None, f"unparseable /metrics: {exc}"


def gpu_snapshot() -> dict[str, Any]:
    """Utilisation (%) and power (W) of every GPU, through NVML when the host has it."""
    try:
        import pynvml  # nvidia-ml-py: present on GPU hosts, optional here
    except ImportError:
        return {"available": False, "reason": "nvidia-ml-py is not installed on this host"}
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound and friends: a host without a driver
        return {"available": False, "reason": f"NVML: {exc}"}
    try:
        devices = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            util = pynvml.nvmlDeviceGetUtilizationRates(handle)
            devices.append(
                {
                    "index": i,
                    "util_percent": util.gpu,
                    "power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
                }
            )
        return {"available": True, "devices": devices}
    finally:
        pynvml.nvmlShutdown()


def _kernel_xid(since: float) -> list[str] | str:
    data, source = read_kernel_log(since)
    if data is None:
        return f"unreadable: {source}"
    return [line for line in data.decode(errors="replace").splitlines() if "NVRM: Xid" in line][-20:]


@dataclass(kw_only=True)
class Watchdog:
    """Scrapes on a fixed tick until `stop` is set; sets `event` (and `stop`) on a fatal verdict."""

    api: ServerAPI  # its own connection pool: a saturated load client cannot starve it
    names: MetricNames
    tracker: Tracker
    clock: Callable[[], float]
    in_flight: Callable[[], int]
    stop: asyncio.Event
    interval_s: float
    series: IO[str] | None = None
    server_alive: Callable[[], str | None] | None = None  # None while alive, else why not (blocking)
    last_log_lines: Callable[[], list[str]] = list
    wall_started: float = field(default_factory=time.time)
    check_gpu: bool = False
    scrapes: list[Scrape] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    probe_requested: bool = False  # a request failed the way a dead server makes it fail
    # Told of an engine stall with the API alive (blocking, given the progress age), before the run
    # ends and the server is removed: its answer is the event's `forensics` (verify/forensics/stall.py).
    on_stall: Callable[[float], dict[str, Any]] | None = None

    @property
    def fatal(self) -> Event | None:
        return next((e for e in self.events if e.type in FATAL), None)

    async def run(self) -> None:
        tick = self.clock()
        ticks = 0
        while not self.stop.is_set():
            await self.step()
            ticks += 1
            if ticks % 3 == 0 and not self.stop.is_set():
                await self.check_container()
            tick += self.interval_s
            delay = tick - self.clock()
            if delay < 0:  # a slow probe: skip the missed ticks rather than bunch them
                tick = self.clock()
                delay = 0
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), delay)

    async def step(self) -> None:
        at = self.clock()
        progress, error = await scrape(self.api, self.names)
        record = Scrape(at=at, progress=progress, in_flight=self.in_flight(), error=error)
        self.scrapes.append(record)
        if self.series is not None:
            self.series.write(json.dumps(record.to_json()) + "\n")
            self.series.flush()
        if self.tracker.observe(at, progress) is StallVerdict.RESTART_DETECTED:
            await self.conclude(StallVerdict.RESTART_DETECTED, "a counter went backwards or the API process restarted")
            return
        requested, self.probe_requested = self.probe_requested, False
        if self.tracker.stalled(at, record.in_flight):
            answers = await self.api.probe()
            verdict = verdict_of(answers, health_runs_engine=self.api.driver.health_runs_engine)
            age = self.tracker.progress_age(at)
            await self.conclude(
                verdict,
                f"{record.in_flight} requests in flight and no engine progress for {age:.1f}s "
                f"(stall_seconds {self.tracker.stall_seconds:g})",
                answers,
            )
        elif requested:
            await self.confirm_dead()

    async def final_check(self) -> None:
        """After the run ended for another reason (errors): is the server still there to blame?"""
        if self.fatal is None and not await self.check_container():
            await self.confirm_dead()

    async def check_container(self) -> bool:
        """ENGINE_DEAD when the server's container is gone; True when it concluded so."""
        gone = await asyncio.to_thread(self.server_alive) if self.server_alive is not None else None
        if gone is not None:
            await self.conclude(StallVerdict.ENGINE_DEAD, f"the server container {gone}")
        return gone is not None

    async def confirm_dead(self) -> None:
        """Requests failed the way a dead server fails them: conclude only when the probes agree."""
        answers = await self.api.probe()
        verdict = verdict_of(answers, health_runs_engine=self.api.driver.health_runs_engine)
        if verdict in (StallVerdict.ENGINE_DEAD, StallVerdict.API_UNRESPONSIVE):
            await self.conclude(verdict, "requests failed and the probes confirm the server cannot serve", answers)

    async def conclude(self, verdict: StallVerdict, reason: str, answers: Probe | None = None) -> None:
        if verdict is StallVerdict.UNKNOWN and self.events and self.events[-1].type is StallVerdict.UNKNOWN:
            return  # mixed answers while stalled: recorded once, and the rule keeps watching
        if answers is None:
            answers = await self.api.probe()
        at = self.clock()
        last = self.tracker.last
        gpu = await asyncio.to_thread(gpu_snapshot) if self.check_gpu else {"available": False, "reason": "CPU cell"}
        forensics = None
        if verdict is StallVerdict.ENGINE_STALL_API_ALIVE and self.on_stall is not None:
            forensics = await asyncio.to_thread(self.on_stall, self.tracker.progress_age(at))
        event = Event(
            type=verdict,
            at=round(at, 3),
            reason=reason,
            progress_age_s=round(self.tracker.progress_age(at), 2),
            in_flight=self.in_flight(),
            engine_steps=last.steps if last else None,
            cum_tokens=last.tokens if last else None,
            generated_tokens=last.generated if last else None,
            running=last.running if last else None,
            waiting=last.waiting if last else None,
            api={"health": answers.health, "models": answers.models, "metrics": answers.metrics},
            gpu=gpu,
            last_log_lines=self.last_log_lines()[-30:],
            kernel_xid=await asyncio.to_thread(_kernel_xid, self.wall_started),
            forensics=forensics,
        )
        self.events.append(event)
        if verdict in FATAL:
            self.stop.set()
