"""Engine progress versus API liveness, from the server's /metrics: the pure half of the load stage.

A wedged engine leaves /health, /v1/models and /metrics answering while its counters freeze (the
DGX Spark hang, vllm-project/vllm#61007), so progress is read from the counters the API process
updates from engine outputs: the engine's step counter where it exports one, and its generated
tokens, summed over engines. Which samples those are is the serving driver's (`MetricNames`).
`Tracker` applies the stall rule one scrape at a time, `classify` to a whole window, and
`verdict_of` names what the probes saw; nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from prometheus_client.parser import text_string_to_metric_families

from verify.serving import MetricNames
from verify.serving.openai import Status as Probe  # health, models, metrics: a status, 0 refused, None timed out

__all__ = ["Probe", "Progress", "StallVerdict", "Tracker", "classify", "parse_metrics", "verdict_of"]


@dataclass(frozen=True, kw_only=True)
class Progress:
    """One /metrics scrape, reduced to what says whether the engine moves."""

    steps: float  # engine steps, summed over engines (0 where the engine exports no step counter)
    tokens: float  # tokens those steps carried
    generated: float  # generated tokens
    prompt: float = 0.0  # prompt tokens
    running: float  # requests running (the server's view; the client's in-flight count wins)
    waiting: float
    process_start: float | None  # process_start_time_seconds: changes when the API server restarted

    def moved_since(self, earlier: Progress) -> bool:
        return self.steps > earlier.steps or self.generated > earlier.generated


def parse_metrics(text: str, names: MetricNames) -> Progress:
    """Parse Prometheus text exposition with prometheus-client's parser; `names` says which samples."""
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + float(sample.value)

    def total(name: str | None) -> float:
        return sums.get(name, 0.0) if name else 0.0

    return Progress(
        steps=total(names.steps),
        tokens=total(names.step_tokens),
        generated=total(names.generated),
        prompt=total(names.prompt),
        running=total(names.running),
        waiting=total(names.waiting),
        process_start=sums.get("process_start_time_seconds"),
    )


class StallVerdict(StrEnum):
    PROGRESSING = "PROGRESSING"
    IDLE = "IDLE"  # nothing in flight: no progress expected
    UNKNOWN = "UNKNOWN"  # scrapes failed: never read as idle or stalled
    ENGINE_STALL_API_ALIVE = "ENGINE_STALL_API_ALIVE"
    ENGINE_DEAD = "ENGINE_DEAD"
    API_UNRESPONSIVE = "API_UNRESPONSIVE"
    RESTART_DETECTED = "RESTART_DETECTED"


@dataclass(kw_only=True)
class Tracker:
    """The stall rule's memory over a run, one scrape at a time (mutable; still no I/O).

    Progress is the last time a counter rose or any stream received a chunk. A failed scrape
    (None) changes nothing: it is unknown, never idle. A counter going backwards or a new
    `process_start_time_seconds` is a restart: the baseline resets to the new process.
    """

    stall_seconds: float
    started_at: float
    warmup_s: float = 0.0
    last: Progress | None = None
    last_progress_at: float = 0.0

    def __post_init__(self) -> None:
        self.last_progress_at = self.started_at

    def observe(self, at: float, progress: Progress | None) -> StallVerdict | None:
        """Feed one scrape; RESTART_DETECTED when the server restarted under us, else None."""
        if progress is None:
            return None
        before, self.last = self.last, progress
        if before is None:
            return None
        if (
            progress.steps < before.steps
            or progress.generated < before.generated
            or (before.process_start is not None and progress.process_start != before.process_start)
        ):
            self.last_progress_at = at
            return StallVerdict.RESTART_DETECTED
        if progress.moved_since(before):
            self.last_progress_at = max(self.last_progress_at, at)
        return None

    def chunk(self, at: float) -> None:
        self.last_progress_at = max(self.last_progress_at, at)

    def progress_age(self, now: float) -> float:
        return now - self.last_progress_at

    def stalled(self, now: float, in_flight: int) -> bool:
        """Work in flight, past warm-up, and no progress for longer than stall_seconds: time to probe."""
        if in_flight == 0 or now - self.started_at < self.warmup_s:
            return False
        return self.progress_age(now) > self.stall_seconds


def verdict_of(probe: Probe, *, health_runs_engine: bool = False) -> StallVerdict:
    """What the probes of a stalled run say: the API alive, the engine dead, or the API unresponsive.

    Where the engine's health path runs a generation (`ServingDriver.health_runs_engine`), a health
    probe that times out or answers 503 while models and metrics answer 200 is the engine stalled
    with the API alive: the API answered everything that does not need the engine."""
    answers = (probe.health, probe.models, probe.metrics)
    if health_runs_engine and probe.health in (None, 503) and probe.models == 200 and probe.metrics == 200:
        return StallVerdict.ENGINE_STALL_API_ALIVE
    if any(a is None for a in answers):
        return StallVerdict.API_UNRESPONSIVE
    if probe.health == 503 or any(a == 0 for a in answers):
        return StallVerdict.ENGINE_DEAD
    if all(a == 200 for a in answers):
        return StallVerdict.ENGINE_STALL_API_ALIVE
    return StallVerdict.UNKNOWN


def classify(
    scrapes: list[tuple[float, Progress | None]],
    *,
    now: float,
    in_flight: int,
    last_chunk_at: float | None,
    stall_seconds: float,
    probe: Probe | None = None,
) -> StallVerdict:
    """The verdict for a window of scrapes ending `now` (the Tracker applied to a whole window).

    With work in flight and no progress for `stall_seconds`, the probe decides: all answer 200 ->
    the engine stalled while the API lives; 503 or refused -> the engine is dead; a timeout -> the
    API is unresponsive. A counter going backwards or a new process start time is a restart,
    whatever else holds.
    """
    known = [(t, p) for t, p in scrapes if p is not None]
    tracker = Tracker(stall_seconds=stall_seconds, started_at=known[0][0] if known else now)
    restarted = False
    for t, progress in known:
        restarted |= tracker.observe(t, progress) is StallVerdict.RESTART_DETECTED
    if restarted:
        return StallVerdict.RESTART_DETECTED
    if in_flight == 0:
        return StallVerdict.IDLE
    if not known:
        return StallVerdict.UNKNOWN
    if last_chunk_at is not None:
        tracker.chunk(last_chunk_at)
    if not tracker.stalled(now, in_flight):
        return StallVerdict.PROGRESSING
    if probe is None:
        return StallVerdict.UNKNOWN  # a stall is only named once the probes have answered
    return verdict_of(probe)
