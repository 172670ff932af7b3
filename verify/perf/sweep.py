"""The throughput-latency curve of one server: a slice of load per load point, and where TTFT p99
crosses a declared limit.

`stackproof sweep CELL --sweep concurrency=1,2,4,8` loads one server (kept up for the whole run)
with a slice per point, in the order given, after a warm-up slice at the first point (discarded): a
server start or a first compile must not land inside a point. Each slice is `stackproof soak`'s
load (verify/loadrun.run_load in soak mode); the point records output tokens per second, requests
per second, and TTFT p50/p99, TPOT p50, E2EL p50 from that slice's summary
(verify/loadrun.summarise). The curve is what InferenceMAX-style serving matrices publish per GPU
host: throughput against latency as the load grows.

The judge, against the declared TTFT p99 limit:

- `crossed_at`: the first point (in the order of the axis) whose TTFT p99 is above the limit, or
  that answered nothing (no first token is worse than any limit); None when no point crosses;
- `best_within_limit`: of the points before `crossed_at`, the one with the most output tokens per
  second (the operating point: as much throughput as the limit allows); None when the first
  point already crosses;
- `verdict`: `WITHIN LIMIT` (no point crosses), `CROSSES` (a later point crosses), `OVER AT FIRST`
  (even the lightest load crosses: the limit cannot be met on this host).

Pure: points in, a frozen `SweepReport` out, written once as JSON (docs/sweep.schema.json) and read
back through `SweepReport.from_json`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pipeline.errors import InputError
from pipeline.matrix.schema import MAX_CONCURRENCY

__all__ = [
    "AXES",
    "KIND",
    "SCHEMA_VERSION",
    "SweepAxis",
    "SweepConfig",
    "SweepPoint",
    "SweepReport",
    "judge_sweep",
    "parse_sweep",
    "point_of_summary",
]

KIND = "stackproof.sweep"
SCHEMA_VERSION = 1
AXES = ("concurrency", "rate")  # closed loop (requests in flight) or open loop (questions per second)
MAX_POINTS = 64
MAX_VALUE = {"concurrency": MAX_CONCURRENCY, "rate": 10_000.0}  # requests in flight; questions per second
VERDICTS = ("WITHIN LIMIT", "CROSSES", "OVER AT FIRST")


@dataclass(frozen=True, kw_only=True)
class SweepAxis:
    name: str  # one of AXES
    values: tuple[float, ...]  # in the order the points run


def parse_sweep(text: str) -> SweepAxis:
    """`concurrency=1,2,4,8` or `rate=0.5,1,2`; ValueError naming what is wrong."""
    name, sep, rest = text.partition("=")
    name = name.strip()
    if not sep or name not in AXES:
        raise ValueError(f"{text!r}: give AXIS=V1,V2,... with AXIS one of {', '.join(AXES)}")
    values: list[float] = []
    for item in rest.split(","):
        try:
            value = float(item)
        except ValueError:
            raise ValueError(f"{text!r}: {item.strip()!r} is not a number") from None
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"{text!r}: {item.strip()!r} must be a positive number")
        if name == "concurrency" and value != int(value):
            raise ValueError(f"{text!r}: a concurrency is a whole number of requests in flight, not {item.strip()}")
        if value > MAX_VALUE[name]:  # issue 43: the axis skipped the cap --concurrency has
            raise ValueError(f"{text!r}: {item.strip()} is past the largest {name}, {MAX_VALUE[name]:,}")
        values.append(value)
    if len(values) != len(set(values)):
        raise ValueError(f"{text!r}: a load point is given twice")
    if not 2 <= len(values) <= MAX_POINTS:
        raise ValueError(f"{text!r}: give 2 to {MAX_POINTS} load points (a curve needs 2)")
    return SweepAxis(name=name, values=tuple(values))


@dataclass(frozen=True, kw_only=True)
class SweepPoint:
    """One load point's slice: what it asked and what it measured (None: nothing measured)."""

    value: float  # the axis's value at this point
    seconds: float
    questions: int
    faulted: int
    output_tok_s: float | None
    requests_s: float | None
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    e2el_p50_ms: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "seconds": self.seconds,
            "questions": self.questions,
            "faulted": self.faulted,
            "output_tok_s": self.output_tok_s,
            "requests_s": self.requests_s,
            "ttft_p50_ms": self.ttft_p50_ms,
            "ttft_p99_ms": self.ttft_p99_ms,
            "tpot_p50_ms": self.tpot_p50_ms,
            "e2el_p50_ms": self.e2el_p50_ms,
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> SweepPoint:
        return SweepPoint(
            value=float(data["value"]),
            seconds=float(data["seconds"]),
            questions=int(data["questions"]),
            faulted=int(data["faulted"]),
            **{key: _opt(data[key]) for key in _MEASURED},
        )


