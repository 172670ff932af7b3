"""What the load stage sends: the seeded built-in pool, the questions file and its located errors, arrivals."""

from __future__ import annotations

import json
import statistics
from itertools import islice
from pathlib import Path

import pytest

from pipeline.errors import InputError
from verify.load.workload import Question, arrival_gaps, builtin_pool, cycle, read_questions

# -- the built-in pool ------------------------------------------------------------------------------


def test_builtin_pool_is_the_same_for_the_same_seed() -> None:
    first, again = builtin_pool(7, 40), builtin_pool(7, 40)
    assert first == again
    assert [q.id for q in first[:3]] == ["q7-00000", "q7-00001", "q7-00002"]
    assert len({q.id for q in first}) == 40


def test_builtin_pool_differs_for_another_seed() -> None:
    a, b = builtin_pool(1, 40), builtin_pool(2, 40)
    assert [q.turns for q in a] != [q.turns for q in b]
    assert {q.id for q in a}.isdisjoint(q.id for q in b)  # arms with different seeds never share an id


def test_builtin_pool_questions_have_two_or_three_distinct_turns() -> None:
    pool = builtin_pool(0, 200)
    assert len(pool) == 200
    assert all(isinstance(q, Question) for q in pool)
    assert {len(q.turns) for q in pool} == {2, 3}
    for q in pool:
        assert all(t.strip() for t in q.turns)
        assert len(set(q.turns)) == len(q.turns)  # follow-ups are drawn without replacement


def test_builtin_pool_prefix_does_not_depend_on_count() -> None:
    """A longer run sends the same first questions as a shorter one with the same seed."""
    assert builtin_pool(3, 100)[:10] == builtin_pool(3, 10)


# -- the questions file -----------------------------------------------------------------------------


def _write(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "questions.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_read_questions_happy_path(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        json.dumps({"id": "tea", "turns": ["How do I make tea?", "And green tea?"]}),
        "",
        "   ",
        json.dumps({"turns": ["What is 2+2?", "And 3+3?", "And 4+4?"]}),
    )
    assert read_questions(path) == (
        Question(id="tea", turns=("How do I make tea?", "And green tea?")),
        Question(id="line4", turns=("What is 2+2?", "And 3+3?", "And 4+4?")),  # no id: named by its line
    )


GOOD = json.dumps({"id": "ok", "turns": ["a", "b"]})


@pytest.mark.parametrize(
    ("bad_line", "expected"),
    [
        ('{"id": "x", "turns": ["a", "b"]', ": not JSON: "),
        (json.dumps({"id": "x", "turns": ["only one"]}), ": turns: a question has 2-3 turns, got 1"),
        (json.dumps({"id": "x", "turns": ["a", "b", "c", "d"]}), ": turns: a question has 2-3 turns, got 4"),
        (json.dumps({"id": "x", "turns": ["a", "b"], "text": "?"}), ": text: unknown field (fields: id, turns)"),
        (json.dumps({"id": "ok", "turns": ["c", "d"]}), ": id: 'ok' appears twice"),
        (json.dumps({"id": "x", "turns": ["a", "  "]}), ": turns: must be a list of non-empty strings"),
        (json.dumps({"id": "x", "turns": "a b"}), ": turns: must be a list of non-empty strings"),
        (json.dumps({"id": 5, "turns": ["a", "b"]}), ": id: must be a non-empty string"),
        (json.dumps(["a", "b"]), ": must be an object like"),
    ],
    ids=[
        "bad-json",
        "one-turn",
        "four-turns",
        "unknown-field",
        "duplicate-id",
        "blank-turn",
        "turns-str",
        "id-int",
        "list",
    ],
)
def test_read_questions_errors_name_file_line_and_field(tmp_path: Path, bad_line: str, expected: str) -> None:
    path = _write(tmp_path, GOOD, "", bad_line)  # the bad line is line 3 (blank lines count)
    with pytest.raises(InputError) as info:
        read_questions(path)
    assert str(info.value).startswith(f"{path}:3{expected}")


def test_read_questions_empty_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "", "  ")
    with pytest.raises(InputError, match="no questions in the file") as info:
        read_questions(path)
    assert str(info.value).startswith(f"{path}: ")


def test_read_questions_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.jsonl"
    with pytest.raises(InputError) as info:
        read_questions(path)
    assert str(info.value).startswith(f"{path}: cannot read the questions file: ")


# -- arrivals and cycling ---------------------------------------------------------------------------


@pytest.mark.parametrize(("count", "rate", "burstiness"), [(100, 2.0, 1.0), (37, 0.25, 0.4), (5, 10.0, 3.0)])
def test_arrival_gaps_span_count_over_rate(count: int, rate: float, burstiness: float) -> None:
    gaps = arrival_gaps(count, rate=rate, burstiness=burstiness, seed=11)
    assert len(gaps) == count
    assert all(g >= 0 for g in gaps)
    assert sum(gaps) == pytest.approx(count / rate)


def test_arrival_gaps_are_seeded() -> None:
    assert arrival_gaps(50, rate=1.0, burstiness=1.0, seed=3) == arrival_gaps(50, rate=1.0, burstiness=1.0, seed=3)
    assert arrival_gaps(50, rate=1.0, burstiness=1.0, seed=3) != arrival_gaps(50, rate=1.0, burstiness=1.0, seed=4)


def test_lower_burstiness_is_burstier() -> None:
    """Same mean gap (count/rate is fixed); a gamma shape below 1 spreads the gaps more than Poisson."""
    poisson = arrival_gaps(4000, rate=2.0, burstiness=1.0, seed=5)
    bursty = arrival_gaps(4000, rate=2.0, burstiness=0.3, seed=5)
    assert statistics.fmean(poisson) == pytest.approx(statistics.fmean(bursty))
    assert statistics.variance(bursty) > 2 * statistics.variance(poisson)


@pytest.mark.parametrize(("rate", "burstiness"), [(0.0, 1.0), (-1.0, 1.0), (1.0, 0.0)])
def test_arrival_gaps_reject_non_positive_parameters(rate: float, burstiness: float) -> None:
    with pytest.raises(InputError, match="rate and burstiness must be positive"):
        arrival_gaps(10, rate=rate, burstiness=burstiness, seed=0)


def test_cycle_repeats_the_pool_with_new_ids_on_each_pass() -> None:
    pool = builtin_pool(0, 3)
    seen = list(islice(cycle(pool), 9))
    assert seen[:3] == list(pool)  # the first pass is the pool itself
    assert [q.id for q in seen[3:6]] == [f"{q.id}.r1" for q in pool]
    assert [q.id for q in seen[6:]] == [f"{q.id}.r2" for q in pool]
    assert [q.turns for q in seen] == [q.turns for q in pool] * 3
    assert len({q.id for q in seen}) == 9
