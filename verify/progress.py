"""Engine progress versus API liveness, from vLLM's /metrics: the pure half of the load stage.

A wedged engine leaves /health, /v1/models and /metrics answering while its counters freeze (the
DGX Spark hang, vllm-project/vllm#61007), so progress is read from the counters the API process
updates from engine outputs: `vllm:iteration_tokens_total` (a histogram: `_count` ~ engine steps,
`_sum` = cumulative tokens) and `vllm:generation_tokens_total`, summed over engines.
`classify` turns a window of scrapes and probe answers into a verdict; nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from itertools import pairwise

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Probe", "Progress", "StallVerdict", "classify", "parse_metrics"]


@dataclass(frozen=True, kw_only=True)
class Progress:
    """One /metrics scrape, reduced to what says whether the engine moves."""

    steps: float  # vllm:iteration_tokens_total_count, summed over engines
    tokens: float  # vllm:iteration_tokens_total_sum
    generated: float  # vllm:generation_tokens_total
    running: float  # vllm:num_requests_running (the server's view; the client's in-flight count wins)
    waiting: float
    process_start: float | None  # process_start_time_seconds: changes when the API server restarted

    def moved_since(self, earlier: Progress) -> bool:
        return self.steps > earlier.steps or self.generated > earlier.generated


def parse_metrics(text: str) -> Progress:
    """Parse Prometheus text exposition with prometheus-client's parser."""
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + float(sample.value)
    return Progress(
        steps=sums.get("vllm:iteration_tokens_total_count", 0.0),
        tokens=sums.get("vllm:iteration_tokens_total_sum", 0.0),
        generated=sums.get("vllm:generation_tokens_total", 0.0),
        running=sums.get("vllm:num_requests_running", 0.0),
        waiting=sums.get("vllm:num_requests_waiting", 0.0),
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


@dataclass(frozen=True, kw_only=True)
class Probe:
    """Answers of /health, /v1/models and /metrics: an HTTP status, 0 = refused, None = timed out."""

    health: int | None
    models: int | None
    metrics: int | None


def classify(
    scrapes: list[tuple[float, Progress | None]],
    *,
    now: float,
    in_flight: int,
    last_chunk_at: float | None,
    stall_seconds: float,
    probe: Probe | None = None,
) -> StallVerdict:
    """The verdict for the window ending `now`.

    Progress is the last time a counter rose or any stream received a chunk. With work in flight
    and no progress for `stall_seconds`, the probe decides: all answer 200 -> the engine stalled
    while the API lives; 503 or refused -> the engine is dead; a timeout -> the API is unresponsive.
    A counter going backwards or a new process start time is a restart, whatever else holds.
    """
    known = [(t, p) for t, p in scrapes if p is not None]
    for (_, before), (_, after) in pairwise(known):
        if (
            after.steps < before.steps
            or after.generated < before.generated
            or (before.process_start is not None and after.process_start != before.process_start)
        ):
            return StallVerdict.RESTART_DETECTED
    if in_flight == 0:
        return StallVerdict.IDLE
    if not known:
        return StallVerdict.UNKNOWN
    last_progress = known[0][0]
    for (_, before), (t, after) in pairwise(known):
        if after.moved_since(before):
            last_progress = t
    if last_chunk_at is not None:
        last_progress = max(last_progress, last_chunk_at)
    if now - last_progress <= stall_seconds:
        return StallVerdict.PROGRESSING
    if scrapes and scrapes[-1][1] is None and probe is None:
        return StallVerdict.UNKNOWN  # the newest scrape failed: a failed scrape is never read as a stall
    if probe is None:
        return StallVerdict.UNKNOWN
    answers = (probe.health, probe.models, probe.metrics)
    if any(a is None for a in answers):
        return StallVerdict.API_UNRESPONSIVE
    if probe.health == 503 or any(a == 0 for a in answers):
        return StallVerdict.ENGINE_DEAD
    if all(a == 200 for a in answers):
        return StallVerdict.ENGINE_STALL_API_ALIVE
    return StallVerdict.UNKNOWN
