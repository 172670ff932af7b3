"""The audit's checks: pure functions from (rules, variables, kernels, package indexes) to findings.

Can a rule match text a package prints? A message is literal text with typed holes (index.py).
For a rule's regex R and a message M, the check fills M's holes and asks `R.search(filled)`:
- candidates: messages whose literal text shares a word (4+ characters) with R's literal text,
  most shared words first;
- fillers, per hole type: `num` holes get numbers; `name` holes (`X.__name__`) get only the
  classes the enclosing function can name (directly, through a module-level list such as
  `_POSSIBLE_FP8_KERNELS`, or as a subclass of one), ranked by how much of R they share;
  `free` holes get `x`, `0`, `/tmp/x`, the empty string and each word of R's own sample strings;
- tried: every hole at its plain filler, each hole alone with each of its fillers, every hole at
  the same filler, and all pairs for a two-hole message;
- a match counts only if it covers literal text of M (a filler alone proves nothing).
A match is reported with the package, version, file and line of M. Limits: fillers are single
words, so a hole that must hold several words for R to match is not found (an ERROR that a person
must look at, never a silent pass); a `free` hole may in reality never hold the filler that made R
match (the check says "can match", not "will"); text built only at runtime is not seen.
"""

from __future__ import annotations

import difflib
import itertools
import re
import re._constants as sre_c  # type: ignore[import-not-found]
import re._parser as sre_parse  # type: ignore[import-not-found]
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from typing import Any

from verify.audit.index import Hole, Message, PackageIndex

__all__ = [
    "Evidence",
    "Finding",
    "Status",
    "capability_findings",
    "check_kernel",
    "check_pattern",
    "check_variable",
    "kernel_literals",
]

ARCH_CAPABILITY = {"sm80": 80, "sm86": 86, "sm89": 89, "sm90": 90, "sm100": 100, "sm103": 103, "sm110": 110}
ARCH_CAPABILITY |= {"sm120": 120, "sm121": 121}
_FREE = ("x", "0", "", "/tmp/x", "1.0")
_NUM = ("0", "1", "12", "1.5", "100")
_WORD = re.compile(r"\w{4,}")
_KERNEL = re.compile(r"(?<!\w)(\w+Kernel)(?!\w)")


class Status(StrEnum):
    OK = "ok"
    ERROR = "ERROR"
    WARN = "WARN"
    EXTERNAL = "external"  # text from outside the packages: listed, not checked
    NOT_CHECKABLE = "not-checkable"  # its package could not be read
    NOT_APPLICABLE = "not-applicable"  # applies_to or its package excludes this stack


@dataclass(frozen=True, kw_only=True)
class Evidence:
    package: str
    version: str
    file: str
    line: int
    text: str = ""

    def __str__(self) -> str:
        return f"{self.package}=={self.version} {self.file}:{self.line}"


@dataclass(frozen=True, kw_only=True)
class Finding:
    kind: str  # rule | signature | variable | kernel | capability | package
    subject: str
    where: str  # the rule's or variable's origin: cell X, arm Y, logrules.yaml SET, signatures.yaml
    status: Status
    message: str = ""
    evidence: tuple[Evidence, ...] = ()
    rule: tuple[str, ...] = ()  # a log rule's (id, kind, pattern): what `matrix audit --fix` rewrites
    closest: Evidence | None = None  # a stale rule's nearest current text in its owning package
    suggestion: str = ""  # that text as a rule, proven to match it (empty: none could be written)


# -- rules -----------------------------------------------------------------------------------------


def check_pattern(pattern: str, indexes: Sequence[PackageIndex]) -> Evidence | None:
    """Evidence of a message in `indexes` that `pattern` can match, or None."""
    regex = re.compile(pattern)
    plan = _plan(pattern)
    for index in indexes:
        for message in _candidates(index, plan.words):
            if _can_match(regex, message, plan, index, indexes):
                return Evidence(
                    package=index.name,
                    version=index.version,
                    file=message.file,
                    line=message.line,
                    text=message.render(),
                )
    return None


@dataclass(frozen=True)
class _Plan:
    words: tuple[str, ...]  # 4+ character words of the pattern's literal runs
    tokens: tuple[str, ...]  # single-word fillers from the pattern's sample strings
    fragments: tuple[str, ...]  # all literal fragments (3+), for ranking class names
    samples: tuple[str, ...] = ()  # strings the pattern matches


