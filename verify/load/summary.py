"""The load section of the receipt and the checks read from it: counts, percentiles, token accounting,
determinism, latency and fault statistics.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from pipeline.findings import LOAD_SCHEMA_VERSION, LoadSummary, Questions, Throughput
from pipeline.matrix.model import LoadSpec
from pipeline.result import CheckResult, Status
from verify.load.determinism import Sample, judge_phase
from verify.load.outcome import LoadOutcome
from verify.load.stats import fault_stats
from verify.load.watchdog import Event
from verify.serving.openai import ErrorClass

__all__ = ["LOAD_SCHEMA_VERSION", "LoadSummary", "Questions", "Throughput", "judge_load", "summarise", "summarise_load"]


def _percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p90": None, "p99": None, "max": None, "mean": None}
    array = np.asarray(values) * 1000.0  # ms, as the engines' own serving benchmarks report
    p50, p90, p99 = np.percentile(array, [50, 90, 99])
    return {
        "p50": round(float(p50), 3),
        "p90": round(float(p90), 3),
        "p99": round(float(p99), 3),
        "max": round(float(array.max()), 3),
        "mean": round(float(array.mean()), 3),
    }


def summarise(outcome: LoadOutcome, spec: LoadSpec) -> dict[str, Any]:
    """The load section of the receipt as JSON (`summarise_load(...).to_dict()`), for callers that add to it."""
    return summarise_load(outcome, spec).to_dict()


def summarise_load(outcome: LoadOutcome, spec: LoadSpec) -> LoadSummary:
    """The load section of the receipt (schema_version 1): counts, percentiles, deltas, events, stats."""
    load_records = [r for r in outcome.records if r.kind == "load"]
    ok = [r for r in load_records if r.ok]
    errors: dict[str, int] = {}
    for r in load_records:
        if r.error_class is not None:
            errors[str(r.error_class)] = errors.get(str(r.error_class), 0) + 1
    clean = sum(1 for v in outcome.questions.values() if v is True)
    faulted = sum(1 for v in outcome.questions.values() if v is False)
    incomplete = sum(1 for v in outcome.questions.values() if v is None)
    seconds = max(outcome.seconds, 1e-9)
    output_tokens = sum(r.output_tokens for r in ok)
    attempted = clean + faulted
    return LoadSummary(
        schema_version=LOAD_SCHEMA_VERSION,
        config=outcome.config,
        model=outcome.model,
        seconds=round(outcome.seconds, 3),
        stop_reason=outcome.stop_reason,
        questions=Questions(attempted=attempted, clean=clean, faulted=faulted, incomplete=incomplete),
        requests_ok=len(ok),
        errors=errors,
        output_tokens=output_tokens,
        prompt_tokens=sum(r.prompt_tokens or 0 for r in ok),
        determinism_tokens=outcome.determinism_tokens,
        throughput=Throughput(
            output_tok_s=round(output_tokens / seconds, 3),
            requests_s=round(len(ok) / seconds, 3),
            questions_h=round(attempted / seconds * 3600, 1),
        ),
        latency_ms={
            "ttft": _percentiles([r.ttft for r in ok if r.ttft is not None]),
            "tpot": _percentiles([t for r in ok if (t := r.tpot) is not None]),
            "itl": _percentiles([x for r in ok for x in r.itl]),
            "e2el": _percentiles([r.e2el for r in ok if r.e2el is not None]),
        },
        server_counter_deltas=_counter_deltas(outcome),
        events=tuple(e.to_json() for e in outcome.events),
        stats=fault_stats(spec.baseline_rate, attempted, faulted).to_json() if attempted else None,
        files=outcome.files,
    )


def _counter_deltas(outcome: LoadOutcome) -> dict[str, float] | None:
    """What the server's counters moved by over the run; None without both scrapes."""
    if outcome.before is None or outcome.after is None:
        return None
    return {
        "generation_tokens": outcome.after.generated - outcome.before.generated,
        "prompt_tokens": outcome.after.prompt - outcome.before.prompt,
        "engine_steps": outcome.after.steps - outcome.before.steps,
        "iteration_tokens": outcome.after.tokens - outcome.before.tokens,
    }


def judge_load(
    outcome: LoadOutcome, summary: LoadSummary | Mapping[str, Any], *, batch_invariant: bool
) -> list[CheckResult]:
    """Checks from one load run: watchdog, questions, token accounting, determinism, latency, statistics.

    `summary` is `summarise_load`'s answer, or its JSON (the commands keep the dict they write)."""
    if not isinstance(summary, LoadSummary):
        summary = LoadSummary.from_dict(summary)
    checks: list[CheckResult] = []
    if outcome.crashed:
        checks.append(
            CheckResult(
                name="load-workers",
                status=Status.ERROR,
                message=f"{outcome.crashed}: the questions it held were not answered; nothing is proven",
            )
        )
    fatal = next((e for e in outcome.events if e.type != "UNKNOWN"), None)
    checks.append(_engine_progress(outcome, fatal))
    checks.append(_questions_check(outcome, summary, ended_by_verdict=fatal is not None))
    checks.append(_token_accounting(outcome, summary, fatal is not None))
    checks += _determinism_checks(outcome, batch_invariant=batch_invariant)
    checks.append(_latency_check(summary))
    if summary.stats is not None:
        checks.append(_fault_statistics(summary.stats))
    return checks


