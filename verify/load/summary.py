"""The load section of the receipt and the checks read from it: counts, percentiles, token accounting,
determinism, latency and fault statistics.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.matrix.model import LoadSpec
from pipeline.result import CheckResult, Status
from verify.load.determinism import Sample, judge_phase
from verify.load.outcome import LoadOutcome
from verify.load.stats import fault_stats
from verify.serving.openai import ErrorClass

LOAD_SCHEMA_VERSION = 1


__all__ = ["LOAD_SCHEMA_VERSION", "judge_load", "summarise"]


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
    deltas = None
    if outcome.before is not None and outcome.after is not None:
        deltas = {
            "generation_tokens": outcome.after.generated - outcome.before.generated,
            "prompt_tokens": outcome.after.prompt - outcome.before.prompt,
            "engine_steps": outcome.after.steps - outcome.before.steps,
            "iteration_tokens": outcome.after.tokens - outcome.before.tokens,
        }
    attempted = clean + faulted
    stats = fault_stats(spec.baseline_rate, attempted, faulted).to_json() if attempted else None
    return {
        "schema_version": LOAD_SCHEMA_VERSION,
        "config": outcome.config,
        "model": outcome.model,
        "seconds": round(outcome.seconds, 3),
        "stop_reason": outcome.stop_reason,
        "questions": {"attempted": attempted, "clean": clean, "faulted": faulted, "incomplete": incomplete},
        "requests": {"ok": len(ok), "errors": errors},
        "tokens": {
            "output": output_tokens,
            "prompt": sum(r.prompt_tokens or 0 for r in ok),
            "determinism_under_load": {
                "prompt": outcome.determinism_tokens[0],
                "completion": outcome.determinism_tokens[1],
            },
        },
        "throughput": {
            "output_tok_s": round(output_tokens / seconds, 3),
            "requests_s": round(len(ok) / seconds, 3),
            "questions_h": round(attempted / seconds * 3600, 1),
        },
        "latency_ms": {
            "ttft": _percentiles([r.ttft for r in ok if r.ttft is not None]),
            "tpot": _percentiles([t for r in ok if (t := r.tpot) is not None]),
            "itl": _percentiles([x for r in ok for x in r.itl]),
            "e2el": _percentiles([r.e2el for r in ok if r.e2el is not None]),
        },
        "server_counter_deltas": deltas,
        "events": [e.to_json() for e in outcome.events],
        "stats": stats,
        "files": outcome.files,
    }


def judge_load(outcome: LoadOutcome, summary: dict[str, Any], *, batch_invariant: bool) -> list[CheckResult]:
    """Checks from one load run: watchdog, questions, token accounting, determinism, latency, statistics."""
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
    if fatal is not None:
        checks.append(
            CheckResult(
                name="engine-progress",
                status=Status.FAIL,
                message=f"{fatal.type} after {fatal.at:.1f}s: {fatal.reason}; probes {fatal.api}",
                evidence=fatal.to_json(),
            )
        )
    else:
        scrapes, stall = outcome.scrapes, outcome.config["stall_seconds"]
        checks.append(
            CheckResult(
                name="engine-progress",
                status=Status.PASS,
                message=f"the engine progressed throughout ({scrapes} scrapes, stall rule {stall:g}s)",
                evidence={"scrapes": scrapes, "unknown_events": [e.to_json() for e in outcome.events]},
            )
        )
    q = summary["questions"]
    errors = summary["requests"]["errors"]
    if q["attempted"] == 0:
        checks.append(
            CheckResult(
                name="questions",
                status=Status.INCONCLUSIVE if fatal is None else Status.FAIL,
                message=f"no question finished ({outcome.stop_reason})",
                evidence=q,
            )
        )
    else:
        failed = [r for r in outcome.records if r.kind == "load" and r.error_class not in (None, ErrorClass.ABORTED)]
        status = Status.FAIL if q["faulted"] else Status.PASS
        message = f"{q['clean']} of {q['attempted']} questions clean ({summary['requests']['ok']} requests)"
        if q["faulted"]:
            message += f"; errors {errors}; first: {failed[0].error}" if failed else f"; errors {errors}"
        checks.append(
            CheckResult(
                name="questions",
                status=status,
                message=message,
                evidence={**q, "errors": errors, "first_errors": [r.to_json() for r in failed[:5]]},
            )
        )
    checks.append(_token_accounting(outcome, summary, fatal is not None))
    references: dict[int, Sample] = {}
    for sample in outcome.determinism_a:  # each prompt's first good answer is the reference
        if not sample.error:
            references.setdefault(sample.prompt, sample)
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
    latency = summary["latency_ms"]
    checks.append(
        CheckResult(
            name="latency",
            status=Status.PASS if summary["requests"]["ok"] else Status.SKIP,
            message=(
                f"TTFT p50 {latency['ttft']['p50']} ms p99 {latency['ttft']['p99']} ms, TPOT p50 "
                f"{latency['tpot']['p50']} ms, {summary['throughput']['output_tok_s']:.0f} output tok/s"
            ),
            evidence={"latency_ms": latency, "throughput": summary["throughput"]},
        )
    )
    if summary["stats"] is not None:
        s = summary["stats"]
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
        checks.append(CheckResult(name="fault-statistics", status=Status.PASS, message=message, evidence=s))
    return checks


def _token_accounting(outcome: LoadOutcome, summary: dict[str, Any], ended_by_verdict: bool) -> CheckResult:
    """The client's token counts must equal the server's counter deltas over the same window."""
    deltas = summary["server_counter_deltas"]
    client = summary["tokens"]["output"] + outcome.determinism_tokens[1]
    client_prompt = summary["tokens"]["prompt"] + outcome.determinism_tokens[0]
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