@cache
def _plan(pattern: str) -> _Plan:
    try:
        parsed = list(sre_parse.parse(pattern))
    except re.error:
        return _Plan((), (), (), ())
    runs = _literal_runs(parsed)
    words = tuple(dict.fromkeys(w for run in runs for w in _WORD.findall(run)))
    tokens: list[str] = []
    samples = _samples(parsed)
    for sample in samples:
        tokens += sample.split() + re.findall(r"\w+", sample)
    fragments = tuple(dict.fromkeys(w for run in runs for w in re.findall(r"\w{3,}", run)))
    return _Plan(words, tuple(dict.fromkeys(t for t in tokens if t)), fragments, tuple(samples))


def _literal_runs(items: list[tuple[Any, Any]]) -> list[str]:
    runs, run = [], ""
    for op, av in items:
        if op is sre_c.LITERAL:
            run += chr(av)
            continue
        runs.append(run)
        run = ""
        if op is sre_c.SUBPATTERN:
            runs += _literal_runs(list(av[-1]))
        elif op is sre_c.BRANCH:
            for branch in av[1]:
                runs += _literal_runs(list(branch))
        elif op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT) and av[0] >= 1:
            runs += _literal_runs(list(av[2]))
    runs.append(run)
    return [r for r in runs if r]


def _samples(items: list[tuple[Any, Any]], limit: int = 8) -> list[str]:
    """A few strings the parsed pattern matches (shortest repetitions; one per top-level branch)."""
    if len(items) == 1 and items[0][0] is sre_c.BRANCH:
        out: list[str] = []
        for branch in items[0][1][1][:limit]:
            out += _samples(list(branch), 1)
        return out
    return [_sample(items)]


def _sample(items: Iterable[tuple[Any, Any]]) -> str:
    out = []
    for op, av in items:
        if op is sre_c.LITERAL:
            out.append(chr(av))
        elif op is sre_c.ANY:
            out.append("x")
        elif op is sre_c.NOT_LITERAL:
            out.append("x" if chr(av) != "x" else "y")
        elif op is sre_c.IN:
            out.append(_in_sample(av))
        elif op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT):
            out.append(_sample(av[2]) * av[0])
        elif op is sre_c.SUBPATTERN:
            out.append(_sample(av[-1]))
        elif op is sre_c.BRANCH:
            out.append(_sample(av[1][0]))
        elif op is sre_c.CATEGORY:
            out.append(_category(av))
    return "".join(out)


def _in_sample(av: list[tuple[Any, Any]]) -> str:
    negate = any(op is sre_c.NEGATE for op, _ in av)
    if negate:
        for c in "x0a/ ":
            if not re.fullmatch(_set_regex(av), c):
                continue
            return c
        return "x"
    for op, value in av:
        if op is sre_c.LITERAL:
            return chr(value)
        if op is sre_c.RANGE:
            return chr(value[0])
        if op is sre_c.CATEGORY:
            return _category(value)
    return "x"


def _set_regex(av: list[tuple[Any, Any]]) -> str:
    # Rebuild the class from its parsed form only to test candidate characters against it.
    parts: list[str] = []
    for op, value in av:
        if op is sre_c.NEGATE:
            parts.insert(0, "^")
        elif op is sre_c.LITERAL:
            parts.append(re.escape(chr(value)))
        elif op is sre_c.RANGE:
            parts.append(f"{re.escape(chr(value[0]))}-{re.escape(chr(value[1]))}")
        elif op is sre_c.CATEGORY:
            parts.append({"CATEGORY_DIGIT": r"\d", "CATEGORY_SPACE": r"\s", "CATEGORY_WORD": r"\w"}.get(str(value), ""))
    return "[" + "".join(parts) + "]"


def _category(value: Any) -> str:
    return {"CATEGORY_DIGIT": "0", "CATEGORY_SPACE": " ", "CATEGORY_WORD": "a", "CATEGORY_NOT_SPACE": "x"}.get(
        str(value), "x"
    )


_WORDS: dict[str, dict[str, list[int]]] = {}


def _candidates(index: PackageIndex, words: tuple[str, ...]) -> list[Message]:
    if not words:
        return list(index.messages)
    table = _WORDS.get(index.sha256 + index.wheel)
    if table is None:
        table = {}
        for i, message in enumerate(index.messages):
            for word in set(_WORD.findall(message.literal)):
                table.setdefault(word, []).append(i)
        _WORDS[index.sha256 + index.wheel] = table
    score: dict[int, int] = {}
    for word in words:
        for i in table.get(word, ()):
            score[i] = score.get(i, 0) + len(word)
    return [index.messages[i] for i in sorted(score, key=lambda i: (-score[i], i))]