def _engine_progress(outcome: LoadOutcome, fatal: Event | None) -> CheckResult:
    """The watchdog's verdict: the first stall or death it saw, else that the engine kept moving."""
    if fatal is not None:
        return CheckResult(
            name="engine-progress",
            status=Status.FAIL,
            message=f"{fatal.type} after {fatal.at:.1f}s: {fatal.reason}; probes {fatal.api}",
            evidence=fatal.to_json(),
        )
    scrapes, stall = outcome.scrapes, outcome.config["stall_seconds"]
    return CheckResult(
        name="engine-progress",
        status=Status.PASS,
        message=f"the engine progressed throughout ({scrapes} scrapes, stall rule {stall:g}s)",
        evidence={"scrapes": scrapes, "unknown_events": [e.to_json() for e in outcome.events]},
    )


def _questions_check(outcome: LoadOutcome, summary: LoadSummary, *, ended_by_verdict: bool) -> CheckResult:
    q = summary.to_dict()["questions"]  # the evidence is the receipt's own layout
    errors = summary.errors
    if summary.questions.attempted == 0:
        return CheckResult(
            name="questions",
            status=Status.FAIL if ended_by_verdict else Status.INCONCLUSIVE,
            message=f"no question finished ({outcome.stop_reason})",
            evidence=q,
        )
    failed = [r for r in outcome.records if r.kind == "load" and r.error_class not in (None, ErrorClass.ABORTED)]
    faulted = summary.questions.faulted
    message = (
        f"{summary.questions.clean} of {summary.questions.attempted} questions clean ({summary.requests_ok} requests)"
    )
    if faulted:
        message += f"; errors {errors}; first: {failed[0].error}" if failed else f"; errors {errors}"
    return CheckResult(
        name="questions",
        status=Status.FAIL if faulted else Status.PASS,
        message=message,
        evidence={**q, "errors": errors, "first_errors": [r.to_json() for r in failed[:5]]},
    )


def _determinism_checks(outcome: LoadOutcome, *, batch_invariant: bool) -> list[CheckResult]:
    references: dict[int, Sample] = {}
    for sample in outcome.determinism_a:  # each prompt's first good answer is the reference
        if not sample.error:
            references.setdefault(sample.prompt, sample)
    checks: list[CheckResult] = []
    if outcome.config["determinism_repeats"] == 0:
        checks.append(CheckResult(name="determinism", status=Status.SKIP, message="switched off (0 repeats)"))
    else:
        checks.append(judge_phase("A", references, outcome.determinism_a, batch_invariant=batch_invariant))
    if outcome.determinism_b:
        checks.append(
            judge_phase(
                "B",
                references,
                outcome.determinism_b,
                batch_invariant=batch_invariant,
                invariance_env=outcome.invariance_env,
            )
        )
    return checks


def _latency_check(summary: LoadSummary) -> CheckResult:
    latency = summary.latency_ms
    throughput = summary.to_dict()["throughput"]
    return CheckResult(
        name="latency",
        status=Status.PASS if summary.requests_ok else Status.SKIP,
        message=(
            f"TTFT p50 {latency['ttft']['p50']} ms p99 {latency['ttft']['p99']} ms, TPOT p50 "
            f"{latency['tpot']['p50']} ms, {summary.throughput.output_tok_s:.0f} output tok/s"
        ),
        evidence={"latency_ms": latency, "throughput": throughput},
    )


def _fault_statistics(s: dict[str, Any]) -> CheckResult:
    baseline = f"1/{1 / s['baseline_rate']:.0f}"
    if s["faults"] == 0:
        message = (
            f"0 faults in {s['questions']} questions: a run this clean happens {s['p_luck']:.0%} of the time "
            f"at the baseline {baseline}; {s['need_clean_95']} clean questions claim a fix at 95%"
        )
    else:
        low, high = s["rate_ci95"]
        message = (
            f"{s['faults']} faults in {s['questions']} questions: rate 95% CI [{low:.4g}, {high:.4g}] per "
            f"question against the baseline {baseline}"
        )
    return CheckResult(name="fault-statistics", status=Status.PASS, message=message, evidence=s)


def _token_accounting(outcome: LoadOutcome, summary: LoadSummary, ended_by_verdict: bool) -> CheckResult:
    """The client's token counts must equal the server's counter deltas over the same window."""
    deltas = summary.server_counter_deltas
    client = summary.output_tokens + outcome.determinism_tokens[1]
    client_prompt = summary.prompt_tokens + outcome.determinism_tokens[0]
    evidence = {"client_output_tokens": client, "client_prompt_tokens": client_prompt, "server_deltas": deltas}
    if deltas is None:
        why = "the run ended on a verdict" if ended_by_verdict else "a /metrics scrape failed"
        return CheckResult(
            name="token-accounting", status=Status.SKIP, message=f"not compared: {why}", evidence=evidence
        )
    aborted = any(r.error_class is not None for r in outcome.records)
    server, server_prompt = deltas["generation_tokens"], deltas["prompt_tokens"]
    if server == client and server_prompt == client_prompt:
        message = (
            f"{client} output and {client_prompt} prompt tokens in the answers' usage = the deltas of "
            f"{outcome.counters[0]} and {outcome.counters[1]}"
        )
        return CheckResult(name="token-accounting", status=Status.PASS, message=message, evidence=evidence)
    message = (
        f"the answers' usage says {client} output and {client_prompt} prompt tokens; the server's counters "
        f"moved by {server:.0f} and {server_prompt:.0f}"
    )
    if aborted:  # a cancelled or failed request's tokens were counted by the server, not received
        return CheckResult(
            name="token-accounting",
            status=Status.INCONCLUSIVE,
            message=message + " (some requests failed or were cancelled)",
            evidence=evidence,
        )
    return CheckResult(name="token-accounting", status=Status.FAIL, message=message, evidence=evidence)
