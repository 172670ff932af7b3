"""Degeneration detectors, their per-cell baseline, and the canaries: fake-backed (tests/unit/fake_openai.py).

Every detector both ways: a fake server whose answers degenerate that way must FAIL against the
baseline of a fake server that answers normally, and the normal server must PASS against it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from pipeline.errors import InputError
from pipeline.matrix.model import Cell, LoadSpec
from pipeline.result import CheckResult, Status
from verify.load import watchdog
from verify.load.baselines import baseline_key, path_of, read_baseline
from verify.load.canary import Canary, CanaryAnswer, ask_canaries, judge_canaries, read_canaries, score
from verify.load.correctness import ask_for_cell, judge_correctness
from verify.load.degeneration import MARGIN, Rates, judge_degeneration, loop_period, measure
from verify.load.outcome import LoadOutcome, LoadTarget
from verify.load.run import run_load
from verify.load.summary import judge_load, summarise
from verify.serving import DRIVERS

from .fake_openai import FakeVllm

VLLM = DRIVERS["vllm"]

SPEC = LoadSpec(questions=6, concurrency=2, max_tokens=12, determinism_prompts=2, determinism_repeats=1)


@pytest.fixture(autouse=True)
def _no_proxy_no_kernel_log(monkeypatch: pytest.MonkeyPatch) -> None:
    _quiet(monkeypatch)


def _quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(watchdog, "_kernel_xid", lambda since: [])


def _run(tmp_path: Path, spec: LoadSpec = SPEC, **fake_knobs: object) -> LoadOutcome:
    out = tmp_path / f"run-{len(list(tmp_path.iterdir()))}"
    with FakeVllm(**fake_knobs) as fake:  # type: ignore[arg-type]
        return run_load(LoadTarget(base_url=fake.url, label="fake"), spec, out)


def _rates(outcome: LoadOutcome, spec: LoadSpec = SPEC) -> Rates:
    return measure(outcome.records, [*outcome.determinism_a, *outcome.determinism_b], eos_allowed=not spec.ignore_eos)


def _statuses(checks: list[CheckResult]) -> dict[str, Status]:
    return {c.name: c.status for c in checks}


# -- the loop detector on text ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "period"),
    [
        (" one city one city one city one city", len(" one city")),
        ("need analysis there need analysis there need analysis there ", len("need analysis there ")),
        ("ne city one city one city one city", len(" one city")),  # a partial unit before the repeats counts
        ("aaaaaaaa", 1),
        ("The capital of France is Paris. It is a large city on the Seine.", None),
        ("w0 w1 w2 w3 w4 w5 w6 w7 ", None),
        ("intro text that is long enough to dominate, then ab ab ab", None),  # the cycle covers < half
        ("", None),
    ],
)
def test_loop_period(text: str, period: int | None) -> None:
    assert loop_period(text) == period


# -- each detector both ways against a fake server ------------------------------------------------------


@pytest.fixture(scope="module")
def normal_baseline(tmp_path_factory: pytest.TempPathFactory) -> Rates:
    """One normal run for the module's detectors (a value: the tests only compare against it)."""
    with pytest.MonkeyPatch.context() as monkeypatch:  # what _no_proxy_no_kernel_log does per test
        _quiet(monkeypatch)
        rates = _rates(_run(tmp_path_factory.mktemp("baseline")))
    assert (rates.loop, rates.empty, rates.collapse) == (0.0, 0.0, 0.0) and rates.answers > 10
    return rates


def test_normal_answers_pass_every_detector_against_their_baseline(tmp_path: Path, normal_baseline: Rates) -> None:
    checks = judge_degeneration(_rates(_run(tmp_path)), normal_baseline, baseline_note="")
    assert _statuses(checks) == {
        "degeneration-loop": Status.PASS,
        "degeneration-empty": Status.PASS,
        "degeneration-length": Status.SKIP,  # ignore_eos: every answer ends at max_tokens by design
        "degeneration-collapse": Status.PASS,
    }, [c.message for c in checks]
    assert "ignore_eos" in checks[2].message