def _can_match(
    regex: re.Pattern[str], message: Message, plan: _Plan, index: PackageIndex, indexes: Sequence[PackageIndex]
) -> bool:
    holes = [s for s in message.segments if isinstance(s, Hole)]
    options = [_fillers(h, plan, indexes) for h in holes]
    plain = [o[0] if o else "x" for o in options]
    fills: list[list[str]] = [plain]
    for i, choices in enumerate(options):
        for c in choices:
            fills.append([*plain[:i], c, *plain[i + 1 :]])
    for token in plan.tokens:
        if all(token in o or h.kind == "free" for h, o in zip(holes, options, strict=True)):
            fills.append(
                [token if h.kind == "free" or token in o else o[0] for h, o in zip(holes, options, strict=True)]
            )
    if len(holes) == 2 and len(options[0]) * len(options[1]) <= 4000:
        fills += [list(p) for p in itertools.product(*options)]
    for sample in plan.samples:
        aligned = _align(message, sample, holes, options)
        if aligned is not None:
            fills.append(aligned)
    for fill in fills:
        text, literals = _render(message, fill)
        for m in regex.finditer(text):
            if _covers_literal(m.start(), m.end(), literals):
                return True
    return False


def _align(message: Message, sample: str, holes: list[Hole], options: list[list[str]]) -> list[str] | None:
    """Holes filled with what lies between the message's literal pieces in a sample of the rule.

    The sample may start inside a literal piece (the rule quotes the middle of a message) and end
    inside one. A `name` hole must receive one of its classes, a `num` hole a number.
    """
    fill = [o[0] if o else "x" for o in options]
    pos, pending, started, i = 0, None, False, 0
    for segment in message.segments:
        if isinstance(segment, Hole):
            pending, i = i, i + 1
            continue
        if not started:
            at = sample.find(segment)
            if at >= 0:
                if pending is not None:
                    fill[pending] = sample[:at]
                started, pos = True, at + len(segment)
            else:
                k = next((k for k in range(min(len(segment), len(sample)), 2, -1) if segment.endswith(sample[:k])), 0)
                started, pos = k > 0, k
            pending = None
            continue
        at = sample.find(segment, pos)
        if at >= 0:
            if pending is not None:
                fill[pending] = sample[pos:at]
            pos, pending = at + len(segment), None
            continue
        end = next((p for p in range(pos, len(sample)) if segment.startswith(sample[p:])), None)
        if pending is not None:
            fill[pending] = sample[pos:] if end is None else sample[pos:end]
            # A hole with no literal after it in the sample could be anything: let it absorb one
            # word at most, or every "Selected {n} items" would match any rule starting "Selected".
            if end is None and re.search(r"\s", fill[pending]):
                return None
        pending = None
        break
    if started and pending is not None:
        fill[pending] = sample[pos:]
        if re.search(r"\s", fill[pending]):
            return None
    if not started:
        return None
    for j, hole in enumerate(holes):
        if hole.kind == "num" and not re.fullmatch(r"-?[\d.]*", fill[j]):
            return None
        if hole.kind == "name" and fill[j] not in options[j]:
            return None
    return fill


def _render(message: Message, fill: list[str]) -> tuple[str, list[tuple[int, str]]]:
    """The filled text and where each literal piece sits in it."""
    parts, literals, at, i = [], [], 0, 0
    for segment in message.segments:
        if isinstance(segment, str):
            parts.append(segment)
            literals.append((at, segment))
            at += len(segment)
        else:
            parts.append(fill[i])
            at += len(fill[i])
            i += 1
    return "".join(parts), literals


def _covers_literal(start: int, end: int, literals: list[tuple[int, str]]) -> bool:
    """Does [start, end) hold a letter or digit of the message's own text (not only fillers)?"""
    for at, text in literals:
        lo, hi = max(start, at), min(end, at + len(text))
        if lo < hi and any(c.isalnum() for c in text[lo - at : hi - at]):
            return True
    return False


def _fillers(hole: Hole, plan: _Plan, indexes: Sequence[PackageIndex]) -> list[str]:
    if hole.kind == "num":
        return [*_NUM, *(t for t in plan.tokens if re.fullmatch(r"[\d.]+", t))]
    if hole.kind == "name":
        if hole.refs:
            admissible = _admissible(hole.refs, tuple(indexes))
            if admissible:
                ranked = sorted(admissible, key=lambda c: (-sum(len(f) for f in plan.fragments if f in c), c))
                return ["x", *ranked[:60]]
        return ["x", *(t for t in plan.tokens if t.isidentifier())]
    return [*_FREE, *plan.tokens]


_ADMISSIBLE: dict[tuple[tuple[str, ...], tuple[str, ...]], tuple[str, ...]] = {}


def _admissible(refs: tuple[str, ...], indexes: tuple[PackageIndex, ...]) -> tuple[str, ...]:
    """Classes a function naming `refs` can hand to `X.__name__`: the named ones and their subclasses."""
    key = (refs, tuple(i.sha256 + i.wheel for i in indexes))
    if key in _ADMISSIBLE:
        return _ADMISSIBLE[key]
    wanted = set(refs)
    found = []
    for index in indexes:
        for name in index.classes:
            if name in wanted or _ancestors(index, name) & wanted:
                found.append(name)
    _ADMISSIBLE[key] = tuple(dict.fromkeys(found))
    return _ADMISSIBLE[key]


