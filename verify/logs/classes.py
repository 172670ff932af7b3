"""The failure-class catalog (failure_classes.yaml): each class's match, its severity and priority, and the
log rules a cell's diagnosis scans with (the catalog's signatures plus the cell's own rules).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from pipeline.errors import MatrixError
from pipeline.matrix.model import LogRule
from pipeline.matrix.yamlsrc import Path_, YamlSource, load_yaml
from verify.logs.catalog import check_entry

CLASSES_FILE = Path(__file__).with_name("failure_classes.yaml")
CLASS_KEYS = (
    "id",
    "title",
    "severity",
    "priority",
    "match",
    "what",
    "next",
    "next_by_phase",
    "min_count",
    "phased",
    "fallback",
    "loud_only",
    "cleared_by_worker_lines",
    "components",
)
FIRST_ONLY_FACTS = frozenset({"arch", "vllm", "flashinfer", "sglang", "torch", "driver", "model_architecture"})


@dataclass(frozen=True, kw_only=True)
class FailureClass:
    id: str
    title: str
    severity: str  # fail | warn
    priority: int  # lower wins when several classes match
    patterns: tuple[str, ...]
    what: str
    next: str
    min_count: int = 1  # fewer sightings fail only when startup did not complete after the last one
    phased: bool = False  # say which startup phase it happened in
    next_by_phase: tuple[tuple[str, str], ...] = ()  # advice that fits the phase, when one is known
    fallback: bool = False  # named only when no other failing class is (the error-line extractor)
    # a line its own logger calls INFO or WARNING does not count: the text is quoted as advice there
    # ("... can cause fd limit errors like `OSError: [Errno 24] Too many open files`")
    loud_only: bool = False
    # not a failure when a worker process logs after the last sighting: what it waited for was busy
    cleared_by_worker_lines: bool = False
    # what wrote an error no pattern classified (a binary, logger, exception type or frame path): an error of
    # one of these components is this class's (verify/logs/components.py; issue 44)
    components: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ClassCatalog:
    classes: tuple[FailureClass, ...]
    phases: tuple[tuple[str, tuple[str, ...]], ...]  # (phase, patterns), in startup order
    facts: tuple[tuple[str, tuple[str, ...]], ...]  # (fact, patterns)


@cache
def load_classes(file: Path = CLASSES_FILE) -> ClassCatalog:
    """The class catalog, with every problem located (FILE:LINE: path: message)."""
    src = load_yaml(file)
    problems: list[str] = []
    data = src.data if isinstance(src.data, dict) else {}
    entries = data.get("classes")
    if not isinstance(entries, list):
        raise MatrixError([f"{file}:1: classes: must be a list"])
    classes, seen = [], set()
    for i, entry in enumerate(entries):
        found = _class(src, ("classes", i), entry, problems)
        if found is not None:
            if found.id in seen:
                problems.append(f"{src.where(('classes', i, 'id'))}: duplicate class id {found.id!r}")
            seen.add(found.id)
            classes.append(found)
    if "python-exception" not in seen:
        problems.append(f"{file}:1: classes: needs the python-exception class (the answer for unknown failures)")
    phases = _named_patterns(src, "phases", problems)
    facts = _named_patterns(src, "facts", problems)
    if "serving" not in {name for name, _ in phases}:
        problems.append(f"{file}:1: phases: needs a `serving` phase (startup completed)")
    known = {name for name, _ in phases}
    for i, c in enumerate(classes):
        problems += [
            f"{src.where(('classes', i, 'next_by_phase', phase))}: unknown phase (known: {', '.join(sorted(known))})"
            for phase, _ in c.next_by_phase
            if phase not in known
        ]
    if problems:
        raise MatrixError(problems)
    return ClassCatalog(classes=tuple(classes), phases=phases, facts=facts)


def _class(src: YamlSource, path: Path_, entry: Any, problems: list[str]) -> FailureClass | None:
    def bad(sub: Path_, message: str) -> None:
        problems.append(f"{src.where((*path, *sub))}: {message}")

    before = len(problems)
    required = ("id", "title", "severity", "priority", "match", "what", "next")
    if not check_entry(src, path, entry, CLASS_KEYS, required, problems):
        return None
    if entry.get("severity") not in ("fail", "warn"):
        bad(("severity",), f"must be fail or warn, got {entry.get('severity')!r}")
    if not isinstance(entry.get("priority", 0), int):
        bad(("priority",), "must be an integer")
    patterns = _regexes(entry, "match", bad, required=True)
    components = _regexes(entry, "components", bad, required=False)
    by_phase = entry.get("next_by_phase") or {}
    if not isinstance(by_phase, dict) or not all(isinstance(v, str) for v in by_phase.values()):
        bad(("next_by_phase",), "must map a startup phase to its advice")
    if len(problems) > before:
        return None
    return FailureClass(
        id=str(entry["id"]),
        title=str(entry["title"]),
        severity=entry["severity"],
        priority=int(entry["priority"]),
        patterns=patterns,
        what=str(entry["what"]).strip(),
        next=str(entry["next"]).strip(),
        min_count=int(entry.get("min_count", 1)),
        phased=bool(entry.get("phased", False)),
        next_by_phase=tuple((str(k), str(v).strip()) for k, v in (entry.get("next_by_phase") or {}).items()),
        fallback=bool(entry.get("fallback", False)),
        loud_only=bool(entry.get("loud_only", False)),
        cleared_by_worker_lines=bool(entry.get("cleared_by_worker_lines", False)),
        components=components,
    )


def _regexes(entry: Any, key: str, bad: Callable[[Path_, str], None], *, required: bool) -> tuple[str, ...]:
    """The entry's list of regular expressions under `key`, each compiled once to name the bad ones."""
    patterns = entry.get(key) or []
    if not isinstance(patterns, list) or (required and not patterns):
        bad((key,), f"must be a {'non-empty ' if required else ''}list of regular expressions")
        return ()
    for j, pattern in enumerate(patterns):
        try:
            re.compile(str(pattern))
        except re.error as exc:
            bad((key, j), f"not a valid regular expression: {exc}")
    return tuple(str(p) for p in patterns)


