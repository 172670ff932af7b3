"""Greedy samples across two runs: do two cells or arms give the same tokens for the same prompts?

Every load run keeps, per determinism prompt, its first greedy answer alone on the server (token
ids and the top-1/top-2 logprob gap at each position) in `greedy.json` beside `load.json`.
`stackproof compare RUN_A RUN_B` reads two of them offline: token agreement, the first divergence,
and the gap there on both sides. Across dtypes or kernels a flip where the model hesitated (both
gaps at most `NEAR_TIE_NATS`, the determinism stage's `SUSPECT_GAP_NATS`) is a near-tie and
expected; a flip where either side was confident is flagged as corruption (an FP8 cell against its
BF16 arm, a fix cell against the release cell). Reading and writing the file is the edge;
`compare_runs` is pure.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import InputError
from pipeline.guard.jsonfile import read_json
from pipeline.receipt import Receipt
from verify.load.determinism import PROMPTS, SUSPECT_GAP_NATS, Sample

__all__ = [
    "GREEDY_FILE",
    "Comparison",
    "GreedyRun",
    "PromptComparison",
    "compare_runs",
    "find_greedy",
    "read_greedy",
    "render_table",
    "write_greedy",
]

GREEDY_FILE = "greedy.json"
KIND = "stackproof.greedy-samples"
SCHEMA_VERSION = 1
NEAR_TIE_NATS = SUSPECT_GAP_NATS


@dataclass(frozen=True, kw_only=True)
class GreedyPrompt:
    index: int
    prompt: str
    tokens: tuple[str, ...]
    top2_gaps: tuple[float | None, ...]


@dataclass(frozen=True, kw_only=True)
class GreedyRun:
    source: str  # the file it was read from
    model: str
    max_tokens: int
    label: str  # cell/arm, as the run named it
    prompts: tuple[GreedyPrompt, ...]


@dataclass(frozen=True, kw_only=True)
class PromptComparison:
    index: int
    prompt: str
    length_a: int
    length_b: int
    agreement: float  # positions with the same token / the longer answer's length
    divergence: int | None  # first position where the tokens differ; None: identical
    token_a: str | None
    token_b: str | None
    gap_a: float | None  # top-1/top-2 gap there, in each run
    gap_b: float | None
    verdict: str  # agree | near-tie | corruption


@dataclass(frozen=True, kw_only=True)
class Comparison:
    a: str
    b: str
    near_tie_nats: float
    prompts: tuple[PromptComparison, ...]

    @property
    def corrupted(self) -> bool:
        return any(p.verdict == "corruption" for p in self.prompts)

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "near_tie_nats": self.near_tie_nats,
            "corruption": self.corrupted,
            "agreement": _mean([p.agreement for p in self.prompts]),
            "prompts": [asdict(p) for p in self.prompts],
        }


def write_greedy(path: Path, *, model: str, max_tokens: int, label: str, samples: list[Sample]) -> Path:
    """Each prompt's first good sample, as compare reads it."""
    first: dict[int, Sample] = {}
    for sample in samples:
        if not sample.error:
            first.setdefault(sample.prompt, sample)
    document = {
        "kind": KIND,
        "schema_version": SCHEMA_VERSION,
        "model": model,
        "max_tokens": max_tokens,
        "label": label,
        "prompts": [
            {
                "index": i,
                "prompt": PROMPTS[i % len(PROMPTS)],
                "tokens": list(s.tokens),
                "top2_gaps": list(s.top2_gaps),
            }
            for i, s in sorted(first.items())
        ],
    }
    path.write_text(json.dumps(document, indent=2, allow_nan=False) + "\n")
    return path


def find_greedy(run: Path) -> Path:
    """The greedy samples of RUN: the file itself, a load or soak-slice directory, a run directory,
    or a receipt (its load stage's artifacts). InputError, naming RUN, when there are none."""
    if run.is_file():
        if run.name == GREEDY_FILE:
            return run
        try:
            stages = Receipt.parse(_json(run), source=str(run)).stages
        except InputError:  # not a receipt this tool reads: look beside it
            stages = ()
        for stage in stages:
            named = stage.artifacts.get("greedy") if stage.stage == "load" else None
            if named and Path(named).is_file():
                return Path(named)
        candidates = [run.parent / "load" / GREEDY_FILE]
    elif run.is_dir():
        candidates = [run / GREEDY_FILE, run / "load" / GREEDY_FILE]
    else:
        raise InputError(f"{run}: no such run directory or file")
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise InputError(
        f"{run}: no greedy samples ({GREEDY_FILE}); a run of the load stage writes them "
        "(stackproof run, or verify with the load stage)"
    )


def read_greedy(path: Path) -> GreedyRun:
    data = _json(path)
    if data.get("kind") != KIND or data.get("schema_version") != SCHEMA_VERSION:
        raise InputError(f"{path}: not a {KIND} file of schema_version {SCHEMA_VERSION}")
    try:
        prompts = tuple(_prompt(p, f"{path}: prompts[{i}]") for i, p in enumerate(data["prompts"]))
        seen: dict[int, int] = {}
        for i, prompt in enumerate(prompts):
            if prompt.index in seen:  # a second answer of one prompt could hide the first's divergence
                raise InputError(f"{path}: prompts[{i}].index: {prompt.index} again (prompts[{seen[prompt.index]}])")
            seen[prompt.index] = i
        return GreedyRun(
            source=str(path),
            model=str(data["model"]),
            max_tokens=int(data["max_tokens"]),
            label=str(data.get("label") or path.parent),
            prompts=prompts,
        )
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise InputError(f"{path}: malformed greedy samples: {type(exc).__name__}: {exc}") from None