_ANCESTORS: dict[tuple[str, str], frozenset[str]] = {}


def _ancestors(index: PackageIndex, name: str) -> frozenset[str]:
    key = (index.sha256 + index.wheel, name)
    if key not in _ANCESTORS:
        _ANCESTORS[key] = frozenset(index.ancestors(name))
    return _ANCESTORS[key]


# -- variables and kernels -------------------------------------------------------------------------


def check_variable(name: str, where: str, indexes: Sequence[PackageIndex]) -> Finding:
    """A VLLM_*/FLASHINFER_* variable must be read by some package (envs.py, os.environ, getenv)."""
    for index in indexes:
        if name in index.env:
            file, line = index.env[name]
            evidence = Evidence(package=index.name, version=index.version, file=file, line=line)
            return Finding(kind="variable", subject=name, where=where, status=Status.OK, evidence=(evidence,))
    known = sorted({v for i in indexes for v in i.env if v.split("_")[0] == name.split("_")[0]})
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
    hint = f"; did you mean {close[0]}?" if close else ""
    packages = ", ".join(f"{i.name}=={i.version}" for i in indexes)
    return Finding(
        kind="variable",
        subject=name,
        where=where,
        status=Status.ERROR,
        message=f"no audited package reads it ({packages}){hint}",
    )


def check_kernel(name: str, where: str, indexes: Sequence[PackageIndex]) -> Finding:
    """A kernel class named in VLLM_DISABLED_KERNELS or in a rule must be defined somewhere."""
    for index in indexes:
        info = index.classes.get(name)
        if info is not None:
            evidence = Evidence(package=index.name, version=index.version, file=info.file, line=info.line)
            return Finding(kind="kernel", subject=name, where=where, status=Status.OK, evidence=(evidence,))
    known = sorted({c for i in indexes for c in i.classes if c.endswith("Kernel")})
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.7)
    hint = f"; did you mean {close[0]}?" if close else ""
    packages = ", ".join(f"{i.name}=={i.version}" for i in indexes)
    return Finding(
        kind="kernel", subject=name, where=where, status=Status.ERROR, message=f"no such class in {packages}{hint}"
    )


def kernel_literals(pattern: str) -> list[str]:
    """Whole `\\w+Kernel` class names a pattern spells out literally (not `FlashInfer\\w*Kernel`)."""
    try:
        items = list(sre_parse.parse(pattern))
    except re.error:
        return []
    found, run, bounded_left = [], "", True
    for op, av in [*items, (None, None)]:
        if op is sre_c.LITERAL:
            run += chr(av)
            continue
        # A run next to a word-matching item may be part of a longer name: only whole words count.
        bounded_right = op is None or not _may_be_word(op, av)
        for m in _KERNEL.finditer(run):
            left_ok = m.start() > 0 or bounded_left
            right_ok = m.end() < len(run) or bounded_right
            if left_ok and right_ok:
                found.append(m.group(1))
        run, bounded_left = "", op is None or not _may_be_word(op, av)
    return found


def _may_be_word(op: Any, av: Any) -> bool:
    return op not in (sre_c.AT,) and not (op is sre_c.LITERAL and not chr(av).isalnum())


def capability_findings(
    kernel: str, arch: str, relied: str, where: str, indexes: Sequence[PackageIndex]
) -> list[Finding]:
    """A WARN where the kernel's support check names a compute capability the cell's arch lacks."""
    cap = ARCH_CAPABILITY.get(arch)
    if cap is None:
        return []
    out = []
    for index in indexes:
        if kernel not in index.classes:
            continue
        for name in [kernel, *sorted(index.ancestors(kernel))]:
            info = index.classes.get(name)
            for method, call, number, line in info.capability if info else ():
                holds = {
                    "is_device_capability_family": cap // 10 == number // 10,
                    "is_device_capability": cap == number,
                    "has_device_capability": cap >= number,
                }[call]
                if holds:
                    continue
                evidence = Evidence(
                    package=index.name, version=index.version, file=info.file if info else "", line=line
                )
                out.append(
                    Finding(
                        kind="capability",
                        subject=kernel,
                        where=where,
                        status=Status.WARN,
                        message=(
                            f"{name}.{method} tests {call}({number}), false on {arch} (capability {cap}): "
                            f"the cell {relied} a kernel vLLM never selects on this arch"
                        ),
                        evidence=(evidence,),
                    )
                )
        break
    return out