def _named_patterns(src: YamlSource, key: str, problems: list[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    entries = src.data.get(key) if isinstance(src.data, dict) else None
    if not isinstance(entries, list):
        problems.append(f"{src.file}:1: {key}: must be a list")
        return ()
    result = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or set(entry) != {"id", "match"} or not isinstance(entry["match"], list):
            problems.append(f"{src.where((key, i))}: needs exactly id and match (a list of regexes)")
            continue
        for j, pattern in enumerate(entry["match"]):
            try:
                re.compile(str(pattern))
            except re.error as exc:
                problems.append(f"{src.where((key, i, 'match', j))}: not a valid regular expression: {exc}")
        result.append((str(entry["id"]), tuple(str(p) for p in entry["match"])))
    return tuple(result)


def scan_rules(classes: ClassCatalog | None = None) -> tuple[LogRule, ...]:
    """Every pattern the diagnosis scans for (benchmarks/logscan.py gives the same set to grep)."""
    return catalog_rules(classes or load_classes())


@cache
def catalog_rules(classes: ClassCatalog) -> tuple[LogRule, ...]:
    """Everything the diagnosis looks for, as scan rules: one pass over the log finds all of it.

    Phase markers and single-valued facts are `expect` rules (the first sighting is enough, and a
    steady-state log repeats them); class lines and kernels are `evidence` (all sightings).
    """
    rules: list[LogRule] = []
    for c in classes.classes:
        rules += [LogRule(id=f"class:{c.id}:{i}", kind="evidence", pattern=p) for i, p in enumerate(c.patterns)]
    for phase, patterns in classes.phases:
        rules += [LogRule(id=f"phase:{phase}:{i}", kind="expect", pattern=p) for i, p in enumerate(patterns)]
    for fact, patterns in classes.facts:
        kind = "expect" if fact in FIRST_ONLY_FACTS else "evidence"
        rules += [LogRule(id=f"fact:{fact}:{i}", kind=kind, pattern=p) for i, p in enumerate(patterns)]
    # A raise line: `Type: message`, the type ending in Error, Exception... (the literals the scan
    # looks for); the colon keeps out "500 Internal Server Error" request lines.
    rules.append(
        LogRule(
            id="exception",
            kind="evidence",
            pattern=r"(?:[A-Za-z_]\w*\.)*\w*(?:Error|Exception|OutOfResources|SystemExit):(?:\s|$)",
        )
    )
    return tuple(rules)
