"""The load run: the summary and verdicts from hand-built outcomes, then `run_load` against a fake server.

The second half are fake-backed unit tests, not integration tests: `tests/unit/fake_openai.py` serves an
OpenAI-compatible API and a /metrics page from a thread on 127.0.0.1; no docker, no model, no GPU.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.matrix.model import LoadSpec
from pipeline.result import CheckResult, Status
from verify.load import watchdog
from verify.load.determinism import Sample
from verify.load.outcome import LoadOutcome, LoadTarget
from verify.load.progress import Progress, StallVerdict
from verify.load.run import run_load
from verify.load.summary import LoadSummary, _percentiles, judge_load, summarise, summarise_load
from verify.load.watchdog import Event
from verify.load.workload import builtin_pool
from verify.serving.openai import ErrorClass, RequestRecord

from .fake_openai import FakeVllm

SPEC = LoadSpec()


def rec(
    qid: str,
    turn: int = 0,
    *,
    ttft: float = 0.1,
    itl: tuple[float, ...] = (0.02, 0.03),
    e2el: float = 0.2,
    out: int = 3,
    prompt: int = 10,
    error: ErrorClass | None = None,
    kind: str = "load",
) -> RequestRecord:
    if error is not None:
        return RequestRecord(question_id=qid, turn=turn, kind=kind, error_class=error, error=f"{error}: boom")
    return RequestRecord(
        question_id=qid,
        turn=turn,
        kind=kind,
        ttft=ttft,
        itl=list(itl),
        e2el=e2el,
        output_tokens=out,
        prompt_tokens=prompt,
        finish_reason="length",
    )


def prog(generated: float = 0.0, prompt: float = 0.0, steps: float = 0.0, tokens: float = 0.0) -> Progress:
    return Progress(
        steps=steps, tokens=tokens, generated=generated, prompt=prompt, running=0.0, waiting=0.0, process_start=1.0
    )


def det(tokens: str, prompt: int = 0, phase: str = "A", error: str | None = None) -> Sample:
    toks = tuple(tokens.split())
    return Sample(prompt=prompt, phase=phase, tokens=toks, top2_gaps=tuple(0.5 for _ in toks), error=error)


def event(verdict: StallVerdict = StallVerdict.ENGINE_STALL_API_ALIVE) -> Event:
    return Event(
        type=verdict,
        at=61.5,
        reason="2 requests in flight and no engine progress for 60.5s (stall_seconds 60)",
        progress_age_s=60.5,
        in_flight=2,
        engine_steps=10.0,
        cum_tokens=40.0,
        generated_tokens=30.0,
        running=2.0,
        waiting=0.0,
        api={"health": 200, "models": 200, "metrics": 200},
        gpu={"available": False, "reason": "CPU cell"},
    )


def outcome(
    records: list[RequestRecord],
    questions: dict[str, bool | None],
    *,
    before: Progress | None = None,
    after: Progress | None = None,
    events: list[Event] | None = None,
    determinism_a: list[Sample] | None = None,
    determinism_b: list[Sample] | None = None,
    determinism_tokens: tuple[int, int] = (0, 0),
    seconds: float = 2.0,
) -> LoadOutcome:
    return LoadOutcome(
        config={"mode": "short", **dataclasses.asdict(SPEC)},
        model="m",
        records=records,
        questions=questions,
        events=events or [],
        determinism_a=determinism_a if determinism_a is not None else [det("a b"), det("a b")],
        determinism_b=determinism_b or [],
        before=before,
        after=after,
        seconds=seconds,
        stop_reason="all questions answered",
        determinism_tokens=determinism_tokens,
        scrapes=5,
    )


def checks_by_name(o: LoadOutcome) -> dict[str, CheckResult]:
    checks = judge_load(o, summarise(o, SPEC), batch_invariant=False)
    by_name = {c.name: c for c in checks}
    assert len(by_name) == len(checks)
    return by_name


# -- _percentiles and summarise ---------------------------------------------------------------------------


def test_percentiles_are_milliseconds() -> None:
    assert _percentiles([0.1, 0.2, 0.3, 0.4]) == {"p50": 250.0, "p90": 370.0, "p99": 397.0, "max": 400.0, "mean": 250.0}
    assert _percentiles([0.0123456]) == {"p50": 12.346, "p90": 12.346, "p99": 12.346, "max": 12.346, "mean": 12.346}
    assert _percentiles([]) == {"p50": None, "p90": None, "p99": None, "max": None, "mean": None}


def test_summarise_latency_only_from_ok_load_requests() -> None:
    records = [
        rec("a", 0, ttft=0.1, itl=(0.01,), e2el=0.5, out=5),
        rec("a", 1, ttft=0.3, itl=(0.03, 0.05), e2el=0.7, out=3),
        rec("b", 0, error=ErrorClass.CHUNK_TIMEOUT),
        rec("d", 0, ttft=9.0, e2el=99.0, out=100, kind="determinism"),  # not load: left out
    ]
    s = summarise(outcome(records, {"a": True, "b": False}), SPEC)
    latency = s["latency_ms"]
    assert latency["ttft"] == {"p50": 200.0, "p90": 280.0, "p99": 298.0, "max": 300.0, "mean": 200.0}
    assert latency["itl"]["max"] == 50.0 and latency["itl"]["p50"] == 30.0
    assert latency["e2el"]["mean"] == 600.0
    # TPOT = (E2EL - TTFT) / (tokens - 1): 0.4/4 = 100 ms and 0.4/2 = 200 ms
    assert latency["tpot"]["p50"] == pytest.approx(150.0) and latency["tpot"]["max"] == pytest.approx(200.0)
    assert s["requests"] == {"ok": 2, "errors": {"chunk_timeout": 1}}
    assert s["tokens"]["output"] == 8 and s["tokens"]["prompt"] == 20


def test_summarise_question_buckets_errors_and_throughput() -> None:
    records = [
        rec("a", 0),
        rec("a", 1),
        rec("b", 0, error=ErrorClass.ENGINE_DEAD),
        rec("c", 0, error=ErrorClass.ABORTED),
        rec("d", 0, error=ErrorClass.ENGINE_DEAD),
        rec("e", 0),
    ]
    questions: dict[str, bool | None] = {"a": True, "b": False, "c": None, "d": False, "e": True}
    s = summarise(outcome(records, questions, seconds=4.0, determinism_tokens=(11, 22)), SPEC)
    assert s["schema_version"] == 1 and s["model"] == "m" and s["stop_reason"] == "all questions answered"
    assert s["questions"] == {"attempted": 4, "clean": 2, "faulted": 2, "incomplete": 1}
    assert s["requests"] == {"ok": 3, "errors": {"engine_dead": 2, "aborted": 1}}
    assert s["tokens"] == {"output": 9, "prompt": 30, "determinism_under_load": {"prompt": 11, "completion": 22}}
    assert s["throughput"] == {"output_tok_s": 2.25, "requests_s": 0.75, "questions_h": 3600.0}
    assert s["stats"]["questions"] == 4 and s["stats"]["faults"] == 2
    assert s["stats"]["baseline_rate"] == pytest.approx(1 / 450)
    assert s["config"]["mode"] == "short"
    json.dumps(s)  # the receipt section is plain JSON


def test_summarise_counter_deltas() -> None:
    before = prog(generated=100, prompt=50, steps=10, tokens=150)
    after = prog(generated=130, prompt=70, steps=25, tokens=200)
    s = summarise(outcome([rec("a")], {"a": True}, before=before, after=after), SPEC)
    assert s["server_counter_deltas"] == {
        "generation_tokens": 30.0,
        "prompt_tokens": 20.0,
        "engine_steps": 15.0,
        "iteration_tokens": 50.0,
    }
    assert summarise(outcome([rec("a")], {"a": True}, before=before), SPEC)["server_counter_deltas"] is None


def test_summarise_without_a_finished_question_has_no_stats() -> None:
    s = summarise(outcome([], {"a": None}), SPEC)
    assert s["questions"] == {"attempted": 0, "clean": 0, "faulted": 0, "incomplete": 1}
    assert s["stats"] is None
    assert s["latency_ms"]["ttft"]["p50"] is None


def test_the_summary_is_written_once_and_read_back_through_its_type() -> None:
    """load.json's layout is the receipt's (schema_version 1), key for key, and reads back to the same JSON."""
    before = prog(generated=100, prompt=50, steps=10, tokens=150)
    after = prog(generated=130, prompt=70, steps=25, tokens=200)
    questions: dict[str, bool | None] = {"a": True, "b": False, "c": None}
    records = [rec("a"), rec("b", error=ErrorClass.ENGINE_DEAD), rec("c", error=ErrorClass.ABORTED)]
    o = outcome(records, questions, before=before, after=after, determinism_tokens=(3, 4))
    typed = summarise_load(o, SPEC)
    assert typed.to_dict() == summarise(o, SPEC)
    assert list(typed.to_dict()) == [
        "schema_version",
        "config",
        "model",
        "seconds",
        "stop_reason",
        "questions",
        "requests",
        "tokens",
        "throughput",
        "latency_ms",
        "server_counter_deltas",
        "events",
        "stats",
        "files",
    ]
    text = json.dumps(typed.to_dict(), indent=2)
    assert json.dumps(LoadSummary.from_dict(json.loads(text)).to_dict(), indent=2) == text
    # a stage's extra sections (cost, correctness) beside the summary do not stop it reading back
    extra = {**json.loads(text), "cost": {}, "correctness": {}}
    assert LoadSummary.from_dict(extra).questions == typed.questions
    assert typed.questions.attempted == 2 and typed.questions.incomplete == 1 and typed.output_tokens == 3


def test_judge_load_reads_the_typed_summary_and_its_json_alike() -> None:
    o = outcome([rec("a")], {"a": True}, before=prog(generated=0), after=prog(generated=4))
    typed = summarise_load(o, SPEC)
    from_json = judge_load(o, typed.to_dict(), batch_invariant=False)
    assert [(c.name, c.status, c.message) for c in judge_load(o, typed, batch_invariant=False)] == [
        (c.name, c.status, c.message) for c in from_json
    ]


# -- judge_load -----------------------------------------------------------------------------------------

CLEAN = [rec("a", 0, out=4, prompt=10), rec("a", 1, out=4, prompt=20), rec("b", 0, out=4, prompt=10)]
BEFORE = prog(generated=1000, prompt=500)


def test_clean_run_passes_every_check_and_tokens_add_up() -> None:
    # output: 12 from the answers + 6 from determinism phase B; prompt: 40 + 9
    after = prog(generated=1000 + 18, prompt=500 + 49)
    o = outcome(
        CLEAN,
        {"a": True, "b": True},
        before=BEFORE,
        after=after,
        determinism_b=[det("a b", phase="B")],
        determinism_tokens=(9, 6),
    )
    checks = checks_by_name(o)
    assert {n: c.status for n, c in checks.items()} == {
        "engine-progress": Status.PASS,
        "questions": Status.PASS,
        "token-accounting": Status.PASS,
        "determinism-alone": Status.PASS,
        "determinism-under-load": Status.PASS,
        "latency": Status.PASS,
        "fault-statistics": Status.PASS,
    }
    tokens = checks["token-accounting"]
    assert tokens.evidence["client_output_tokens"] == 18 and tokens.evidence["client_prompt_tokens"] == 49
    assert tokens.message.startswith("18 output and 49 prompt tokens in the answers' usage = the deltas")
    assert checks["questions"].message == "2 of 2 questions clean (3 requests)"
    assert checks["fault-statistics"].message.startswith("0 faults in 2 questions: a run this clean happens")
    assert "at the baseline 1/450" in checks["fault-statistics"].message


def test_token_mismatch_without_a_failed_request_fails() -> None:
    after = prog(generated=1000 + 13, prompt=500 + 40)  # one token more than the answers say
    checks = checks_by_name(outcome(CLEAN, {"a": True, "b": True}, before=BEFORE, after=after))
    assert checks["token-accounting"].status is Status.FAIL
    assert checks["token-accounting"].message == (
        "the answers' usage says 12 output and 40 prompt tokens; the server's counters moved by 13 and 40"
    )


def test_prompt_token_mismatch_alone_fails() -> None:
    after = prog(generated=1000 + 12, prompt=500 + 41)
    checks = checks_by_name(outcome(CLEAN, {"a": True, "b": True}, before=BEFORE, after=after))
    assert checks["token-accounting"].status is Status.FAIL


def test_token_mismatch_with_a_failed_request_is_inconclusive() -> None:
    records = [*CLEAN, rec("c", 0, error=ErrorClass.CHUNK_TIMEOUT)]
    after = prog(generated=1000 + 20, prompt=500 + 50)  # the failed request's tokens: counted, never received
    checks = checks_by_name(outcome(records, {"a": True, "b": True, "c": False}, before=BEFORE, after=after))
    assert checks["token-accounting"].status is Status.INCONCLUSIVE
    assert checks["token-accounting"].message.endswith(" (some requests failed or were cancelled)")


def test_token_accounting_skipped_without_the_final_scrape() -> None:
    checks = checks_by_name(outcome(CLEAN, {"a": True, "b": True}, before=BEFORE, after=None))
    assert checks["token-accounting"].status is Status.SKIP
    assert checks["token-accounting"].message == "not compared: a /metrics scrape failed"


def test_a_fatal_event_fails_engine_progress_and_skips_token_accounting() -> None:
    o = outcome(CLEAN[:1], {"a": False, "b": False}, before=BEFORE, after=None, events=[event()])
    checks = checks_by_name(o)
    progress = checks["engine-progress"]
    assert progress.status is Status.FAIL
    assert progress.message == (
        "ENGINE_STALL_API_ALIVE after 61.5s: 2 requests in flight and no engine progress for 60.5s (stall_seconds 60); "
        "probes {'health': 200, 'models': 200, 'metrics': 200}"
    )
    assert progress.evidence["type"] == "ENGINE_STALL_API_ALIVE" and progress.evidence["in_flight"] == 2
    assert checks["token-accounting"].status is Status.SKIP
    assert checks["token-accounting"].message == "not compared: the run ended on a verdict"
    assert checks["questions"].status is Status.FAIL


def test_unknown_events_do_not_fail_engine_progress() -> None:
    o = outcome(CLEAN, {"a": True, "b": True}, events=[event(StallVerdict.UNKNOWN)])
    progress = checks_by_name(o)["engine-progress"]
    assert progress.status is Status.PASS
    assert progress.message == "the engine progressed throughout (5 scrapes, stall rule 60s)"
    assert [e["type"] for e in progress.evidence["unknown_events"]] == ["UNKNOWN"]


def test_a_faulted_question_fails_questions_and_names_the_first_error() -> None:
    records = [*CLEAN, rec("c", 0, error=ErrorClass.STREAM_TRUNCATED)]
    checks = checks_by_name(outcome(records, {"a": True, "b": True, "c": False}))
    questions = checks["questions"]
    assert questions.status is Status.FAIL
    assert questions.message == (
        "2 of 3 questions clean (3 requests); errors {'stream_truncated': 1}; first: stream_truncated: boom"
    )
    assert questions.evidence["faulted"] == 1 and len(questions.evidence["first_errors"]) == 1
    assert checks["fault-statistics"].message.startswith("1 faults in 3 questions: rate 95% CI [")


def test_no_finished_question_is_inconclusive_without_a_verdict() -> None:
    checks = checks_by_name(outcome([], {"a": None}))
    assert checks["questions"].status is Status.INCONCLUSIVE
    assert checks["questions"].message == "no question finished (all questions answered)"
    assert checks["latency"].status is Status.SKIP
    assert "fault-statistics" not in checks
    assert checks_by_name(outcome([], {"a": None}, events=[event()]))["questions"].status is Status.FAIL


def test_determinism_checks_from_the_outcome() -> None:
    o = outcome(
        CLEAN,
        {"a": True, "b": True},
        determinism_a=[det("a b"), det("a b"), det("x y", prompt=1), det("", prompt=1, error="HTTP 500: x")],
        determinism_b=[det("a c", phase="B"), det("x y", prompt=1, phase="B")],
    )
    checks = checks_by_name(o)
    assert checks["determinism-alone"].status is Status.WARN  # equal, but one sample failed to return
    assert checks["determinism-under-load"].status is Status.WARN
    assert checks["determinism-under-load"].message.startswith("1 of 2 samples diverged; first: prompt 0 at token 1")
    assert "determinism-under-load" not in checks_by_name(outcome(CLEAN, {"a": True, "b": True}))


def test_determinism_switched_off_is_one_skipped_check() -> None:
    o = dataclasses.replace(
        outcome(CLEAN, {"a": True, "b": True}, determinism_a=[]),
        config={"mode": "short", **dataclasses.asdict(dataclasses.replace(SPEC, determinism_repeats=0))},
    )
    checks = checks_by_name(o)
    assert checks["determinism"].status is Status.SKIP
    assert checks["determinism"].message == "switched off (0 repeats)"
    assert "determinism-alone" not in checks and "determinism-under-load" not in checks


def test_determinism_reference_is_the_first_phase_a_answer() -> None:
    """determinism.py: 'Each sample is compared with the prompt's first phase-A answer'."""
    o = outcome(CLEAN, {"a": True, "b": True}, determinism_a=[det("a b"), det("a c"), det("a c")])
    alone = checks_by_name(o)["determinism-alone"]
    assert alone.status is Status.FAIL
    assert alone.message.startswith("2 of 3 samples diverged; first: prompt 0 at token 1 ('b' -> 'c'")


