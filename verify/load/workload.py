"""What the load stage sends: questions of 2-3 chat turns, and when they start.

A question is the unit a user experiences (a short conversation); its turns are sent one after
another with the history so far, so a fault anywhere in it spoils the question. Questions come
from a JSONL file or from a built-in pool generated from a seed, so two runs (or two arms) send
exactly the same words. Nothing here does I/O beyond reading the questions file.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import InputError
from pipeline.guard.boundedio import read_bytes

__all__ = ["Question", "arrival_gaps", "builtin_pool", "read_questions"]

MIN_TURNS, MAX_TURNS = 2, 3


@dataclass(frozen=True, kw_only=True)
class Question:
    id: str
    turns: tuple[str, ...]  # the user's messages; each is sent with every earlier turn and answer


_TOPICS = (
    "the boiling point of water at altitude",
    "how a bicycle gear ratio works",
    "why the sky looks blue",
    "how bread rises",
    "what a prime number is",
    "how tides follow the moon",
    "why ice floats",
    "how a compass finds north",
    "what makes a rainbow",
    "how bees make honey",
    "why leaves change colour",
    "how a lever multiplies force",
)
_OPENERS = ("Explain {t} in two sentences.", "Give me a short summary of {t}.", "What should a child know about {t}?")
_FOLLOW_UPS = (
    "Now say it more simply.",
    "Give one everyday example.",
    "What is a common misconception about it?",
    "Summarise that in one line.",
    "Why does that matter?",
)


def builtin_pool(seed: int, count: int) -> tuple[Question, ...]:
    """`count` questions of 2-3 turns, the same for the same seed on every machine."""
    rng = random.Random(seed)
    questions = []
    for i in range(count):
        topic = rng.choice(_TOPICS)
        turns = [rng.choice(_OPENERS).format(t=topic)]
        turns += rng.sample(_FOLLOW_UPS, rng.randint(MIN_TURNS, MAX_TURNS) - 1)
        questions.append(Question(id=f"q{seed}-{i:05d}", turns=tuple(turns)))
    return tuple(questions)


MAX_QUESTIONS_BYTES = 64 * 2**20  # a soak's questions are a few MB


def read_questions(path: Path) -> tuple[Question, ...]:
    """A JSONL file, one `{"id": "...", "turns": ["...", "..."]}` per line; errors name file and line."""
    data = read_bytes(path, "questions file", limit=MAX_QUESTIONS_BYTES)
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        at = data[: exc.start].count(b"\n") + 1
        raise InputError(f"{path}:{at}: the questions file is not UTF-8 text") from None
    questions: list[Question] = []
    seen: set[str] = set()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{where}: not JSON: {exc.msg}") from exc
        except RecursionError:
            raise InputError(f"{where}: nested too deeply to read") from None
        if not isinstance(item, dict):
            raise InputError(f'{where}: must be an object like {{"id": "q1", "turns": ["...", "..."]}}')
        unknown = set(item) - {"id", "turns"}
        if unknown:
            raise InputError(f"{where}: {sorted(unknown)[0][:80]}: unknown field (fields: id, turns)")
        turns = item.get("turns")
        if not isinstance(turns, list) or not all(isinstance(t, str) and t.strip() for t in turns):
            raise InputError(f"{where}: turns: must be a list of non-empty strings")
        if not MIN_TURNS <= len(turns) <= MAX_TURNS:
            raise InputError(f"{where}: turns: a question has {MIN_TURNS}-{MAX_TURNS} turns, got {len(turns)}")
        qid = item.get("id", f"line{number}")
        if not isinstance(qid, str) or not qid:
            raise InputError(f"{where}: id: must be a non-empty string")
        if qid in seen:
            raise InputError(f"{where}: id: {qid!r} appears twice")
        seen.add(qid)
        questions.append(Question(id=qid, turns=tuple(turns)))
    if not questions:
        raise InputError(f"{path}: no questions in the file")
    return tuple(questions)


def cycle(questions: tuple[Question, ...]) -> Iterator[Question]:
    """The questions in order, again and again (a soak outlasts any pool), each pass with new ids."""
    round_no = 0
    while True:
        for q in questions:
            yield q if round_no == 0 else Question(id=f"{q.id}.r{round_no}", turns=q.turns)
        round_no += 1


def arrival_gaps(count: int, *, rate: float, burstiness: float, seed: int) -> list[float]:
    """Seconds between question starts for an open-loop run, as `vllm bench serve` draws them.

    Gamma-distributed with shape `burstiness` and scale 1/(rate * burstiness): burstiness 1 is a
    Poisson process, below 1 burstier. The gaps are rescaled so `count` starts span count/rate.
    """
    if rate <= 0 or burstiness <= 0:
        raise InputError("rate and burstiness must be positive")
    rng = random.Random(seed)
    gaps = [rng.gammavariate(burstiness, 1.0 / (rate * burstiness)) for _ in range(count)]
    total = sum(gaps)
    return [g * (count / rate) / total for g in gaps] if total > 0 else gaps
