"""The signature catalog (signatures.yaml) and the rule sets (logrules.yaml): each entry's match, where it
applies, the facts it requires; checked when loaded, and chosen for a cell.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from pipeline.errors import MatrixError
from pipeline.matrix.model import DEFAULT_ENGINE, SERVING_ENGINES, Arm, Cell, LogRule, parse_log_rule
from pipeline.matrix.yamlsrc import Path_, YamlSource, load_yaml

__all__ = [
    "CATALOG_FILE",
    "RULESETS_FILE",
    "Facts",
    "RuleSet",
    "Signature",
    "catalog_for",
    "check_entry",
    "load_catalog",
    "load_rulesets",
    "rules_for",
    "rulesets_for",
]

CATALOG_FILE = Path(__file__).with_name("signatures.yaml")
RULESETS_FILE = Path(__file__).with_name("logrules.yaml")
_REF = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+#\d+$")
SIGNATURE_KEYS = (
    "id",
    "title",
    "severity",
    "source",
    "match",
    "window",
    "what",
    "workaround",
    "refs",
    "applies_to",
    "origin",
    "package",
    # Diagnosis only (verify/logs/diagnosis.py): the facts a log or a cell must show before the entry is
    # named as the cause, and the releases that fixed it. The stages ignore both.
    "requires",
    "fixed_in",
    # The conditions under which the fix is in force ({cudnn: '<9.23.1'}): outside them, or where they
    # are not known, fixed_in rules nothing out (verify/audit/meanings.py reads them from the fix's gate).
    "fixed_if",
)
# The Facts a signature's `applies_to` may test: a serving engine's version (under its name), FlashInfer's.
APPLIES_TO_PACKAGES = (*SERVING_ENGINES, "flashinfer")
# What a fix's run-time condition may name (`fixed_if`): a fact of the stack beside the versions above.
FIXED_IF_PACKAGES = (*APPLIES_TO_PACKAGES, "cudnn")
# The facts `requires` may test (verify/logs/diagnosis.py extracts them from the log or the cell).
REQUIRES_FACTS = ("arch", "gpu", "fp8_linear", "kv_cache_dtype", "mla", "quantization", "kernel", "attention_backend")


@dataclass(frozen=True, kw_only=True)
class Signature:
    id: str
    title: str
    severity: str  # fail | warn
    source: str  # server | kernel
    match: str | None
    first: str | None  # window: `then` within `within` lines after `first`
    then: str | None
    within: int
    what: str
    workaround: str
    refs: tuple[str, ...]
    # package -> version specifier: releases the text exists in; an unknown version applies
    applies_to: tuple[tuple[str, str], ...] = ()
    # Whose text it is, for `stackproof matrix audit`: `package` (the default: some audited package
    # prints it) or `external` (CUDA runtime, driver, interpreter, a package not audited). `source`
    # already says which log is scanned; a `kernel` signature is external whatever this says.
    origin: str = "package"
    package: str | None = None  # the distribution that prints it; a stack without it cannot show it

    @property
    def external(self) -> bool:
        return self.origin == "external" or self.source == "kernel"

    # fact -> regex its value must match before this is named as the cause (diagnosis only)
    requires: tuple[tuple[str, str], ...] = ()
    # package -> first release with the fix: a known version at or above it rules the entry out
    fixed_in: tuple[tuple[str, str], ...] = ()
    # package -> version specifier under which the fix is in force (cudnn: '<9.23.1')
    fixed_if: tuple[tuple[str, str], ...] = ()

    def applies(self, facts: Facts | None) -> bool:
        """False only when a known installed version lies outside `applies_to`."""
        if facts is None:
            return True
        versions = {facts.engine: facts.engine_version, "flashinfer": facts.flashinfer}
        # Another engine's release range says this text is that engine's: it cannot be printed here.
        return all((package in versions) and _within(versions[package], spec) for package, spec in self.applies_to)


@dataclass(frozen=True, kw_only=True)
class RuleSet:
    id: str
    when: dict[str, Any]
    rules: tuple[LogRule, ...]


@dataclass(frozen=True, kw_only=True)
class Facts:
    """What the rule sets' conditions look at; None means unknown, which satisfies a condition."""

    serve: bool
    arch: str
    flashinfer: str | None = None
    cudnn: int | None = None
    engine: str = DEFAULT_ENGINE  # the cell's serving engine (serve.engine)
    engine_version: str | None = None  # its release as installed (the driver's distributions)


@cache
def load_catalog(file: Path = CATALOG_FILE) -> tuple[Signature, ...]:
    src = load_yaml(file)
    problems: list[str] = []
    entries = (src.data or {}).get("signatures") if isinstance(src.data, dict) else None
    if not isinstance(entries, list):
        raise MatrixError([f"{file}:1: signatures: must be a list"])
    result, seen = [], set()
    for i, entry in enumerate(entries):
        sig = _signature(src, ("signatures", i), entry, problems)
        if sig is not None:
            if sig.id in seen:
                problems.append(f"{src.where(('signatures', i, 'id'))}: duplicate signature id {sig.id!r}")
            seen.add(sig.id)
            result.append(sig)
    if problems:
        raise MatrixError(problems)
    return tuple(result)