def test_looping_answers_fail_the_loop_detector(tmp_path: Path, normal_baseline: Rates) -> None:
    rates = _rates(_run(tmp_path, pieces=(" one", " city")))
    assert rates.loop == 1.0
    checks = {c.name: c for c in judge_degeneration(rates, normal_baseline, baseline_note="")}
    loop = checks["degeneration-loop"]
    assert loop.status is Status.FAIL and "degenerated" in loop.message
    assert loop.evidence["rate"] == 1.0 and loop.evidence["baseline"] == 0.0 and loop.evidence["margin"] == MARGIN
    assert loop.evidence["examples"][0].startswith(" one city one city")
    assert checks["degeneration-empty"].status is Status.PASS


def test_reasoning_only_answers_fail_the_empty_content_detector(tmp_path: Path, normal_baseline: Rates) -> None:
    """#34895's shape: the text went to reasoning_content and content stayed empty."""
    outcome = _run(tmp_path, reasoning=True)
    assert all(r.reasoning == r.text != "" for r in outcome.records)
    checks = {c.name: c for c in judge_degeneration(_rates(outcome), normal_baseline, baseline_note="")}
    assert checks["degeneration-empty"].status is Status.FAIL
    assert checks["degeneration-empty"].evidence["rate"] == 1.0
    assert checks["degeneration-loop"].status is Status.PASS


def test_every_answer_at_max_tokens_fails_only_when_eos_is_allowed(tmp_path: Path) -> None:
    eos = dataclasses.replace(SPEC, ignore_eos=False)
    baseline = _rates(_run(tmp_path, eos, stop_after=5), eos)  # a model that ends its answers
    assert baseline.length == 0.0
    ok = judge_degeneration(_rates(_run(tmp_path, eos, stop_after=5), eos), baseline, baseline_note="")
    assert _statuses(ok)["degeneration-length"] is Status.PASS
    never_ends = _rates(_run(tmp_path, eos), eos)  # EOS allowed, yet every answer ran to max_tokens
    assert never_ends.length == 1.0
    failed = {c.name: c for c in judge_degeneration(never_ends, baseline, baseline_note="")}
    assert failed["degeneration-length"].status is Status.FAIL
    # A cell whose answers always ran to max_tokens in its baseline (max_tokens too small) cannot tell.
    assert _statuses(judge_degeneration(never_ends, never_ends, baseline_note=""))["degeneration-length"] is Status.PASS


def test_a_collapsed_distribution_fails_the_logprob_detector(tmp_path: Path, normal_baseline: Rates) -> None:
    rates = _rates(_run(tmp_path, gap_nats=30.0))
    assert rates.collapse == 1.0 and rates.positions > 0
    assert (
        _statuses(judge_degeneration(rates, normal_baseline, baseline_note=""))["degeneration-collapse"] is Status.FAIL
    )
    flat = _rates(_run(tmp_path, gap_nats=0.0))  # tied logits
    assert (
        _statuses(judge_degeneration(flat, normal_baseline, baseline_note=""))["degeneration-collapse"] is Status.FAIL
    )


def test_a_rise_within_the_margin_passes() -> None:
    base = Rates(answers=100, positions=100, loop=0.2, empty=0.0, length=None, collapse=0.0, examples={})
    now = dataclasses.replace(base, loop=0.2 + MARGIN - 0.01)
    assert _statuses(judge_degeneration(now, base, baseline_note=""))["degeneration-loop"] is Status.PASS
    worse = dataclasses.replace(base, loop=0.2 + MARGIN + 0.01)
    assert _statuses(judge_degeneration(worse, base, baseline_note=""))["degeneration-loop"] is Status.FAIL


def test_too_few_answers_are_inconclusive() -> None:
    base = Rates(answers=100, positions=100, loop=0.0, empty=0.0, length=None, collapse=0.0, examples={})
    few = dataclasses.replace(base, answers=2, loop=1.0)
    assert _statuses(judge_degeneration(few, base, baseline_note=""))["degeneration-loop"] is Status.INCONCLUSIVE


