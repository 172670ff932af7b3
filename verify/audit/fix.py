"""A stale rule's closest current text, a rule rewritten from it, and `matrix audit --fix`'s edit.

Closest: among the owning package's messages that share a word with the rule (checks._candidates),
the one whose rendered text is nearest to a sample of the rule (difflib's ratio), with its file:line.
Rewrite: that message as a regex (literal text escaped; a `name` hole takes the class the old rule
named when it may, else `\\w+`; a `num` hole `[\\d.]+`; any other `.+?`, or `.+` at the end), kept
only if the audit's own check matches it to that same message. A rule with named groups (evidence)
is given the text, not a rewrite: its groups say what to capture, which no message tells.

The edit is textual and located, so matrix.yaml keeps its comments and layout: the line of the
rule's pattern comes from pipeline.yamlsrc (the line every key was read from), and on that line
the old scalar, as YAML quoted it, is replaced by the new one single-quoted.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verify.audit.checks import Evidence, _candidates, _plan, check_pattern
from verify.audit.index import Hole, Message, PackageIndex

__all__ = ["Closest", "Edit", "FixPlan", "apply_edits", "closest", "locate_rule", "plan_fix", "unified_diff"]

_SCAN = 400  # candidates compared per package: the best-sharing ones come first
_CUTOFF = 0.45


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
            ratio = difflib.SequenceMatcher(None, sample, message.render(), autojunk=False).ratio()
            if best is None or ratio > best[0]:
                best = (ratio, index, message)
    if best is None or best[0] < _CUTOFF:
        return None
    ratio, index, message = best
    evidence = Evidence(
        package=index.name, version=index.version, file=message.file, line=message.line, text=message.render()
    )
    rewritten = None if re.compile(pattern).groupindex else _rewrite(message, plan.tokens, indexes)
    return Closest(evidence=evidence, ratio=round(ratio, 2), pattern=rewritten)


def _rewrite(message: Message, tokens: Sequence[str], indexes: Sequence[PackageIndex]) -> str | None:
    parts: list[str] = []
    holes = [s for s in message.segments if isinstance(s, Hole)]
    for i, segment in enumerate(message.segments):
        if isinstance(segment, str):
            parts.append(re.escape(segment).replace("\\ ", " "))
        elif segment.kind == "num":
            parts.append(r"[\d.]+")
        elif segment.kind == "name":
            named = [t for t in tokens if t.isidentifier() and any(t in i.classes for i in indexes)]
            parts.append(named[0] if named else r"\w+")
        else:
            parts.append(".+" if i == len(message.segments) - 1 else ".+?")
    text = "".join(parts).strip()
    if not text or not holes and not text.strip():
        return None
    found = check_pattern(text, indexes)
    if found is None or (found.file, found.line) != (message.file, message.line):
        return None
    return text


# -- the edit --------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Edit:
    line: int  # 1-based, in the matrix file
    old: str  # the pattern as loaded
    new: str


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
    """(old text, new text, problems): each edit replaces its scalar on its own line only."""
    old = path.read_text()
    lines = old.splitlines(keepends=True)
    problems = []
    for edit in edits:
        at = edit.line - 1
        if not 0 <= at < len(lines):
            problems.append(f"{path}:{edit.line}: no such line")
            continue
        for form in _quoted(edit.old):
            if form and form in lines[at]:
                lines[at] = lines[at].replace(form, "'" + edit.new.replace("'", "''") + "'", 1)
                break
        else:
            problems.append(f"{path}:{edit.line}: the pattern is not written on one line there; edit it by hand")
    return old, "".join(lines), problems


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
    from pipeline.yamlsrc import load_yaml

    wanted: dict[tuple[str, str, str], set[str]] = {}
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
        edits += [Edit(line=line, old=pattern, new=next(iter(suggestions))) for line in lines]
    old, new, more = apply_edits(path, edits)
    return FixPlan(
        edits=tuple(edits),
        diff=unified_diff(path, old, new),
        new_text=new,
        problems=(*problems, *more),
        unfixed=unfixed + len(more),
    )
