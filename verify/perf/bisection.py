"""Which version of a package made it worse: the search and the judge of `stackproof bisect`.

The versions of the package between the good end V1 and the bad end V2, ascending, are the line
searched. Every step is one `stackproof ab` of the cell with the package at V1 (A, the baseline)
against the cell with the package at the probed version (B), judged on one metric:

- `tok_s`, `tpot_p50`, `ttft_p50`: the A/B's interval of that metric (verify/perf/ab.py), one-sided as
  a bisect asks "is this one bad?": BAD when the whole interval is worse than +t (the A/B's
  REGRESSION), GOOD when the whole interval is better than +t (NO CHANGE, IMPROVEMENT, or an
  interval that straddles -t only: no worse than the threshold), else UNDECIDED, which ends the
  search naming the interval left and the pairs the A/B said it needs. A side that does not start
  is not a performance answer: it ends the search too (bisect it with `--metric start`).
- `greedy`: bad when B's greedy answers differ from V1's (agreement below 100%, or corruption).
- `start`: bad when B's server never became ready.

The first step probes V2 itself (the bad end must be bad against V1, or there is nothing to
bisect: NO REGRESSION); after that the probe is the middle of the interval (newest known good,
oldest known bad), until the two are adjacent and the oldest bad is the first bad version. Over n
versions from V1 to V2 that is 1 + ceil(log2(n - 1)) A/B runs at most (8 versions 1.0..8.0: 1 + 3).

Pure: evidence in (`Evidence`), the next probe and the report out; the edge (stackproof/bisection.py)
builds the environments and runs the A/Bs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from pipeline.errors import InputError
from verify.perf.ab import AbReport

__all__ = [
    "BEHAVIOURS",
    "KIND",
    "METRICS",
    "SCHEMA_VERSION",
    "BisectReport",
    "Evidence",
    "Search",
    "Step",
    "conclude",
    "evidence_of_ab",
    "evidence_of_no_start",
    "judge_evidence",
    "max_runs",
]

KIND = "stackproof.bisect"
SCHEMA_VERSION = 1
# --metric name -> the A/B metric it reads (verify/ab.METRICS)
METRICS = {"tok_s": "output_tok_s", "tpot_p50": "tpot_p50", "ttft_p50": "ttft_p50"}
BEHAVIOURS = ("greedy", "start")
JUDGEMENTS = ("BAD", "GOOD", "UNDECIDED")
RESULTS = ("FOUND", "NO REGRESSION", "UNDECIDED", "NOT RUN")


@dataclass(frozen=True, kw_only=True)
class Evidence:
    """What one A/B of V1 against a version showed, as far as the search needs it."""

    started: bool  # B's server became ready (A's did: otherwise the run is infrastructure trouble)
    verdict: str | None  # the metric's A/B verdict (None: `start`/`greedy`, or B never started)
    change: float | None
    ci_low: float | None
    ci_high: float | None
    more_pairs: int | None
    threshold: float | None  # the metric's threshold as the A/B applied it
    higher_is_worse: bool | None
    agreement: float | None  # greedy agreement of B with A
    corruption: bool
    report: str | None  # the A/B's ab.json
    seconds: float
    reason: str  # the A/B's own words: its failure, or the metric's reason

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @staticmethod
    def from_json(data: dict[str, Any]) -> Evidence:
        return Evidence(**{k: data[k] for k in Evidence.__dataclass_fields__})


def evidence_of_ab(report: AbReport, metric: str) -> Evidence:
    """The evidence of an A/B whose servers both started."""
    c = report.correctness
    base = replace(
        evidence_of_no_start(report.verdict, report.seconds),
        started=True,
        agreement=c.agreement if c else None,
        corruption=bool(c and c.corruption),
        report=report.files.get("report"),
    )
    if metric in BEHAVIOURS:
        return base
    m = next(m for m in report.metrics if m.name == METRICS[metric])
    return replace(
        base,
        verdict=m.verdict,
        change=m.change,
        ci_low=m.ci_low,
        ci_high=m.ci_high,
        more_pairs=m.more_pairs,
        threshold=m.threshold,
        higher_is_worse=m.higher_is_worse,
        reason=m.reason,
    )


def evidence_of_no_start(reason: str, seconds: float) -> Evidence:
    return Evidence(
        started=False,
        verdict=None,
        change=None,
        ci_low=None,
        ci_high=None,
        more_pairs=None,
        threshold=None,
        higher_is_worse=None,
        agreement=None,
        corruption=False,
        report=None,
        seconds=round(seconds, 1),
        reason=reason,
    )


def judge_evidence(metric: str, e: Evidence) -> tuple[str, str]:
    """BAD, GOOD or UNDECIDED for the probed version, and why, in words."""
    if metric == "start":
        return ("GOOD", "its server became ready") if e.started else ("BAD", f"it does not start: {e.reason}")
    if not e.started:
        if metric == "greedy":
            return "BAD", f"it does not start, so it cannot answer the same: {e.reason}"
        return "UNDECIDED", f"it does not start, so it has no {metric} (bisect with --metric start): {e.reason}"
    if metric == "greedy":
        if e.agreement is None:
            return "UNDECIDED", f"no greedy comparison: {e.reason}"
        if e.corruption or e.agreement < 1.0:
            flag = ", corruption" if e.corruption else ""
            return "BAD", f"greedy agreement with the good end {e.agreement:.1%}{flag}"
        return "GOOD", "greedy answers identical to the good end's"
    return _judge_change(metric, e)


def _judge_change(metric: str, e: Evidence) -> tuple[str, str]:
    """One-sided, as a bisect asks: BAD when the whole interval is worse than +t (the A/B's
    REGRESSION), GOOD when the whole interval is better than +t (no worse than the threshold:
    NO CHANGE, IMPROVEMENT, or an interval that straddles -t only), else UNDECIDED."""
    if e.change is None or e.ci_low is None or e.ci_high is None or e.threshold is None:
        return "UNDECIDED", f"{metric}: no change measured: {e.reason}"
    change = f" {e.change:+.1%} [{e.ci_low:+.1%}, {e.ci_high:+.1%}], threshold {e.threshold:.0%}"
    sign = 1.0 if e.higher_is_worse else -1.0  # the change in the metric's bad direction
    best, worst = sorted((sign * e.ci_low, sign * e.ci_high))
    if best > e.threshold:
        return "BAD", f"{metric} worse beyond the threshold{change} (A/B {e.verdict})"
    if worst < e.threshold:
        return "GOOD", f"{metric} no worse than the threshold{change} (A/B {e.verdict})"
    more = f", ~{e.more_pairs} more pairs would decide" if e.more_pairs else ""
    return "UNDECIDED", f"{metric} straddles the threshold{change}{more}"


@dataclass(frozen=True, kw_only=True)
class Search:
    """The interval: the newest version known good and the oldest known bad (indices into versions)."""

    versions: tuple[str, ...]  # V1 first, V2 last, ascending
    good: int = 0
    bad: int | None = None  # None until the bad end is confirmed
    stopped: str | None = None  # why the search ended early (an undecided step, a good bad end)

    def next_probe(self) -> int | None:
        """The index to probe next; None when the search is over."""
        if self.stopped is not None:
            return None
        if self.bad is None:
            return len(self.versions) - 1  # the bad end first: is there anything to bisect?
        if self.bad - self.good <= 1:
            return None
        return (self.good + self.bad) // 2

    def after(self, index: int, judgement: str, why: str) -> Search:
        if judgement == "BAD":
            return replace(self, bad=index)
        if judgement == "GOOD":
            if self.bad is None:
                return replace(self, good=index, stopped=f"the bad end {self.versions[index]} is good: {why}")
            return replace(self, good=index)
        return replace(self, stopped=f"{self.versions[index]} is undecided: {why}")

    @property
    def result(self) -> str:
        if self.bad is not None and self.bad - self.good <= 1:
            return "FOUND"
        if self.bad is None and self.stopped is not None and self.good == len(self.versions) - 1:
            return "NO REGRESSION"
        return "UNDECIDED"

    @property
    def interval(self) -> tuple[str, str | None]:
        return self.versions[self.good], None if self.bad is None else self.versions[self.bad]


def max_runs(count: int) -> int:
    """A/B runs a search over `count` versions (V1 and V2 included) needs at most: the bad end, then halving."""
    runs, width = 1, count - 1  # candidates for the first bad after the end check: indices 1..count-1
    while width > 1:
        width = (width + 1) // 2
        runs += 1
    return runs


@dataclass(frozen=True, kw_only=True)
class Step:
    number: int
    version: str
    pins: tuple[str, ...]  # name==version of every package the step moved (the FlashInfer trio together)
    environment: dict[str, Any]  # {"ref", "digest", "source": built|local, "built_in_s"}
    evidence: Evidence
    judgement: str
    why: str
    interval: tuple[str, str | None]  # (newest good, oldest bad) after this step

    def to_json(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "version": self.version,
            "pins": list(self.pins),
            "environment": dict(self.environment),
            "evidence": self.evidence.to_json(),
            "judgement": self.judgement,
            "why": self.why,
            "interval": {"good": self.interval[0], "bad": self.interval[1]},
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> Step:
        return Step(
            number=int(data["number"]),
            version=str(data["version"]),
            pins=tuple(data["pins"]),
            environment=dict(data["environment"]),
            evidence=Evidence.from_json(data["evidence"]),
            judgement=str(data["judgement"]),
            why=str(data["why"]),
            interval=(str(data["interval"]["good"]), data["interval"]["bad"]),
        )


@dataclass(frozen=True, kw_only=True)
class BisectReport:
    cell: str
    package: str
    moved: tuple[str, ...]  # the packages pinned at each version (NAME, or the FlashInfer trio)
    index: str
    metric: str
    threshold: float
    good: str
    bad: str
    versions: tuple[str, ...]
    baseline: dict[str, Any]  # V1's environment
    environments: tuple[dict[str, Any], ...]  # every listed version's: {version, pins, ref, digest, source, built_in_s}
    steps: tuple[Step, ...]
    result: str  # one of RESULTS
    first_bad: str | None
    last_good: str | None
    reason: str
    builds: int  # environments built by this run (the others were found built)
    ab_runs: int
    seconds: float
    files: dict[str, str]

    @property
    def failed(self) -> bool:
        return self.result == "UNDECIDED"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": KIND,
            "schema_version": SCHEMA_VERSION,
            "cell": self.cell,
            "package": self.package,
            "moved": list(self.moved),
            "index": self.index,
            "metric": self.metric,
            "threshold": self.threshold,
            "good": self.good,
            "bad": self.bad,
            "versions": list(self.versions),
            "baseline": dict(self.baseline),
            "environments": [dict(e) for e in self.environments],
            "steps": [s.to_json() for s in self.steps],
            "result": self.result,
            "first_bad": self.first_bad,
            "last_good": self.last_good,
            "reason": self.reason,
            "builds": self.builds,
            "ab_runs": self.ab_runs,
            "seconds": self.seconds,
            "files": dict(self.files),
        }

    @staticmethod
    def read(data: dict[str, Any], *, source: str = "bisect.json") -> BisectReport:
        """`from_json` for a document of unknown origin (the report's sources): InputError naming
        the file and the field, as the A/B and sweep readers give, instead of a bare KeyError."""
        try:
            return BisectReport.from_json(data)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InputError(f"{source}: a malformed bisect report ({type(exc).__name__}: {exc})") from None

    @staticmethod
    def from_json(data: dict[str, Any]) -> BisectReport:
        if data.get("kind") != KIND or data.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"not a {KIND} document of schema {SCHEMA_VERSION}")
        plain = ("cell", "package", "index", "metric", "good", "bad", "result", "reason")
        return BisectReport(
            **{k: str(data[k]) for k in plain},
            moved=tuple(data["moved"]),
            threshold=float(data["threshold"]),
            versions=tuple(data["versions"]),
            baseline=dict(data["baseline"]),
            environments=tuple(dict(e) for e in data["environments"]),
            steps=tuple(Step.from_json(s) for s in data["steps"]),
            first_bad=data["first_bad"],
            last_good=data["last_good"],
            builds=int(data["builds"]),
            ab_runs=int(data["ab_runs"]),
            seconds=float(data["seconds"]),
            files=dict(data["files"]),
        )


def conclude(search: Search) -> tuple[str, str | None, str | None, str]:
    """(result, first bad, last good, reason) of a finished search."""
    good, bad = search.interval
    result = search.result
    if result == "FOUND":
        return result, bad, good, f"{bad} is the first bad version: {good} before it is good"
    if result == "NO REGRESSION":
        return result, None, good, search.stopped or ""
    if bad is None:
        return result, None, None, f"{search.stopped}; the bad end is not confirmed against the good end"
    return result, None, None, f"{search.stopped}; the first bad version is after {good} and no later than {bad}"