def _prompt(item: Any, where: str) -> GreedyPrompt:
    if not isinstance(item, dict):
        raise InputError(f"{where}: not an object")
    gaps = item["top2_gaps"]
    if not isinstance(gaps, list) or not isinstance(item["tokens"], list):
        raise InputError(f"{where}: tokens and top2_gaps must be lists")
    for j, gap in enumerate(gaps):
        # A top-1/top-2 logprob gap is a finite number >= 0: a NaN compares false with every bound
        # and a negative one is below every bound, so either would make any divergence a "near-tie".
        if gap is not None and (
            isinstance(gap, bool) or not isinstance(gap, int | float) or not math.isfinite(gap) or gap < 0
        ):
            raise InputError(f"{where}.top2_gaps[{j}]: {gap!r}: a logprob gap is a finite number >= 0, or null")
    index = item["index"]
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise InputError(f"{where}.index: {str(index)[:40]!r}: a prompt index is an integer >= 0")
    return GreedyPrompt(
        index=index,
        prompt=str(item["prompt"]),
        tokens=tuple(str(t) for t in item["tokens"]),
        top2_gaps=tuple(None if g is None else float(g) for g in gaps),
    )


def compare_runs(a: GreedyRun, b: GreedyRun, *, near_tie_nats: float = NEAR_TIE_NATS) -> Comparison:
    """Prompt by prompt; InputError when the two runs did not ask the same prompts the same way."""
    if a.max_tokens != b.max_tokens:
        raise InputError(f"{b.source}: max_tokens {b.max_tokens} differs from {a.source}'s {a.max_tokens}")
    prompts_a = {p.index: p for p in a.prompts}
    prompts_b = {p.index: p for p in b.prompts}
    if not prompts_a or set(prompts_a) != set(prompts_b):
        raise InputError(
            f"{b.source}: prompts {sorted(prompts_b)} differ from {a.source}'s {sorted(prompts_a)}; "
            "compare runs of the same determinism prompts"
        )
    for index, pa in prompts_a.items():
        if pa.prompt != prompts_b[index].prompt:
            raise InputError(f"{b.source}: prompt {index} is {prompts_b[index].prompt!r}, not {pa.prompt!r}")
    rows = tuple(_one(prompts_a[i], prompts_b[i], near_tie_nats) for i in sorted(prompts_a))
    return Comparison(a=a.source, b=b.source, near_tie_nats=near_tie_nats, prompts=rows)


def render_table(comparison: Comparison) -> str:
    lines = [
        f"A: {comparison.a}",
        f"B: {comparison.b}",
        "",
        f"{'prompt':<8}{'agree':>7}  {'diverges':>8}  {'A token':<14}{'B token':<14}{'gap A':>7}{'gap B':>7}  verdict",
    ]
    for p in comparison.prompts:
        at = "-" if p.divergence is None else str(p.divergence)
        lines.append(
            f"{p.index:<8}{p.agreement:>7.0%}  {at:>8}  {_short(p.token_a):<14}{_short(p.token_b):<14}"
            f"{_nats(p.gap_a):>7}{_nats(p.gap_b):>7}  {p.verdict}"
        )
    flagged = [p.index for p in comparison.prompts if p.verdict == "corruption"]
    lines.append("")
    if flagged:
        lines.append(
            f"corruption: prompt(s) {', '.join(map(str, flagged))} diverge where a run was confident "
            f"(gap > {comparison.near_tie_nats:g} nats)"
        )
    elif any(p.divergence is not None for p in comparison.prompts):
        lines.append(f"near-ties only: every divergence is at a gap of at most {comparison.near_tie_nats:g} nats")
    else:
        lines.append("the two runs agree on every token")
    return "\n".join(lines)


def _one(a: GreedyPrompt, b: GreedyPrompt, near_tie: float) -> PromptComparison:
    longest = max(len(a.tokens), len(b.tokens))
    same = sum(1 for x, y in zip(a.tokens, b.tokens, strict=False) if x == y)
    divergence = None
    if a.tokens != b.tokens:
        divergence = next(
            (i for i, (x, y) in enumerate(zip(a.tokens, b.tokens, strict=False)) if x != y),
            min(len(a.tokens), len(b.tokens)),
        )
    gap_a = _gap(_at(a.top2_gaps, divergence))
    gap_b = _gap(_at(b.top2_gaps, divergence))
    if divergence is None:
        verdict = "agree"
    elif any(g is not None and g > near_tie for g in (gap_a, gap_b)):
        verdict = "corruption"
    elif gap_a is None and gap_b is None:
        verdict = "corruption"  # a length difference, or no logprobs: nothing says it was a near-tie
    else:
        verdict = "near-tie"
    return PromptComparison(
        index=a.index,
        prompt=a.prompt,
        length_a=len(a.tokens),
        length_b=len(b.tokens),
        agreement=same / longest if longest else 1.0,
        divergence=divergence,
        token_a=_at(a.tokens, divergence),
        token_b=_at(b.tokens, divergence),
        gap_a=gap_a,
        gap_b=gap_b,
        verdict=verdict,
    )


def _gap(value: float | None) -> float | None:
    """A gap the verdict may trust: finite and >= 0; anything else says nothing (never a near-tie)."""
    return value if value is not None and math.isfinite(value) and value >= 0 else None


def _at(values: tuple[Any, ...], index: int | None) -> Any:
    return values[index] if index is not None and index < len(values) else None


def _json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = read_json(path, "greedy samples or receipt", strict=True)
    return data


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _short(token: str | None) -> str:
    return "-" if token is None else token.removeprefix("token_id:")[:12]


def _nats(gap: float | None) -> str:
    return "-" if gap is None else f"{gap:.2f}"