def check_entry(
    src: YamlSource, path: Path_, entry: Any, keys: Sequence[str], required: Sequence[str], problems: list[str]
) -> bool:
    """A catalog entry's shape: a mapping with known keys and the required ones, each problem located.
    False when it is not a mapping at all (nothing more can be read from it)."""
    if not isinstance(entry, dict):
        problems.append(f"{src.where(path)}: must be a mapping")
        return False
    problems += [f"{src.where((*path, key))}: unknown key" for key in entry if key not in keys]
    problems += [f"{src.where(path)}: missing required key {key!r}" for key in required if key not in entry]
    return True


def _signature(src: YamlSource, path: Path_, entry: Any, problems: list[str]) -> Signature | None:
    def bad(sub: Path_, message: str) -> None:
        problems.append(f"{src.where((*path, *sub))}: {message}")

    before = len(problems)
    required = ("id", "title", "severity", "source", "what", "workaround", "refs")
    if not check_entry(src, path, entry, SIGNATURE_KEYS, required, problems):
        return None
    if ("match" in entry) == ("window" in entry):
        bad((), "needs exactly one of match, window")
    if entry.get("severity") not in ("fail", "warn"):
        bad(("severity",), f"must be fail or warn, got {entry.get('severity')!r}")
    if entry.get("source") not in ("server", "kernel"):
        bad(("source",), f"must be server or kernel, got {entry.get('source')!r}")
    refs = entry.get("refs") or []
    for j, ref in enumerate(refs):
        if not isinstance(ref, str) or not _REF.match(ref):
            bad(("refs", j), f"{ref!r} is not an upstream reference written as owner/repo#N")
    if entry.get("origin", "package") not in ("package", "external"):
        bad(("origin",), f"must be package or external, got {entry.get('origin')!r}")
    if "package" in entry and (not isinstance(entry["package"], str) or not entry["package"]):
        bad(("package",), "must be a distribution name, e.g. flashinfer-python")
    applies_to, requires, fixed_in = _signature_mappings(entry, bad)
    window = entry.get("window") or {}
    patterns = (
        {("match",): entry.get("match")}
        if "match" in entry
        else {("window", "first"): window.get("first"), ("window", "then"): window.get("then")}
    )
    for sub, pattern in patterns.items():
        try:
            re.compile(str(pattern))
        except re.error as exc:
            bad(sub, f"not a valid regular expression: {exc}")
    if len(problems) > before:
        return None
    return Signature(
        id=str(entry["id"]),
        title=str(entry["title"]),
        severity=entry["severity"],
        source=entry["source"],
        match=entry.get("match"),
        first=window.get("first"),
        then=window.get("then"),
        within=int(window.get("within", 20)),
        what=str(entry["what"]).strip(),
        workaround=str(entry["workaround"]).strip(),
        refs=tuple(refs),
        applies_to=tuple((str(k), str(v)) for k, v in sorted(applies_to.items())),
        origin=str(entry.get("origin", "package")),
        package=entry.get("package"),
        requires=tuple((str(k), str(v)) for k, v in requires.items()),
        fixed_in=tuple((str(k), str(v)) for k, v in sorted(fixed_in.items())),
        fixed_if=_fixed_if(entry, bad),
    )


def _fixed_if(entry: dict[str, Any], bad: Callable[[Path_, str], None]) -> tuple[tuple[str, str], ...]:
    """An entry's fixed_if: package -> version specifier, each checked."""
    fixed_if = entry.get("fixed_if") or {}
    if not isinstance(fixed_if, dict):
        bad(("fixed_if",), "must be a mapping of package to version specifier, e.g. {cudnn: '<9.23.1'}")
        return ()
    if fixed_if and not entry.get("fixed_in"):
        bad(("fixed_if",), "conditions a fix: needs fixed_in")
    for package, spec in fixed_if.items():
        if package not in FIXED_IF_PACKAGES:
            bad(("fixed_if", package), f"unknown package (known: {', '.join(FIXED_IF_PACKAGES)})")
        try:
            SpecifierSet(str(spec))
        except InvalidSpecifier:
            bad(("fixed_if", package), f"{spec!r} is not a version specifier")
    return tuple((str(k), str(v)) for k, v in sorted(fixed_if.items()))


