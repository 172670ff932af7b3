"""A stale rule's closest current text, a rule rewritten from it, and `matrix audit --fix`'s edit.

Closest: among the owning package's messages that share a word with the rule (checks._candidates),
the one whose rendered text is nearest to a sample of the rule (difflib's ratio), with its file:line.
Rewrite: that message as a regex (literal text escaped; a `name` hole takes the class the old rule
named when it may, else `\\w+`; a `num` hole `[\\d.]+`; any other `.+?`, or `.+` at the end), kept
only if the audit's own check matches it to that same message. A rule with named groups (evidence)
is given the text, not a rewrite: its groups say what to capture, which no message tells.

The edit is textual and located, so matrix.yaml keeps its comments and layout: the line of the
rule's pattern comes from pipeline.matrix.yamlsrc (the line every key was read from), and on that line
the old scalar, as YAML quoted it, is replaced by the new one single-quoted.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pipeline.guard import boundedio
from pipeline.guard.yamltext import scalar
from pipeline.matrix.yamlsrc import MAX_BYTES
from verify.audit.checks import Evidence, _candidates, _plan, check_pattern
from verify.audit.index import Message, PackageIndex

__all__ = [
    "Closest",
    "Edit",
    "FixPlan",
    "apply_edits",
    "closest",
    "locate_rule",
    "plan_fix",
    "reread_problems",
    "unified_diff",
]

_SCAN = 400  # candidates compared per package: the best-sharing ones come first
_CUTOFF = 0.6
_CAMEL = re.compile(r"[A-Z][a-z0-9]+(?:[A-Z][A-Za-z0-9]*)+")


@dataclass(frozen=True, kw_only=True)
class Closest:
    evidence: Evidence  # the message nearest to the rule, at package==version file:line
    ratio: float
    pattern: str | None  # the rule rewritten from it (proven to match it), or None


def closest(pattern: str, indexes: Sequence[PackageIndex]) -> Closest | None:
    plan = _plan(pattern)
    sample = plan.samples[0] if plan.samples else pattern
    best: tuple[float, PackageIndex, Message] | None = None
    for index in indexes:
        for message in _candidates(index, plan.words)[:_SCAN]:
            ratio = _score(sample, message)
            if best is None or ratio > best[0]:
                best = (ratio, index, message)
    if best is None or best[0] < _CUTOFF:
        return None
    ratio, index, message = best
    evidence = Evidence(
        package=index.name, version=index.version, file=message.file, line=message.line, text=message.render()
    )
    rewritten = None if re.compile(pattern).groupindex else _rewrite(pattern, message, plan.tokens, indexes)
    return Closest(evidence=evidence, ratio=round(ratio, 2), pattern=rewritten)


def _score(sample: str, message: Message) -> float:
    """How much of the rule's sample the message's own text holds, in order, and how much of that
    text the rule quotes: a message the rule quotes nearly whole is near, a long one sharing a few
    words is not. Holes count as one character (what fills them is unknown)."""
    text = "".join(s if isinstance(s, str) else "\0" for s in message.segments)
    matcher = difflib.SequenceMatcher(None, sample, text, autojunk=False)
    matched = sum(b.size for b in matcher.get_matching_blocks())
    return 0.5 * matched / max(len(sample), 1) + 0.5 * matched / max(len(message.literal), 1)


def _rewrite(pattern: str, message: Message, tokens: Sequence[str], indexes: Sequence[PackageIndex]) -> str | None:
    """The old rule with the message's literal edits applied (its own wildcards and tail kept), else
    the whole message as a regex: the first that the audit's check matches to that same message."""
    pieces = _message_regex(message, tokens, indexes)
    if pieces is None:
        return None
    for candidate in (_merged(pattern, pieces), "".join(text for text, _ in pieces).strip()):
        try:
            found = check_pattern(candidate, indexes)
        except re.error:
            continue
        if found is not None and (found.file, found.line) == (message.file, message.line):
            return candidate
    return None


def _message_regex(
    message: Message, tokens: Sequence[str], indexes: Sequence[PackageIndex]
) -> list[tuple[str, bool]] | None:
    """The message as regex pieces, (text, is_hole)."""
    pieces: list[tuple[str, bool]] = []
    for i, segment in enumerate(message.segments):
        if isinstance(segment, str):
            pieces.append((re.escape(segment).replace("\\ ", " "), False))
        elif segment.kind == "num":
            pieces.append((r"[\d.]+", True))
        elif segment.kind == "name":
            named = [t for t in tokens if t.isidentifier() and any(t in i.classes for i in indexes)]
            if not named and any(_CAMEL.fullmatch(t) and t not in message.literal for t in tokens):
                return None  # the rule names a class no package defines: a rewrite would lose what it meant
            pieces.append((named[0], False) if named else (r"\w+", True))
        else:
            pieces.append((".+" if i == len(message.segments) - 1 else ".+?", True))
    return pieces


_ATOM = re.compile(r"\\.|\w+|\s+|.")


def _merged(pattern: str, pieces: list[tuple[str, bool]]) -> str:
    """`pattern` with each difference from the message taken where the message's side holds its own
    literal text, and kept where the message has only a hole there (the rule was more precise).
    Compared atom by atom (an escape, a word, a space run, one character)."""
    source = _ATOM.findall(pattern)
    target: list[str] = []
    literal: list[bool] = []
    for text, hole in pieces:
        atoms = _ATOM.findall(text)
        target += atoms
        literal += [not hole] * len(atoms)
    out: list[str] = []
    opcodes = difflib.SequenceMatcher(None, source, target, autojunk=False).get_opcodes()
    for n, (op, i1, i2, j1, j2) in enumerate(opcodes):
        if op == "insert" and n in (0, len(opcodes) - 1):
            continue  # the rule quotes part of the message: what it left out before or after stays out
        keep = op == "equal" or not any(literal[j1:j2])
        out += source[i1:i2] if keep else target[j1:j2]
    return "".join(out)