# -- run_load against a fake server (fake-backed unit tests) --------------------------------------------------


@pytest.fixture(autouse=True)
def _hermetic(monkeypatch: pytest.MonkeyPatch) -> None:
    """No proxy between the client and 127.0.0.1, and no host kernel log in the evidence."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(watchdog, "_kernel_xid", lambda since: [])


@pytest.fixture
def fake() -> Iterator[FakeVllm]:
    server = FakeVllm().start()
    try:
        yield server
    finally:
        server.stop()


SHORT = LoadSpec(questions=6, concurrency=2, max_tokens=4, determinism_prompts=2, determinism_repeats=2)


def test_fake_backed_clean_short_run_passes_every_check(fake: FakeVllm, tmp_path: Path) -> None:
    result = run_load(LoadTarget(base_url=fake.url, label="fake"), SHORT, tmp_path)
    summary = summarise(result, SHORT)
    checks = {c.name: c for c in judge_load(result, summary, batch_invariant=False)}
    assert {n: c.status for n, c in checks.items()} == {
        "engine-progress": Status.PASS,
        "questions": Status.PASS,
        "token-accounting": Status.PASS,
        "determinism-alone": Status.PASS,
        "determinism-under-load": Status.PASS,
        "latency": Status.PASS,
        "fault-statistics": Status.PASS,
    }, {n: c.message for n, c in checks.items()}
    pool = builtin_pool(SHORT.seed, SHORT.questions)
    assert result.model == "fake/tiny-model" and result.stop_reason == "all questions answered"
    assert result.questions == {q.id: True for q in pool}
    assert len(result.records) == sum(len(q.turns) for q in pool) == len(fake.chat_requests)
    assert all(r.ok and r.output_tokens == 4 and r.ttft is not None for r in result.records)
    # the token accounting compared real numbers: 4 tokens per turn plus phase B's 4 x 16 tokens
    deltas = summary["server_counter_deltas"]
    assert deltas["generation_tokens"] == 4 * len(result.records) + 4 * SHORT.determinism_max_tokens
    assert deltas["prompt_tokens"] == summary["tokens"]["prompt"] + result.determinism_tokens[0] > 0
    assert (len(result.determinism_a), len(result.determinism_b)) == (4, 4)
    assert len(fake.completion_requests) == 8
    # each later turn carries the history: the earlier user turns and the answers received
    first = next(q for q in pool if len(q.turns) == 3)
    last_turn = next(b for b in fake.chat_requests if b["messages"][-1]["content"] == first.turns[2])
    assert [m["role"] for m in last_turn["messages"]] == ["user", "assistant", "user", "assistant", "user"]
    assert last_turn["messages"][1]["content"] == "w0 w1 w2 w3 "
    lines = Path(result.files["requests"]).read_text().splitlines()
    assert len(lines) == len(result.records)
    assert Path(result.files["scrapes"]).is_file()


def test_fake_backed_open_loop_run_answers_every_question(fake: FakeVllm, tmp_path: Path) -> None:
    spec = dataclasses.replace(SHORT, questions=4, rate=40.0, determinism_prompts=1, determinism_repeats=1)
    result = run_load(LoadTarget(base_url=fake.url, label="fake"), spec, tmp_path)
    assert result.stop_reason == "all questions answered"
    assert list(result.questions.values()) == [True] * 4
    assert result.config["rate"] == 40.0 and result.config["mode"] == "short"


def test_fake_backed_closed_loop_soak_cycles_the_pool_until_the_duration(fake: FakeVllm, tmp_path: Path) -> None:
    spec = dataclasses.replace(SHORT, questions=2, max_tokens=2, duration_s=0.6, determinism_prompts=1)
    result = run_load(LoadTarget(base_url=fake.url, label="fake"), spec, tmp_path, soak=True)
    assert result.stop_reason == "duration reached"
    assert len(result.questions) > 2 and all(result.questions.values())
    assert any(".r1" in qid for qid in result.questions)
    assert result.config["mode"] == "soak"


def test_fake_backed_open_loop_soak_cycles_the_pool_until_the_duration(fake: FakeVllm, tmp_path: Path) -> None:
    spec = dataclasses.replace(SHORT, questions=2, max_tokens=2, rate=20.0, duration_s=0.8, determinism_prompts=1)
    result = run_load(LoadTarget(base_url=fake.url, label="fake"), spec, tmp_path, soak=True)
    assert len(result.questions) > 2
    assert result.stop_reason == "duration reached"


def test_fake_backed_hung_streams_end_in_engine_stall_api_alive(tmp_path: Path) -> None:
    """Streams stop after one chunk while /health, /v1/models and /metrics answer with frozen counters."""
    spec = LoadSpec(
        questions=4,
        concurrency=2,
        max_tokens=4,
        stall_seconds=1.0,
        scrape_interval_s=0.2,
        chunk_timeout_s=30.0,
        determinism_prompts=1,
        determinism_repeats=1,
    )
    server = FakeVllm(hang=True).start()
    try:
        started = time.monotonic()
        result = run_load(LoadTarget(base_url=server.url, label="fake"), spec, tmp_path)
        elapsed = time.monotonic() - started
    finally:
        server.stop()
    assert elapsed < 10.0  # the stall rule (1 s), not the chunk timeout (30 s), ended the run
    assert [e.type for e in result.events] == [StallVerdict.ENGINE_STALL_API_ALIVE]
    stall = result.events[0]
    assert stall.api == {"health": 200, "models": 200, "metrics": 200}
    assert stall.in_flight == 2 and stall.progress_age_s > 1.0
    assert result.stop_reason.startswith("ENGINE_STALL_API_ALIVE: 2 requests in flight and no engine progress")
    assert result.after is None
    assert result.records and all(r.error_class is ErrorClass.ABORTED for r in result.records)
    assert result.questions and set(result.questions.values()) == {False}  # in flight at the verdict = faulted
    checks = {c.name: c for c in judge_load(result, summarise(result, spec), batch_invariant=False)}
    assert checks["engine-progress"].status is Status.FAIL
    assert checks["questions"].status is Status.FAIL
    assert checks["token-accounting"].status is Status.SKIP


def test_fake_backed_dead_engine_is_engine_dead(tmp_path: Path) -> None:
    spec = dataclasses.replace(SHORT, scrape_interval_s=0.2)
    server = FakeVllm(dead=True).start()
    try:
        result = run_load(LoadTarget(base_url=server.url, label="fake"), spec, tmp_path)
    finally:
        server.stop()
    assert [e.type for e in result.events] == [StallVerdict.ENGINE_DEAD]
    assert result.events[0].api["health"] == 503
    classes = {r.error_class for r in result.records}
    assert ErrorClass.ENGINE_DEAD in classes and classes <= {ErrorClass.ENGINE_DEAD, ErrorClass.ABORTED}
    assert result.stop_reason.startswith("ENGINE_DEAD: requests failed and the probes confirm the server cannot serve")
    checks = {c.name: c for c in judge_load(result, summarise(result, spec), batch_invariant=False)}
    assert checks["engine-progress"].status is Status.FAIL
    assert checks["determinism-alone"].status is Status.INCONCLUSIVE  # every phase-A sample got a 503


def test_fake_backed_run_without_determinism_sends_no_completion(fake: FakeVllm, tmp_path: Path) -> None:
    spec = dataclasses.replace(SHORT, questions=2, determinism_repeats=0)
    result = run_load(LoadTarget(base_url=fake.url, label="fake"), spec, tmp_path)
    assert (result.determinism_a, result.determinism_b, fake.completion_requests) == ([], [], [])
    assert list(result.questions.values()) == [True, True]


def test_fake_backed_cli_load_writes_load_json(
    fake: FakeVllm, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import signal

    from stackproof.cli import main

    handler = signal.getsignal(signal.SIGTERM)
    try:
        argv = ["load", "--url", fake.url, "--questions", "2", "--max-tokens", "3", "--out", str(tmp_path), "--json"]
        assert main(argv) == 0
    finally:
        signal.signal(signal.SIGTERM, handler)
    document = json.loads(capsys.readouterr().out)
    assert document == json.loads((tmp_path / "load.json").read_text())
    assert document["questions"]["clean"] == 2
    assert {c["name"]: c["status"] for c in document["checks"]}["token-accounting"] == "PASS"


# -- issue 16 items 1 and 7: bounded workers, no swallowed worker exception ------------------------


def test_a_huge_concurrency_starts_one_worker_per_question(fake: FakeVllm, tmp_path: Path) -> None:
    import tracemalloc

    spec = dataclasses.replace(SHORT, questions=3, concurrency=300_000, determinism_repeats=0)
    tracemalloc.start()
    try:
        started = time.monotonic()
        result = run_load(LoadTarget(base_url=fake.url, label="fake"), spec, tmp_path)
        seconds = time.monotonic() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.stop_reason == "all questions answered" and list(result.questions.values()) == [True] * 3
    assert peak < 40 * 2**20, f"peak {peak / 2**20:.0f} MiB for 3 questions"  # was ~300 MiB: a task per unit
    assert seconds < 20


def test_a_worker_exception_is_an_error_not_all_questions_answered(
    fake: FakeVllm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from verify.serving.openai import ServerAPI

    real = ServerAPI.stream_chat
    calls = {"n": 0}

    async def flaky(self: ServerAPI, **kwargs: object) -> RequestRecord:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("usage count 'many' is not an integer")
        return await real(self, **kwargs)

    monkeypatch.setattr(ServerAPI, "stream_chat", flaky)
    spec = dataclasses.replace(SHORT, questions=4, concurrency=2, determinism_repeats=0)
    result = run_load(LoadTarget(base_url=fake.url, label="fake"), spec, tmp_path)
    assert result.crashed is not None and "RuntimeError: usage count" in result.crashed
    assert result.stop_reason.startswith("load worker failed") and None in result.questions.values()
    checks = {c.name: c for c in judge_load(result, summarise(result, spec), batch_invariant=False)}
    assert checks["load-workers"].status is Status.ERROR


def test_a_load_run_cannot_outlive_its_budget(fake: FakeVllm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.errors import InfraError
    from verify.load import run as loadrun
    from verify.serving.openai import ServerAPI

    async def never(*args: object, **kwargs: object) -> RequestRecord:
        await asyncio.sleep(3600)  # a stream whose own timeouts failed
        raise AssertionError

    monkeypatch.setattr(ServerAPI, "stream_chat", never)
    monkeypatch.setattr(loadrun, "time_budget", lambda spec: 1.0)
    started = time.monotonic()
    with pytest.raises(InfraError, match="passed its 1s budget"):
        run_load(
            LoadTarget(base_url=fake.url, label="fake"), dataclasses.replace(SHORT, determinism_repeats=0), tmp_path
        )
    assert time.monotonic() - started < 10