# -- the baseline: recorded by the first clean run, used by the next ------------------------------------


@pytest.fixture
def cell() -> Cell:
    """The real matrix's cpu-tiny: what a baseline key is built from."""
    from pipeline.matrix.read import load_matrix

    repo = Path(__file__).resolve().parents[2]
    return load_matrix(repo / "matrix.yaml", images_dir=repo / "images").cell("cpu-tiny")


def _judge(cell: Cell, outcome: LoadOutcome, root: Path, spec: LoadSpec = SPEC) -> tuple[list[CheckResult], dict]:  # type: ignore[type-arg]
    load_checks = judge_load(outcome, summarise(outcome, spec), batch_invariant=False)
    return judge_correctness(cell, None, spec, outcome, load_checks, [], source="test-image", cache_root=root)


def test_first_clean_run_records_the_baseline_and_the_next_run_is_judged_against_it(cell: Cell, tmp_path: Path) -> None:
    root = tmp_path / "cache"
    runs = tmp_path / "runs"
    runs.mkdir()
    checks, section = _judge(cell, _run(runs), root)
    assert section["baseline"]["recorded_now"] is True and section["baseline"]["rates"] is None
    assert all(
        c.status is Status.PASS for c in checks if c.name.startswith("degeneration-") and c.evidence["rate"] is not None
    )
    assert "first clean run is recorded as its baseline" in checks[0].message
    key = baseline_key(cell, None, SPEC)
    stored = json.loads(path_of(key, root).read_text())
    assert stored["source"] == "test-image" and stored["key"] == key
    # The next run (a broken build of the same cell) is judged against it, and the baseline stays.
    checks, section = _judge(cell, _run(runs, pieces=(" one", " city")), root)
    assert _statuses(checks)["degeneration-loop"] is Status.FAIL
    assert section["baseline"]["recorded_now"] is False and section["baseline"]["rates"]["loop"] == 0.0
    assert read_baseline(key, root) is not None and read_baseline(key, root).loop == 0.0  # type: ignore[union-attr]


def test_a_run_that_is_not_clean_records_no_baseline(cell: Cell, tmp_path: Path) -> None:
    root = tmp_path / "cache"
    runs = tmp_path / "runs"
    runs.mkdir()
    outcome = _run(runs)
    dirty = [CheckResult(name="questions", status=Status.FAIL, message="1 of 6 questions faulted")]
    checks, section = judge_correctness(cell, None, SPEC, outcome, dirty, [], source="x", cache_root=root)
    assert section["baseline"]["recorded_now"] is False and "not clean (questions)" in checks[0].message
    assert read_baseline(baseline_key(cell, None, SPEC), root) is None


def test_the_baseline_key_follows_the_serve_spec_and_workload_not_the_image(cell: Cell) -> None:
    key = baseline_key(cell, None, SPEC)
    assert key["cell"] == "cpu-tiny" and key["model"]["source"] == "path:/models/tiny-llama"
    assert baseline_key(cell, None, dataclasses.replace(SPEC, max_tokens=64)) != key
    assert baseline_key(cell, None, dataclasses.replace(SPEC, concurrency=5)) == key  # does not shape answers
    assert "image" not in json.dumps(key)


# -- canaries -----------------------------------------------------------------------------------------


