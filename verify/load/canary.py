"""Canary prompts: questions with checkable answers, asked once per server in the load stage.

A stack can serve every request and still answer wrongly (sgl-project/sglang#34895: a dropped FP8
weight scale turned every answer into one repeated phrase). A real model answers "What is 17 + 25?"
with 42; a broken kernel does not. The prompts live in `canaries.jsonl` next to this module (one
JSON object a line: `id`, `prompt`, `check` = exact | regex, `expect`); each is asked greedily with
a bounded `max_tokens`, and the share answered right is scored against the floor the cell declares
(`serve.load.canary_floor` in matrix.yaml). A cell whose model cannot answer (the generated tiny
model) declares no floor, and the check is skipped. Asking (`ask_canaries`) is the HTTP edge;
`score` and `judge_canaries` are pure.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import InputError
from pipeline.guard import boundedio
from pipeline.result import CheckResult, Status
from verify.serving import ServingDriver
from verify.serving.openai import ServerCalls

__all__ = ["CANARIES", "Canary", "CanaryAnswer", "ask_canaries", "judge_canaries", "read_canaries", "score"]

CANARIES = Path(__file__).with_name("canaries.jsonl")
CANARY_LIMIT = 4 * 2**20
CHECKS = ("exact", "regex")
MAX_TOKENS = 24  # every expected answer is a few tokens; a real model that rambles past this fails


@dataclass(frozen=True, kw_only=True)
class Canary:
    id: str
    prompt: str
    check: str  # exact | regex
    expect: str


@dataclass(frozen=True, kw_only=True)
class CanaryAnswer:
    id: str
    content: str | None  # None when the request failed
    finish_reason: str | None = None
    error: str | None = None
    passed: bool = False


def read_canaries(path: Path = CANARIES) -> tuple[Canary, ...]:
    """The canary file, checked line by line (FILE:LINE: message, exit 2 on a bad one)."""
    canaries: list[Canary] = []
    for number, line in enumerate(boundedio.read_text(path, "canary file", limit=CANARY_LIMIT).splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            data = json.loads(line)
        except ValueError as exc:
            raise InputError(f"{where}: not JSON: {exc}") from None
        if not isinstance(data, dict) or set(data) != {"id", "prompt", "check", "expect"}:
            raise InputError(f"{where}: needs exactly the keys id, prompt, check, expect")
        if not all(isinstance(data[k], str) and data[k] for k in data):
            raise InputError(f"{where}: id, prompt, check and expect must be non-empty strings")
        if data["check"] not in CHECKS:
            raise InputError(f"{where}: check: {data['check']!r} is not one of {', '.join(CHECKS)}")
        if data["check"] == "regex":
            try:
                re.compile(data["expect"])
            except re.error as exc:
                raise InputError(f"{where}: expect: not a regular expression: {exc}") from None
        canaries.append(Canary(**data))
    if len({c.id for c in canaries}) != len(canaries):
        raise InputError(f"{path}: canary ids must be unique")
    return tuple(canaries)


def score(canary: Canary, content: str) -> bool:
    """Exact: the stripped answer equals `expect`. Regex: `expect` matches the stripped answer."""
    answer = content.strip()
    if canary.check == "exact":
        return answer == canary.expect
    return re.search(canary.expect, answer) is not None


def ask_canaries(
    base_url: str, model: str, canaries: tuple[Canary, ...], *, timeout: float, driver: ServingDriver
) -> list[CanaryAnswer]:
    """Ask each canary once: chat, temperature 0, MAX_TOKENS, EOS allowed. Never raises for server trouble."""
    answers: list[CanaryAnswer] = []
    with ServerCalls(base_url, driver, timeout=timeout) as calls:
        for canary in canaries:
            body = {
                "model": model,
                "messages": [{"role": "user", "content": canary.prompt}],
                "max_tokens": MAX_TOKENS,
                "temperature": 0,
            }
            answer = calls.chat(body)
            try:
                if not answer.ok:
                    raise ValueError(answer.error)
                choice = answer.body["choices"][0]
                content = choice["message"].get("content") or ""
            except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
                answers.append(CanaryAnswer(id=canary.id, content=None, error=f"{type(exc).__name__}: {exc}"[:300]))
                continue
            answers.append(
                CanaryAnswer(
                    id=canary.id,
                    content=content,
                    finish_reason=choice.get("finish_reason"),
                    passed=score(canary, content),
                )
            )
    return answers


def judge_canaries(floor: float | None, answers: list[CanaryAnswer]) -> CheckResult:
    """PASS when the share answered right reaches the cell's floor; SKIP when the cell declares none."""
    if floor is None:
        return CheckResult(
            name="canary",
            status=Status.SKIP,
            message="the cell declares no canary floor (its model is not expected to answer)",
        )
    right = sum(1 for a in answers if a.passed)
    failed = [a for a in answers if a.error]
    evidence: dict[str, Any] = {
        "floor": floor,
        "right": right,
        "asked": len(answers),
        "answers": [asdict(a) for a in answers],
    }
    if failed and len(failed) == len(answers):
        return CheckResult(
            name="canary",
            status=Status.ERROR,
            message=f"no canary was answered: {failed[0].error}",
            evidence=evidence,
        )
    share = right / len(answers) if answers else 0.0
    wrong = [a.id for a in answers if not a.passed]
    message = f"{right} of {len(answers)} canary answers right ({share:.0%}, floor {floor:.0%})"
    if share < floor:
        return CheckResult(
            name="canary", status=Status.FAIL, message=f"{message}; wrong: {', '.join(wrong)}", evidence=evidence
        )
    return CheckResult(name="canary", status=Status.PASS, message=message, evidence=evidence)