_MEASURED = ("output_tok_s", "requests_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "e2el_p50_ms")


def point_of_summary(value: float, summary: dict[str, Any]) -> SweepPoint:
    """A point from one slice's load summary (verify/loadrun.summarise's keys)."""
    latency = summary.get("latency_ms") or {}
    throughput = summary.get("throughput") or {}
    questions = summary.get("questions") or {}
    answered = (summary.get("requests") or {}).get("ok", 0)

    def pick(metric: str, p: str) -> float | None:
        return _opt((latency.get(metric) or {}).get(p))

    return SweepPoint(
        value=value,
        seconds=float(summary.get("seconds") or 0.0),
        questions=int(questions.get("attempted") or 0),
        faulted=int(questions.get("faulted") or 0),
        # Zero requests answered is no throughput measured, not a rate of 0 that looks like a point.
        output_tok_s=_opt(throughput.get("output_tok_s")) if answered else None,
        requests_s=_opt(throughput.get("requests_s")) if answered else None,
        ttft_p50_ms=pick("ttft", "p50"),
        ttft_p99_ms=pick("ttft", "p99"),
        tpot_p50_ms=pick("tpot", "p50"),
        e2el_p50_ms=pick("e2el", "p50"),
    )


@dataclass(frozen=True, kw_only=True)
class SweepConfig:
    axis: str
    values: tuple[float, ...]
    slice_s: float
    warmup_s: float
    ttft_p99_limit_ms: float
    seed: int
    max_tokens: int

    def to_json(self) -> dict[str, Any]:
        return {
            "axis": self.axis,
            "values": list(self.values),
            "slice_s": self.slice_s,
            "warmup_s": self.warmup_s,
            "ttft_p99_limit_ms": self.ttft_p99_limit_ms,
            "seed": self.seed,
            "max_tokens": self.max_tokens,
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> SweepConfig:
        return SweepConfig(
            axis=str(data["axis"]),
            values=tuple(float(v) for v in data["values"]),
            slice_s=float(data["slice_s"]),
            warmup_s=float(data["warmup_s"]),
            ttft_p99_limit_ms=float(data["ttft_p99_limit_ms"]),
            seed=int(data["seed"]),
            max_tokens=int(data["max_tokens"]),
        )


@dataclass(frozen=True, kw_only=True)
class SweepReport:
    target: str  # cell or cell:arm
    config: SweepConfig
    points: tuple[SweepPoint, ...]  # in the order they ran (the axis's)
    crossed_at: float | None  # the first value whose TTFT p99 is over the limit
    best_within_limit: float | None  # the value with the most tok/s before crossed_at
    verdict: str  # one of VERDICTS
    seconds: float
    files: dict[str, str]

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": KIND,
            "schema_version": SCHEMA_VERSION,
            "target": self.target,
            "verdict": self.verdict,
            "crossed_at": self.crossed_at,
            "best_within_limit": self.best_within_limit,
            "config": self.config.to_json(),
            "points": [p.to_json() for p in self.points],
            "seconds": self.seconds,
            "files": dict(self.files),
        }

    @staticmethod
    def from_json(data: dict[str, Any], *, source: str = "sweep.json") -> SweepReport:
        if data.get("kind") != KIND or data.get("schema_version") != SCHEMA_VERSION:
            raise InputError(f"{source}: not a sweep report of schema_version {SCHEMA_VERSION} (kind {KIND!r})")
        try:
            return SweepReport(
                target=str(data["target"]),
                config=SweepConfig.from_json(data["config"]),
                points=tuple(SweepPoint.from_json(p) for p in data["points"]),
                crossed_at=_opt(data["crossed_at"]),
                best_within_limit=_opt(data["best_within_limit"]),
                verdict=str(data["verdict"]),
                seconds=float(data["seconds"]),
                files={str(k): str(v) for k, v in data["files"].items()},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a list where an object belongs
            raise InputError(f"{source}: a malformed sweep report ({type(exc).__name__}: {exc})") from None


def judge_sweep(
    points: list[SweepPoint], *, target: str, config: SweepConfig, seconds: float, files: dict[str, str]
) -> SweepReport:
    """Where the curve crosses the TTFT p99 limit, and the best point before it."""
    limit = config.ttft_p99_limit_ms
    crossed = next((i for i, p in enumerate(points) if p.ttft_p99_ms is None or p.ttft_p99_ms > limit), None)
    within = points if crossed is None else points[:crossed]
    measured = [p for p in within if p.output_tok_s is not None]
    best = max(measured, key=lambda p: p.output_tok_s or 0.0) if measured else None
    verdict = "WITHIN LIMIT" if crossed is None else "OVER AT FIRST" if crossed == 0 else "CROSSES"
    return SweepReport(
        target=target,
        config=config,
        points=tuple(points),
        crossed_at=None if crossed is None else points[crossed].value,
        best_within_limit=None if best is None else best.value,
        verdict=verdict,
        seconds=seconds,
        files=files,
    )


def _opt(value: Any) -> float | None:
    return None if value is None else float(value)