# -- the edit --------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Edit:
    line: int  # 1-based, in the matrix file
    old: str  # the pattern as loaded
    new: str
    rule_id: str = ""  # the rule's id and the key its pattern is under (`expect`, `pattern`)
    kind: str = ""


def locate_rule(source: Any, rule_id: str, kind: str, pattern: str) -> list[int]:
    """The lines of matrix.yaml where a log rule `{id: rule_id, kind: pattern}` is written."""
    lines: list[int] = []

    def walk(node: Any, path: tuple[str | int, ...]) -> None:
        if isinstance(node, dict):
            if node.get("id") == rule_id and node.get(kind) == pattern:
                lines.append(source.line_of((*path, kind)))
            for key, value in node.items():
                walk(value, (*path, key))
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, (*path, i))

    walk(source.data, ())
    return sorted(set(lines))


def _quoted(text: str) -> list[str]:
    """The ways YAML may have written `text` as a flow scalar on one line."""
    double = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return ["'" + text.replace("'", "''") + "'", double, text]


def apply_edits(path: Path, edits: Sequence[Edit]) -> tuple[str, str, list[str]]:
    """(old text, new text, problems): each edit replaces its scalar, the value of its own key
    (`expect:`, `pattern:`), on its own line only; an id spelled like the pattern stays."""
    old = boundedio.read_text(path, "rule file", limit=MAX_BYTES)
    lines = old.splitlines(keepends=True)
    problems = []
    for edit in edits:
        at = edit.line - 1
        if not 0 <= at < len(lines):
            problems.append(f"{path}:{edit.line}: no such line")
            continue
        key = re.escape(edit.kind) if edit.kind else r"[\w-]+"
        for form in _quoted(edit.old):
            match = re.search(rf"(?<![\w-]){key}\s*:\s*({re.escape(form)})", lines[at]) if form else None
            if match is not None:
                lines[at] = lines[at][: match.start(1)] + scalar(edit.new) + lines[at][match.end(1) :]
                break
        else:
            problems.append(f"{path}:{edit.line}: the pattern is not written on one line there; edit it by hand")
    return old, "".join(lines), problems


def reread_problems(old: str, new: str, edits: Sequence[Edit]) -> list[str]:
    """Read the rewritten text back: it must be the old document with exactly the edited rules'
    patterns replaced, every other value as it was (issue 43: a fix is verified, or not claimed)."""
    try:
        before, after = yaml.safe_load(old), yaml.safe_load(new)
    except yaml.YAMLError as exc:
        return [f"the rewritten file does not read back as YAML ({exc})"]
    changes = {(e.rule_id, e.kind, e.old): e.new for e in edits}

    def expected(node: Any) -> Any:
        if isinstance(node, dict):
            out = {k: expected(v) for k, v in node.items()}
            for (rule_id, kind, pattern), new_pattern in changes.items():
                if node.get("id") == rule_id and node.get(kind) == pattern:
                    out[kind] = new_pattern
            return out
        if isinstance(node, list):
            return [expected(v) for v in node]
        return node

    if after != expected(before):
        return ["the rewritten file does not read back as the old one with only those rules changed"]
    return []


def unified_diff(path: Path, old: str, new: str) -> str:
    return "".join(
        difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True), str(path), str(path))
    )


@dataclass(frozen=True, kw_only=True)
class FixPlan:
    edits: tuple[Edit, ...]
    diff: str
    new_text: str
    problems: tuple[str, ...]  # rules with no rewrite, or none the cells agree on, or not locatable
    unfixed: int  # errors the plan leaves


def plan_fix(path: Path, findings: Sequence[Any]) -> FixPlan:
    """The edits that rewrite each stale matrix.yaml rule (`cell X` / `arm Y` findings) to the text
    its owning package prints now; nothing is written here."""
    from pipeline.matrix.yamlsrc import load_yaml

    wanted: dict[tuple[str, ...], set[str]] = {}
    problems: list[str] = []
    unfixed = 0
    for f in findings:
        if f.status.value != "ERROR":
            continue
        if f.kind != "rule" or not f.rule or not f.where.startswith(("cell ", "arm ")):
            unfixed += 1
            continue
        wanted.setdefault(f.rule, set()).add(f.suggestion)
    source = load_yaml(path)
    edits: list[Edit] = []
    for (rule_id, kind, pattern), suggestions in sorted(wanted.items()):
        if "" in suggestions or len(suggestions) > 1:
            why = "no rewrite matches the closest text" if "" in suggestions else "the cells' releases disagree"
            problems.append(f"{kind} {rule_id}: {pattern!r}: not rewritten ({why}); see the closest text above")
            unfixed += 1
            continue
        lines = locate_rule(source, rule_id, kind, pattern)
        if not lines:
            problems.append(f"{kind} {rule_id}: {pattern!r}: not found in {path}")
            unfixed += 1
        replacement = next(iter(suggestions))
        edits += [Edit(line=line, old=pattern, new=replacement, rule_id=rule_id, kind=kind) for line in lines]
    old, new, more = apply_edits(path, edits)
    if not more and (unread := reread_problems(old, new, edits)):
        more, new = unread, old  # nothing claimed that the file would not say
    if new == old:
        edits = []
    return FixPlan(
        edits=tuple(edits),
        diff=unified_diff(path, old, new),
        new_text=new,
        problems=(*problems, *more),
        unfixed=unfixed + len(more),
    )
