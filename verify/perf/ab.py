"""What did the bump cost: the A/B judge over interleaved slices of load on one host.

`stackproof ab A B` runs the same questions, seed and concurrency against one server per side, in
slices ordered A B, B A, A B, ... (the first pair a warm-up, discarded). Each measured pair is one
A slice and the B slice adjacent to it, so slow drift of the host (heat, other tenants) falls on
both sides of a pair alike. Per metric the change of B against A is the geometric mean over
pairs of B/A, minus one; its confidence interval is a bootstrap that resamples whole pairs (the
unit the interleaving made comparable), widened by sqrt(n/(n-1)) t/z because a plain percentile
bootstrap is far too narrow for a handful of pairs (Hesterberg's expanded percentile interval).
A latency change smaller than the client's timing resolution (0.1 ms, the event loop's) counts as
none: the threshold of a latency metric is the larger of the declared one and 0.1 ms over A's median.

The verdict per metric, against a declared threshold t (default 5%), in the metric's bad direction
(latency up, tokens per second down):

- REGRESSION: the whole interval is worse than +t;
- IMPROVEMENT: the whole interval is better than -t;
- NO CHANGE: the whole interval is inside (-t, +t);
- UNDECIDED: the interval straddles a threshold; `more_pairs` estimates how many more pairs would
  decide it, from the interval's half-width shrinking as 1/sqrt(n) around the same estimate.

This module is pure: slices in (`SliceMetrics`), typed frozen dataclasses out (`AbReport`), written
once as JSON (docs/ab.schema.json) and read back through the same type (`AbReport.from_json`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from pipeline.errors import InputError

__all__ = [
    "CLIENT_BOUND",
    "CLIENT_CPU",
    "KIND",
    "METRICS",
    "SCHEMA_VERSION",
    "AbConfig",
    "AbReport",
    "Correctness",
    "Metric",
    "MetricVerdict",
    "SliceMetrics",
    "client_bound",
    "decided",
    "judge",
    "look_sizes",
    "metrics_of_summary",
    "pairs_needed",
    "refused",
    "slice_order",
]

KIND = "stackproof.ab"
SCHEMA_VERSION = 1
VERDICTS = ("REGRESSION", "IMPROVEMENT", "NO CHANGE", "UNDECIDED", "REFUSED")
DEFAULT_THRESHOLD = 0.05
DEFAULT_CONFIDENCE = 0.95
DEFAULT_RESAMPLES = 4000


@dataclass(frozen=True, kw_only=True)
class Metric:
    """One measured quantity of a slice: where `summarise` put it, and which way is worse."""

    name: str
    unit: str
    higher_is_worse: bool
    path: tuple[str, ...]  # keys into a load summary (verify/loadrun.summarise)


METRICS: tuple[Metric, ...] = (
    *(
        Metric(name=f"{m}_{p}", unit="ms", higher_is_worse=True, path=("latency_ms", m, p))
        for m in ("ttft", "tpot", "itl")
        for p in ("p50", "p90")
    ),
    Metric(name="e2el_p50", unit="ms", higher_is_worse=True, path=("latency_ms", "e2el", "p50")),
    Metric(name="output_tok_s", unit="tok/s", higher_is_worse=False, path=("throughput", "output_tok_s")),
)


@dataclass(frozen=True, kw_only=True)
class SliceMetrics:
    """One slice of load on one side: its place in the interleaving and what it measured."""

    side: str  # "A" or "B"
    pair: int  # -1: the warm-up pair (discarded); 0..n-1 the measured pairs
    position: int  # the slice's place in the whole run (0 first)
    seconds: float
    questions: int
    faulted: int
    values: dict[str, float | None]  # metric name -> value (None: the slice measured nothing for it)

    def to_json(self) -> dict[str, Any]:
        return {
            "side": self.side,
            "pair": self.pair,
            "position": self.position,
            "seconds": self.seconds,
            "questions": self.questions,
            "faulted": self.faulted,
            "values": dict(self.values),
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> SliceMetrics:
        return SliceMetrics(
            side=str(data["side"]),
            pair=int(data["pair"]),
            position=int(data["position"]),
            seconds=float(data["seconds"]),
            questions=int(data["questions"]),
            faulted=int(data["faulted"]),
            values={str(k): None if v is None else float(v) for k, v in data["values"].items()},
        )


@dataclass(frozen=True, kw_only=True)
class MetricVerdict:
    name: str
    unit: str
    higher_is_worse: bool
    a_median: float | None  # over the measured slices of each side
    b_median: float | None
    change: float | None  # B vs A, relative: +0.10 = B is 10% higher
    ci_low: float | None
    ci_high: float | None
    pairs: int  # measured pairs with a value on both sides
    threshold: float  # the one applied: the declared one, or the timing resolution's share when larger
    verdict: str  # one of VERDICTS
    more_pairs: int | None  # UNDECIDED: estimated further pairs to decide; None when not estimable
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "unit": self.unit,
            "higher_is_worse": self.higher_is_worse,
            "a_median": self.a_median,
            "b_median": self.b_median,
            "change": self.change,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "pairs": self.pairs,
            "threshold": self.threshold,
            "verdict": self.verdict,
            "more_pairs": self.more_pairs,
            "reason": self.reason,
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> MetricVerdict:
        return MetricVerdict(
            name=str(data["name"]),
            unit=str(data["unit"]),
            higher_is_worse=bool(data["higher_is_worse"]),
            a_median=_opt(data["a_median"]),
            b_median=_opt(data["b_median"]),
            change=_opt(data["change"]),
            ci_low=_opt(data["ci_low"]),
            ci_high=_opt(data["ci_high"]),
            pairs=int(data["pairs"]),
            threshold=float(data["threshold"]),
            verdict=str(data["verdict"]),
            more_pairs=None if data["more_pairs"] is None else int(data["more_pairs"]),
            reason=str(data["reason"]),
        )


@dataclass(frozen=True, kw_only=True)
class Correctness:
    """Greedy agreement of the two sides (verify/load/compare.py's comparison, as its JSON)."""

    agreement: float | None
    corruption: bool
    comparison: dict[str, Any]  # `Comparison.to_json()`, or {"error": why there is none}

    def to_json(self) -> dict[str, Any]:
        return {"agreement": self.agreement, "corruption": self.corruption, "comparison": self.comparison}

    @staticmethod
    def from_json(data: dict[str, Any]) -> Correctness:
        return Correctness(
            agreement=_opt(data["agreement"]), corruption=bool(data["corruption"]), comparison=dict(data["comparison"])
        )


@dataclass(frozen=True, kw_only=True)
class AbConfig:
    threshold: float
    confidence: float
    resamples: int
    slice_s: float
    pairs: int
    concurrency: int
    seed: int
    max_tokens: int
    resolution_ms: float = 0.1  # the load client's timing resolution (event loop): smaller latency changes are none
    # How many metrics the caller decides on: the run's verdict is the worst of all eight (the
    # default); `bisect` decides on one (its --metric), whose interval then needs no correction.
    family: int = 8
    # Sequential looks: the run is judged after `pairs`, and while a metric is UNDECIDED again at
    # twice as many, up to `max_pairs`; each look's intervals are at the confidence that keeps the
    # whole run's false-alarm rate (Bonferroni over family x looks). `looks` is how many were planned.
    looks: int = 1
    max_pairs: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "threshold": self.threshold,
            "confidence": self.confidence,
            "resamples": self.resamples,
            "slice_s": self.slice_s,
            "pairs": self.pairs,
            "concurrency": self.concurrency,
            "seed": self.seed,
            "max_tokens": self.max_tokens,
            "resolution_ms": self.resolution_ms,
            "family": self.family,
            "looks": self.looks,
            "max_pairs": self.max_pairs,
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> AbConfig:
        return AbConfig(
            threshold=float(data["threshold"]),
            confidence=float(data["confidence"]),
            resamples=int(data["resamples"]),
            slice_s=float(data["slice_s"]),
            pairs=int(data["pairs"]),
            concurrency=int(data["concurrency"]),
            seed=int(data["seed"]),
            max_tokens=int(data["max_tokens"]),
            resolution_ms=float(data["resolution_ms"]),
            family=int(data.get("family", len(METRICS))),  # documents written before it: all eight
            looks=int(data.get("looks", 1)),  # documents written before sequential looks: one
            max_pairs=None if data.get("max_pairs") is None else int(data["max_pairs"]),
        )


@dataclass(frozen=True, kw_only=True)
class AbReport:
    a: str  # cell or cell:arm
    b: str
    config: AbConfig
    slices: tuple[SliceMetrics, ...]
    metrics: tuple[MetricVerdict, ...]
    correctness: Correctness | None
    verdict: str  # the worst of the metrics': REGRESSION > UNDECIDED > IMPROVEMENT > NO CHANGE
    seconds: float  # wall time of the whole run, servers' starts included
    files: dict[str, str]
    # Each side's engine facts (verify/perf/engines.py): KV cache, start order; {} where not read.
    engines: dict[str, dict[str, Any]] = field(default_factory=dict)
    refusal: str | None = None  # REFUSED: why the sides were not compared

    @property
    def failed(self) -> bool:
        """Exit 1: a regression beyond the threshold, or greedy answers that diverge where confident."""
        return self.verdict == "REGRESSION" or bool(self.correctness and self.correctness.corruption)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": KIND,
            "schema_version": SCHEMA_VERSION,
            "a": self.a,
            "b": self.b,
            "verdict": self.verdict,
            "config": self.config.to_json(),
            "metrics": [m.to_json() for m in self.metrics],
            "correctness": None if self.correctness is None else self.correctness.to_json(),
            "faults": {s: sum(x.faulted for x in self.slices if x.side == s and x.pair >= 0) for s in ("A", "B")},
            "slices": [s.to_json() for s in self.slices],
            "seconds": self.seconds,
            "files": dict(self.files),
            "engines": {k: dict(v) for k, v in self.engines.items()},
            "refusal": self.refusal,
        }

    @staticmethod
    def from_json(data: dict[str, Any], *, source: str = "ab.json") -> AbReport:
        if data.get("kind") != KIND or data.get("schema_version") != SCHEMA_VERSION:
            raise InputError(f"{source}: not an A/B report of schema_version {SCHEMA_VERSION} (kind {KIND!r})")
        try:
            return AbReport(
                a=str(data["a"]),
                b=str(data["b"]),
                config=AbConfig.from_json(data["config"]),
                slices=tuple(SliceMetrics.from_json(s) for s in data["slices"]),
                metrics=tuple(MetricVerdict.from_json(m) for m in data["metrics"]),
                correctness=None if data["correctness"] is None else Correctness.from_json(data["correctness"]),
                verdict=str(data["verdict"]),
                seconds=float(data["seconds"]),
                files={str(k): str(v) for k, v in data["files"].items()},
                engines={str(k): dict(v) for k, v in (data.get("engines") or {}).items()},
                refusal=None if data.get("refusal") is None else str(data["refusal"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a list where an object belongs
            raise InputError(f"{source}: a malformed A/B report ({type(exc).__name__}: {exc})") from None


# -- the schedule ----------------------------------------------------------------------------------


def slice_order(pairs: int) -> list[tuple[int, str]]:
    """(pair, side) for every slice: the warm-up pair (-1) A B, then A B, B A, A B, ...: each side
    goes first in half the pairs and consecutive pairs share an edge (A B B A A B), so a linear
    drift adds the same to both sides over every two pairs."""
    order: list[tuple[int, str]] = [(-1, "A"), (-1, "B")]
    for pair in range(pairs):
        sides = ("A", "B") if pair % 2 == 0 else ("B", "A")
        order += [(pair, side) for side in sides]
    return order


def look_sizes(pairs: int, max_pairs: int) -> list[int]:
    """The pair counts at which a sequential run is judged: `pairs`, then doubling, the last `max_pairs`
    (12 .. 96: 12, 24, 48, 96). One look when max_pairs <= pairs."""
    sizes = [pairs]
    while sizes[-1] < max_pairs:
        sizes.append(min(max_pairs, 2 * sizes[-1]))
    return sizes


def decided(report: AbReport) -> bool:
    """A sequential run stops here: every metric has a verdict other than UNDECIDED, or one is a
    REGRESSION (the run's verdict then, whatever more pairs say of the others: each look's interval
    is already at the confidence of all the looks planned)."""
    return report.verdict == "REGRESSION" or all(m.verdict != "UNDECIDED" for m in report.metrics)


def refused(*, a: str, b: str, config: AbConfig, reason: str, engines: dict[str, dict[str, Any]],
            seconds: float, files: dict[str, str]) -> AbReport:  # fmt: skip
    """The report of an A/B whose sides are not comparable (their engines differ): no slice measured."""
    return AbReport(
        a=a, b=b, config=config, slices=(), metrics=(), correctness=None, verdict="REFUSED",
        seconds=round(seconds, 1), files=files, engines=engines, refusal=reason,
    )  # fmt: skip


CLIENT_CPU = "client_cpu_share"  # a slice's value beside the metrics: the client's CPU over its seconds
CLIENT_BOUND = 0.85  # of one core: past it the event loop is the bottleneck, and the figures measure it


def client_bound(slices: tuple[SliceMetrics, ...] | list[SliceMetrics]) -> tuple[int, int]:
    """(slices whose client used more than CLIENT_BOUND of a core, slices that say): the load client
    is one event loop on one core; on the H100 it saturated from concurrency 64 and the engine got
    36 of 64 tokens a step (shared/reference/gpu-docker.md section 4). Not a verdict: a warning."""
    said = [s.values[CLIENT_CPU] for s in slices if s.values.get(CLIENT_CPU) is not None]
    return sum(1 for v in said if v is not None and v > CLIENT_BOUND), len(said)


def metrics_of_summary(summary: dict[str, Any]) -> dict[str, float | None]:
    """Each metric's value from one load summary (None where the slice measured nothing)."""
    values: dict[str, float | None] = {}
    for metric in METRICS:
        node: Any = summary
        for key in metric.path:
            node = node.get(key) if isinstance(node, dict) else None
        values[metric.name] = float(node) if isinstance(node, int | float) and math.isfinite(node) else None
    return values


# -- the judge -------------------------------------------------------------------------------------


def judge(
    slices: list[SliceMetrics] | tuple[SliceMetrics, ...],
    *,
    a: str,
    b: str,
    config: AbConfig,
    correctness: Correctness | None = None,
    seconds: float = 0.0,
    files: dict[str, str] | None = None,
    engines: dict[str, dict[str, Any]] | None = None,
) -> AbReport:
    """The report from the slices: one verdict per metric, and the run's (the worst of them)."""
    measured = [s for s in slices if s.pair >= 0]
    rng = np.random.default_rng(config.seed)
    each = replace(config, confidence=per_metric_confidence(config.confidence, config.family * config.looks))
    verdicts = tuple(_judge_metric(metric, measured, each, rng) for metric in METRICS)
    return AbReport(
        a=a,
        b=b,
        config=config,
        slices=tuple(slices),
        metrics=verdicts,
        correctness=correctness,
        verdict=_overall(verdicts),
        seconds=round(seconds, 1),
        files=files or {},
        engines=engines or {},
    )


def per_metric_confidence(run_confidence: float, family: int = 8) -> float:
    """The run's verdict is the worst of `family` metrics (all eight), so each is judged at the
    Bonferroni confidence that keeps the run's false-alarm rate at 1 - run_confidence: 95% over 8
    metrics is 99.375% each; a caller deciding on one metric (bisect) passes 1. Judged at 95%
    each, 20 real A/A runs of cpu-tiny-host raised 3 false alarms (benchmarks/ab.py --measure-aa);
    simulated A/A runs of 3 noisy pairs, 28% against 7%."""
    return 1.0 - (1.0 - run_confidence) / max(1, family)


def _judge_metric(
    metric: Metric, slices: list[SliceMetrics], config: AbConfig, rng: np.random.Generator
) -> MetricVerdict:
    by_pair: dict[int, dict[str, float]] = {}
    for s in slices:
        value = s.values.get(metric.name)
        if value is not None and value > 0:
            by_pair.setdefault(s.pair, {})[s.side] = value
    complete = sorted(p for p, sides in by_pair.items() if {"A", "B"} <= set(sides))
    a_values = [s.values[metric.name] for s in slices if s.side == "A" and s.values.get(metric.name) is not None]
    b_values = [s.values[metric.name] for s in slices if s.side == "B" and s.values.get(metric.name) is not None]
    undecided = MetricVerdict(
        name=metric.name,
        unit=metric.unit,
        higher_is_worse=metric.higher_is_worse,
        a_median=_median(a_values),
        b_median=_median(b_values),
        change=None,
        ci_low=None,
        ci_high=None,
        pairs=len(complete),
        threshold=config.threshold,
        verdict="UNDECIDED",
        more_pairs=None,
        reason=f"{len(complete)} pair(s) with a value on both sides: at least 2 are needed for an interval",
    )
    if len(complete) < 2:
        return undecided
    logs = np.log(np.array([by_pair[p]["B"] / by_pair[p]["A"] for p in complete]))
    n = len(logs)
    estimate = float(logs.mean())
    draws = rng.integers(0, n, size=(config.resamples, n))
    means = logs[draws].mean(axis=1)
    alpha = 1.0 - config.confidence
    lo_log, hi_log = (float(x) for x in np.quantile(means, [alpha / 2, 1 - alpha / 2]))
    widen = _expansion(n, config.confidence)
    lo_log, hi_log = estimate + (lo_log - estimate) * widen, estimate + (hi_log - estimate) * widen
    change, low, high = math.expm1(estimate), math.expm1(lo_log), math.expm1(hi_log)
    threshold = config.threshold
    if metric.unit == "ms" and undecided.a_median:
        # A change smaller than the client's timing resolution is no change, whatever its ratio
        # (an ITL p50 of 0.04 ms: tokens that arrived in one read).
        threshold = max(threshold, config.resolution_ms / undecided.a_median)
    verdict, more, reason = _decide(metric, change, low, high, n, threshold)
    return replace(
        undecided,
        threshold=round(threshold, 5),
        change=round(change, 5),
        ci_low=round(low, 5),
        ci_high=round(high, 5),
        verdict=verdict,
        more_pairs=more,
        reason=reason,
    )


def _expansion(n: int, confidence: float) -> float:
    """How much wider the percentile bootstrap's interval is made for n pairs: sqrt(n/(n-1)) times
    Student's t over the normal quantile (Hesterberg's expanded percentile interval). A plain
    bootstrap of 3 pairs has 10 distinct resamples and an interval about the data's range: too
    narrow by 2.7x at 95%; at 10 pairs the factor is 1.22, at 30 pairs 1.06."""
    from scipy import stats

    q = 1 - (1 - confidence) / 2
    return math.sqrt(n / (n - 1)) * float(stats.t.ppf(q, n - 1)) / float(stats.norm.ppf(q))


def _decide(metric: Metric, change: float, low: float, high: float, n: int, t: float) -> tuple[str, int | None, str]:
    """The verdict in the metric's bad direction (worse = positive), and for UNDECIDED the estimate."""
    sign = 1.0 if metric.higher_is_worse else -1.0
    worse_lo, worse_hi = sorted((sign * low, sign * high))
    worse = sign * change
    span = f"B vs A {change:+.1%} [{low:+.1%}, {high:+.1%}] over {n} pairs, threshold {t:.0%}"
    if worse_lo > t:
        return "REGRESSION", None, f"{span}: the whole interval is worse than the threshold"
    if worse_hi < -t:
        return "IMPROVEMENT", None, f"{span}: the whole interval is better than the threshold"
    if -t < worse_lo and worse_hi < t:
        return "NO CHANGE", None, f"{span}: the whole interval is inside the threshold"
    more = pairs_needed(estimate=worse, half_width=(worse_hi - worse_lo) / 2, pairs=n, threshold=t)
    what = "not estimable: the estimate sits on the threshold" if more is None else f"about {more} more pair(s)"
    return "UNDECIDED", more, f"{span}: the interval straddles the threshold; {what}"


def pairs_needed(*, estimate: float, half_width: float, pairs: int, threshold: float) -> int | None:
    """Further pairs until an interval of this estimate, its half-width shrinking as 1/sqrt(n), stays
    on one side of the nearest threshold: n' = n (h / distance)^2. None: the estimate is on it."""
    distance = min(abs(estimate - threshold), abs(estimate + threshold))
    if distance <= 1e-12:
        return None
    total = math.ceil(pairs * (half_width / distance) ** 2)
    return max(1, total - pairs)


def _overall(verdicts: tuple[MetricVerdict, ...]) -> str:
    names = {v.verdict for v in verdicts}
    for verdict in ("REGRESSION", "UNDECIDED", "IMPROVEMENT"):
        if verdict in names:
            return verdict
    return "NO CHANGE"


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(float(np.median(present)), 4) if present else None


def _opt(value: Any) -> float | None:
    return None if value is None else float(value)