def test_the_shipped_canaries_read_and_each_checker_accepts_its_own_answer() -> None:
    canaries = read_canaries()
    assert len(canaries) >= 6 and {c.check for c in canaries} == {"exact", "regex"}
    right = {"add-two-digit": "42", "echo-ok": "OK", "capital-france": "Paris.", "primes-csv": "2,3,5"}
    for canary in canaries:
        if canary.id in right:
            assert score(canary, right[canary.id]), canary
    wrong = {"add-two-digit": "43", "echo-ok": "OK!", "capital-france": "Lyon", "primes-csv": "2, 3, 5, 7"}
    for canary in canaries:
        if canary.id in wrong:
            assert not score(canary, wrong[canary.id]), canary


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "canaries.jsonl:2: not JSON"),
        ('{"id": "a", "prompt": "p", "check": "exact"}', "canaries.jsonl:2: needs exactly the keys"),
        (
            '{"id": "a", "prompt": "p", "check": "fuzzy", "expect": "x"}',
            "canaries.jsonl:2: check: 'fuzzy' is not one of",
        ),
        ('{"id": "a", "prompt": "p", "check": "regex", "expect": "("}', "canaries.jsonl:2: expect: not a regular"),
    ],
)
def test_a_bad_canary_line_is_located(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "canaries.jsonl"
    path.write_text('{"id": "ok", "prompt": "p", "check": "exact", "expect": "x"}\n' + line + "\n")
    with pytest.raises(InputError, match=message.replace("(", r"\(")):
        read_canaries(path)
    assert InputError.exit_code == 2


def _canaries() -> tuple[Canary, ...]:
    return (
        Canary(id="sum", prompt="What is 17 + 25?", check="regex", expect=r"^\D*42\D*$"),
        Canary(id="ok", prompt="Say OK", check="exact", expect="OK"),
    )


def test_canaries_against_the_fake_server_both_ways() -> None:
    with FakeVllm(answers={"What is 17 + 25?": "42", "Say OK": "OK"}) as fake:
        good = ask_canaries(fake.url, "fake/tiny-model", _canaries(), timeout=5, driver=VLLM)
    assert [a.passed for a in good] == [True, True]
    assert judge_canaries(1.0, good).status is Status.PASS
    with FakeVllm(answers={"What is 17 + 25?": " one city one city"}) as fake:
        bad = ask_canaries(fake.url, "fake/tiny-model", _canaries(), timeout=5, driver=VLLM)
    result = judge_canaries(0.5, bad)
    assert result.status is Status.FAIL and "0 of 2" in result.message and "wrong: sum, ok" in result.message
    assert result.evidence["answers"][0]["content"] == " one city one city"


def test_the_floor_is_the_share_that_must_be_right() -> None:
    half = [CanaryAnswer(id="a", content="42", passed=True), CanaryAnswer(id="b", content="x", passed=False)]
    assert judge_canaries(0.5, half).status is Status.PASS
    assert judge_canaries(0.75, half).status is Status.FAIL


def test_no_floor_skips_and_asks_nothing(tmp_path: Path) -> None:
    with FakeVllm() as fake:
        outcome = run_load(LoadTarget(base_url=fake.url, label="fake"), SPEC, tmp_path)
        asked_before = len(fake.chat_requests)
        assert ask_for_cell(fake.url, outcome, SPEC, driver=VLLM) == []
        assert len(fake.chat_requests) == asked_before
    assert judge_canaries(None, []).status is Status.SKIP


def test_unanswered_canaries_are_an_error_not_a_score() -> None:
    answers = ask_canaries("http://127.0.0.1:9", "m", _canaries(), timeout=1, driver=VLLM)
    assert all(a.error for a in answers)
    assert judge_canaries(0.5, answers).status is Status.ERROR


def test_the_summary_line_shows_rates_beside_the_baseline_and_the_canary_score() -> None:
    from pipeline.receiptrender import _correctness_line

    section = {
        "rates": {"loop": 1.0, "empty": 0.0, "length": None, "collapse": 1.0},
        "baseline": {"rates": {"loop": 0.22, "empty": 0.0, "collapse": 0.0}, "recorded_now": False},
        "canary": {"floor": 0.75, "right": 2, "asked": 8},
    }
    line = _correctness_line(section)
    assert "loop 100% (baseline 22%)" in line and "collapse 100% (baseline 0%)" in line
    assert "length" not in line and "canary 2/8 right (floor 75%)" in line
    first = {**section, "baseline": {"rates": None, "recorded_now": True}, "canary": {"floor": None}}
    assert _correctness_line(first).endswith("(baseline recorded by this run)")