def _signature_mappings(
    entry: dict[str, Any], bad: Callable[[Path_, str], None]
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """An entry's applies_to, requires and fixed_in, each checked key and value ({} where not a mapping)."""
    applies_to = entry.get("applies_to") or {}
    if not isinstance(applies_to, dict):
        bad(("applies_to",), "must be a mapping of package to version specifier, e.g. {vllm: '>0.28.0'}")
        applies_to = {}
    for package, spec in applies_to.items():
        if package not in APPLIES_TO_PACKAGES:
            bad(("applies_to", package), f"unknown package (known: {', '.join(APPLIES_TO_PACKAGES)})")
        try:
            SpecifierSet(str(spec))
        except InvalidSpecifier:
            bad(("applies_to", package), f"{spec!r} is not a version specifier")
    requires = entry.get("requires") or {}
    if not isinstance(requires, dict):
        bad(("requires",), "must be a mapping of fact to regex, e.g. {arch: '^sm12[01]$'}")
        requires = {}
    for fact, pattern in requires.items():
        if fact not in REQUIRES_FACTS:
            bad(("requires", fact), f"unknown fact (known: {', '.join(REQUIRES_FACTS)})")
        try:
            re.compile(str(pattern))
        except re.error as exc:
            bad(("requires", fact), f"not a valid regular expression: {exc}")
    fixed_in = entry.get("fixed_in") or {}
    if not isinstance(fixed_in, dict):
        bad(("fixed_in",), "must be a mapping of package to version, e.g. {flashinfer: 0.6.18.post1}")
        fixed_in = {}
    for package, version in fixed_in.items():
        if package not in APPLIES_TO_PACKAGES:
            bad(("fixed_in", package), f"unknown package (known: {', '.join(APPLIES_TO_PACKAGES)})")
        try:
            Version(str(version))
        except InvalidVersion:
            bad(("fixed_in", package), f"{version!r} is not a version")
    return applies_to, requires, fixed_in


def catalog_for(facts: Facts | None) -> tuple[Signature, ...]:
    """The catalog's signatures that can apply to a stack with these facts (`applies_to`)."""
    return tuple(s for s in load_catalog() if s.applies(facts))


def _within(version: str | None, spec: str) -> bool:
    if version is None:
        return True
    try:
        return SpecifierSet(spec).contains(Version(version), prereleases=True)
    except InvalidVersion:
        return True


@cache
def load_rulesets(file: Path = RULESETS_FILE) -> tuple[RuleSet, ...]:
    src = load_yaml(file)
    problems: list[str] = []
    sets = src.data.get("rulesets") if isinstance(src.data, dict) else None
    if not isinstance(sets, list):
        raise MatrixError([f"{file}:1: rulesets: must be a list"])
    result = []
    for i, entry in enumerate(sets):
        rules = []
        for j, item in enumerate(entry.get("rules") or []):
            rule, found = parse_log_rule(item, default_id=f"{entry.get('id')}-{j}")
            problems += [f"{src.where(('rulesets', i, 'rules', j, *sub))}: {message}" for sub, message in found]
            if rule is not None:
                rules.append(rule)
        when = dict(entry.get("when") or {})
        for key in when:
            if key not in ("serve", "engine", "engine_version", "arch", "flashinfer", "cudnn_below"):
                problems.append(f"{src.where(('rulesets', i, 'when', key))}: unknown condition")
        if "engine" in when and when["engine"] not in SERVING_ENGINES:
            known = ", ".join(SERVING_ENGINES)
            problems.append(f"{src.where(('rulesets', i, 'when', 'engine'))}: unknown serving engine (known: {known})")
        for key in ("flashinfer", "engine_version"):
            if key not in when:
                continue
            try:
                SpecifierSet(str(when[key]))
            except InvalidSpecifier:
                problems.append(f"{src.where(('rulesets', i, 'when', key))}: not a version specifier")
        result.append(RuleSet(id=str(entry.get("id")), when=when, rules=tuple(rules)))
    if problems:
        raise MatrixError(problems)
    return tuple(result)


def rulesets_for(facts: Facts) -> tuple[RuleSet, ...]:
    """The built-in rule sets whose conditions hold for these facts."""
    return tuple(ruleset for ruleset in load_rulesets() if _holds(ruleset.when, facts))


def rules_for(cell: Cell | None, arm: Arm | None, facts: Facts | None) -> tuple[LogRule, ...]:
    """Built-in rule sets whose conditions hold, then the cell's rules, then the arm's."""
    rules: list[LogRule] = []
    if facts is not None:
        for ruleset in rulesets_for(facts):
            rules += ruleset.rules
    rules += cell.log_rules if cell else ()
    rules += arm.log_rules if arm else ()
    return tuple(rules)


def _holds(when: dict[str, Any], facts: Facts) -> bool:
    if "serve" in when and bool(when["serve"]) != facts.serve:
        return False
    if "engine" in when and facts.engine != when["engine"]:
        return False
    if "arch" in when and facts.arch not in when["arch"]:
        return False
    for key, version in (("flashinfer", facts.flashinfer), ("engine_version", facts.engine_version)):
        if key in when and version is not None:
            try:
                if not SpecifierSet(str(when[key])).contains(Version(version), prereleases=True):
                    return False
            except InvalidVersion:
                return False
    return not ("cudnn_below" in when and facts.cudnn is not None and facts.cudnn >= int(when["cudnn_below"]))
