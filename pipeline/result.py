"""Verdicts as data: a status, a message and the evidence behind it.

Checks return `CheckResult`s; a stage's status is the worst of its checks'; a `VerifyReport` is
what one verification of one image produced, with the cell's expectation evaluated against it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pipeline.findings import LoadSection, ProbeReport
from pipeline.matrix.model import STAGES, Expectation

__all__ = ["CheckResult", "Expectation", "Outcome", "StageResult", "Status", "VerifyReport", "evaluate", "worst"]

REPORT_SCHEMA_VERSION = 1


class Status(StrEnum):
    PASS = "PASS"
    WARN = "WARN"  # passes, with something a reader must see (e.g. a grown workspace)
    FAIL = "FAIL"
    INCONCLUSIVE = "INCONCLUSIVE"
    SKIP = "SKIP"
    ERROR = "ERROR"


# How bad each status is when a stage sums up its checks: one FAIL makes the stage FAIL.
_SEVERITY = {Status.SKIP: 0, Status.PASS: 1, Status.WARN: 2, Status.INCONCLUSIVE: 3, Status.ERROR: 4, Status.FAIL: 5}


def worst(statuses: list[Status]) -> Status:
    relevant = [s for s in statuses if s is not Status.SKIP]
    return max(relevant, key=_SEVERITY.__getitem__) if relevant else Status.SKIP


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    name: str
    status: Status
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class StageResult:
    stage: str
    status: Status
    checks: tuple[CheckResult, ...]
    seconds: float
    artifacts: dict[str, str] = field(default_factory=dict)  # name -> path of a kept file
    # What the stage found, typed (pipeline/findings.py), handed in memory to the stages after it and
    # to the receipt: the imports probe's report, the load section. Never read back from its files,
    # and not serialised here (the files in `artifacts` are their serialised form).
    probe_report: ProbeReport | None = field(default=None, compare=False, repr=False)
    load_section: LoadSection | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(
        cls,
        stage: str,
        checks: list[CheckResult],
        seconds: float,
        *,
        probe_report: ProbeReport | None = None,
        load_section: LoadSection | None = None,
        **artifacts: str,
    ) -> StageResult:
        return cls(
            stage=stage,
            status=worst([c.status for c in checks]),
            checks=tuple(checks),
            seconds=round(seconds, 2),
            artifacts=artifacts,
            probe_report=probe_report,
            load_section=load_section,
        )

    def failures(self) -> list[CheckResult]:
        return [c for c in self.checks if c.status in (Status.FAIL, Status.ERROR)]


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """Whether the pipeline passes, once the cell's expectation is taken into account."""

    passed: bool  # the pipeline did not fail (a known-bad cell failing as declared passes it)
    summary: str
    expected_failure: dict[str, Any] | None = None
    # A host-dependent expected failure (`may_not_reproduce`) that did not happen here: neither a
    # pipeline failure nor a pass of the fix. The receipt says NOT_REPRODUCED; the exit code is 0.
    not_reproduced: bool = False


@dataclass(frozen=True, kw_only=True)
class VerifyReport:
    cell: str
    arm: str | None
    image: str
    image_id: str
    stages: tuple[StageResult, ...]
    outcome: Outcome
    servers: dict[str, Any] = field(default_factory=dict)  # servers started (count, names) and the plan
    schema_version: int = REPORT_SCHEMA_VERSION

    @property
    def probe(self) -> ProbeReport | None:
        """What the imports probe found, when the imports stage ran and its probe answered."""
        return next((s.probe_report for s in self.stages if s.probe_report is not None), None)

    @property
    def load(self) -> LoadSection | None:
        """The load section, when the load stage ran and measured."""
        return next((s.load_section for s in self.stages if s.load_section is not None), None)


def evaluate(expect: Expectation | None, stages: list[StageResult]) -> Outcome:
    """Apply the cell's expectation to the stages that ran.

    Without one, the pipeline passes when no stage failed. With `expect: fail` at stage S, it
    passes only when S ran and FAILed, every stage before S passed, and the failure evidence
    matches the declared pattern: failing elsewhere, or for another reason, or passing, is a
    pipeline failure. When S was not selected, the stages that ran must pass.
    """
    bad = [s for s in stages if s.status in (Status.FAIL, Status.ERROR)]
    ran = {s.stage for s in stages}
    if expect is None or expect.stage not in ran:
        if bad:
            return Outcome(passed=False, summary=f"{bad[0].stage} {bad[0].status}: {_first_failure(bad[0])}")
        note = f" (expected failure at {expect.stage} not evaluated: stage not run)" if expect else ""
        return Outcome(passed=True, summary=passed_summary(stages) + note)
    target = next(s for s in stages if s.stage == expect.stage)
    before = [s for s in stages if STAGES.index(s.stage) < STAGES.index(expect.stage)]
    record: dict[str, Any] = {"stage": expect.stage, "reason": expect.reason, "match": expect.match}
    if any(s.status in (Status.FAIL, Status.ERROR) for s in before):
        early = next(s for s in before if s.status in (Status.FAIL, Status.ERROR))
        return Outcome(
            passed=False,
            expected_failure={**record, "matched": False},
            summary=f"expected to fail at {expect.stage} but failed earlier, at {early.stage}: {_first_failure(early)}",
        )
    if target.status in (Status.PASS, Status.WARN) and expect.may_not_reproduce:
        return Outcome(
            passed=True,
            not_reproduced=True,
            expected_failure={**record, "matched": False, "may_not_reproduce": expect.may_not_reproduce},
            summary=f"NOT_REPRODUCED: {expect.stage} was expected to fail but was {target.status} on this host "
            f"({expect.may_not_reproduce}); the expectation checks the failure evidence for {expect.match!r}",
        )
    if target.status is not Status.FAIL:
        return Outcome(
            passed=False,
            expected_failure={**record, "matched": False},
            summary=f"expected to fail at {expect.stage} ({expect.reason}) but it was {target.status}",
        )
    evidence = "\n".join(f"{c.message}\n{c.evidence}" for c in target.failures())
    matched = re.search(expect.match, evidence) is not None
    if not matched:
        return Outcome(
            passed=False,
            expected_failure={**record, "matched": False},
            summary=f"{expect.stage} failed, but not for the declared reason (no match for "
            f"{expect.match!r}): {_first_failure(target)}",
        )
    return Outcome(
        passed=True,
        expected_failure={**record, "matched": True},
        summary=f"failed at {expect.stage} as expected: {expect.reason}",
    )


def passed_summary(stages: list[StageResult]) -> str:
    """What a pass is made of: "all stages passed" only when every stage ran and none was skipped;
    otherwise which passed, which were skipped (with the first reason) and which never ran."""
    ran = {s.stage for s in stages}
    skipped = [s for s in stages if s.status is Status.SKIP]
    not_run = [name for name in STAGES if name not in ran]
    if not skipped and not not_run:
        return "all stages passed"
    parts = []
    passed = [s.stage for s in stages if s.status is not Status.SKIP]
    if passed:
        parts.append(f"passed: {', '.join(passed)}")
    if skipped:
        parts.append("skipped: " + ", ".join(f"{s.stage} ({_skip_reason(s)})" for s in skipped))
    if not_run:
        parts.append(f"not run: {', '.join(not_run)}")
    return "; ".join(parts)


def _skip_reason(stage: StageResult) -> str:
    reasons = [c.message for c in stage.checks if c.status is Status.SKIP and c.message]
    return " ".join(reasons[0].split())[:120] if reasons else "no reason given"


def _first_failure(stage: StageResult) -> str:
    failures = stage.failures()
    return failures[0].message if failures else str(stage.status)
