"""The project's own assumptions about upstream, checked against the text of a cell's pinned wheels.

The stages hold facts about the packages they watch (verify/serving/<engine>.py, keyed by release;
verify/stages/imports.py's FLASHINFER_IMPORT_CHECKS). Each is read here against the wheel of the version
the cell pins, in the package that owns the text (vLLM's lines in vLLM, never in FlashInfer):
- autotune: each announcement regex, the disabled and empty lines can match a message of the engine;
  the cache variable is read by it; every file name of the cache layout is a string the engine or
  FlashInfer spells (`autotune_configs.json`, `autotune_configs_dp{d}_rank{r}.json`, `manifest.json`);
- metrics: each name the load test and the watchdog scrape is defined in the engine's metrics
  modules (`name="vllm:generation_tokens"` on a Counter is exported as `vllm:generation_tokens_total`;
  a Histogram's as `_count`, `_sum` and `_bucket`; prometheus_client's naming);
- dead-engine markers: each is a class the engine defines or text it can print;
- FlashInfer's import-time version checks: whether a mismatched flashinfer-cubin / flashinfer-jit-cache
  makes `import flashinfer` raise or is caught, read from the AST of flashinfer/jit/env.py (the module
  level and the functions it calls), against what FLASHINFER_IMPORT_CHECKS says for that version.
Pure: the caller hands in the indexes and a reader of a wheel's files.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from verify.audit.checks import Evidence, Finding, Status, check_pattern, check_variable
from verify.audit.index import PackageIndex
from verify.audit.meanings import dead_body_findings
from verify.serving.driver import ServingDriver

__all__ = ["Files", "ImportCheck", "assumption_findings", "flashinfer_checks", "literal_text", "metric_definitions"]

# package name -> [(path in the wheel, text)] for the members `wanted` selects
Files = Callable[[str, Callable[[str], bool]], list[tuple[str, str]]]

_METRIC_TYPES = {"counter": "counter", "gauge": "gauge", "histogram": "histogram", "summary": "summary"}
_SUFFIXES = {"counter": ("_total",), "histogram": ("_count", "_sum", "_bucket"), "summary": ("_count", "_sum")}
FLASHINFER_ENV = "flashinfer/jit/env.py"
_CATCHES = frozenset({"RuntimeError", "Exception", "BaseException"})


def assumption_findings(
    driver: ServingDriver,
    version: str | None,
    indexes: dict[str, PackageIndex],
    files: Files,
    flashinfer: str | None,
    unread: tuple[str, ...] = (),
) -> list[Finding]:
    """Every assumption of the cell's engine at `version` (and FlashInfer's at `flashinfer`);
    `unread`: packages the stack pins that could not be read (what only they spell is not checkable)."""
    where = f"verify/serving/{driver.name}.py"
    engine = [indexes[n] for n in driver.distributions if n in indexes]
    out: list[Finding] = []
    if version is not None and engine:
        out += _autotune(driver, version, engine, indexes, files, where, unread)
        out += _metrics(driver, version, engine[0].name, files, where)
        out += _dead_markers(driver, engine, where)
        out += dead_body_findings(driver, version, engine, files)
    if flashinfer is not None and "flashinfer-python" in indexes:
        out += _flashinfer(flashinfer, files)
    return out


def _finding(kind: str, subject: str, where: str, evidence: Evidence | None, message: str) -> Finding:
    if evidence is not None:
        return Finding(kind=kind, subject=subject, where=where, status=Status.OK, evidence=(evidence,))
    return Finding(kind=kind, subject=subject, where=where, status=Status.ERROR, message=message)


def _who(indexes: Sequence[PackageIndex]) -> str:
    return ", ".join(f"{i.name}=={i.version}" for i in indexes)


def literal_text(text: str, indexes: Sequence[PackageIndex]) -> Evidence | None:
    """A message whose own literal text (one piece, not text a hole could fill) holds `text`: the
    stages look for these lines and markers with `in`, so a hole proves nothing."""
    for index in indexes:
        for message in index.messages:
            if any(isinstance(s, str) and text in s for s in message.segments):
                return Evidence(
                    package=index.name,
                    version=index.version,
                    file=message.file,
                    line=message.line,
                    text=message.render(),
                )
    return None


# -- autotune --------------------------------------------------------------------------------------


def _autotune(
    driver: ServingDriver,
    version: str,
    engine: list[PackageIndex],
    indexes: dict[str, PackageIndex],
    files: Files,
    where: str,
    unread: tuple[str, ...] = (),
) -> list[Finding]:
    facts = driver.autotune_at(version)
    if facts is None:
        return []
    out: list[Finding] = []
    for pattern in facts.announcements:
        found = check_pattern(pattern, engine)
        message = (
            f"the autotune announcement the stage reads the path from: no text {_who(engine)} can print matches it"
        )
        out.append(_finding("assumption", f"autotune announcement: {pattern}", where, found, message))
    for name, text in (("disabled line", facts.disabled_line), ("empty line", facts.empty_line)):
        if text:
            message = f"the stage looks for this exact line: no literal text of {_who(engine)} holds it"
            out.append(_finding("assumption", f"autotune {name}: {text}", where, literal_text(text, engine), message))
    variable = check_variable(facts.cache_env, where, engine)
    out.append(
        Finding(
            kind="assumption",
            subject=f"autotune cache variable {facts.cache_env}",
            where=where,
            status=variable.status,
            message=variable.message,
            evidence=variable.evidence,
        )
    )
    writers = [(i.name, i.version) for i in (*engine, indexes.get("flashinfer-python")) if i is not None]
    spelled = _strings(files, writers, _autotune_module)
    for glob in facts.files:
        found = _spells(glob, spelled)
        message = (
            f"the autotune stage looks for {glob!r}, a name no autotune module of "
            f"{', '.join(f'{n}=={v}' for n, v in writers)} spells: "
            "it would find no cache file"
        )
        finding = _finding("assumption", f"autotune cache layout: {glob}", where, found, message)
        if found is None and "flashinfer-python" in unread:  # FlashInfer's writers were not read
            reason = "flashinfer-python is in this stack but could not be read (it writes the cache)"
            finding = dataclasses.replace(finding, status=Status.NOT_CHECKABLE, message=reason)
        out.append(finding)
    return out


@dataclass(frozen=True)
class _String:
    package: str
    version: str
    file: str
    line: int
    text: str  # the literal pieces, holes as `*` (an f-string's `{dp}` -> `*`)


def _strings(files: Files, packages: Iterable[tuple[str, str]], wanted: Callable[[str], bool]) -> list[_String]:
    out: list[_String] = []
    for package, version in packages:
        for path, text in files(package, wanted):
            out += [_String(package, version, path, line, string) for line, string in _source_strings(text)]
    return out


@functools.lru_cache(maxsize=256)
def _source_strings(text: str) -> tuple[tuple[int, str], ...]:
    """(line, text) of each f-string (holes as `*`) and short string constant of a module. Kept per
    text: the cells of one audit read the same autotune modules (an x86_64 and an aarch64 vLLM wheel,
    one FlashInfer for several engines), and each is parsed once."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return ()
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            parts = [v.value if isinstance(v, ast.Constant) else "*" for v in node.values]
            out.append((node.lineno, "".join(str(p) for p in parts)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 200:
            out.append((node.lineno, node.value))
    return tuple(out)


def _spells(glob: str, strings: list[_String]) -> Evidence | None:
    """A string constant or f-string that writes the glob's file name (its last part)."""
    name = glob.rsplit("/", 1)[-1]
    pieces = [p for p in name.split("*") if p]
    directory = [p for p in glob.split("/")[:-1] if p and "*" not in p]
    for s in strings:
        if (_in_order(pieces, s.text) or _could_write(s.text, name)) and all(
            any(d == t.text or f"{d}/" in t.text for t in strings if t.file == s.file) for d in directory
        ):
            return Evidence(package=s.package, version=s.version, file=s.file, line=s.line, text=s.text)
    return None


def _autotune_module(path: str) -> bool:
    # FlashInfer's autotuner.py / autotune_cache.py, vLLM's flashinfer_autotune_cache.py, and vLLM's
    # kernel_warmup.py, where 0.32.0 renames the legacy file per rank (:455-457).
    base = path.rsplit("/", 1)[-1]
    return base.endswith(".py") and ("autotune" in base or base == "kernel_warmup.py")


def _could_write(text: str, name: str) -> bool:
    """An f-string (holes as `*`) that can produce an instance of the glob's name, when the name is
    put together from parts: vLLM 0.32.0 renames the legacy file with
    `f"{cache_path.stem}_dp{dp_rank}_rank{rank}{cache_path.suffix}"` (kernel_warmup.py:455-457).
    Its literal parts must be specific (3 characters or more, one of them more than an extension
    like `.json`) and all of them in the name."""
    if "*" not in text:
        return False
    literals = [p for p in text.split("*") if p]
    if not any(not p.startswith(".") for p in literals) or any(len(p) < 3 for p in literals):
        return False
    if not all(p in name for p in literals):
        return False
    pattern = ".*".join(re.escape(p) for p in text.split("*"))
    return re.fullmatch(pattern, name.replace("*", "0")) is not None


def _in_order(pieces: list[str], text: str) -> bool:
    at = 0
    for p in pieces:
        at = text.find(p, at)
        if at < 0:
            return False
        at += len(p)
    return True


# -- metrics ---------------------------------------------------------------------------------------


def metric_definitions(path: str, text: str) -> dict[str, tuple[str, int]]:
    """name -> (type, line) for `X(name="...")` calls where X names a prometheus metric type
    (`Counter`, `prometheus_client.Gauge`, vLLM's `self._histogram_cls`)."""
    return dict(_metric_definitions(text))


@functools.lru_cache(maxsize=256)
def _metric_definitions(text: str) -> tuple[tuple[str, tuple[str, int]], ...]:
    """metric_definitions, kept per text (the same metrics modules in several wheels of a release)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return ()
    out: dict[str, tuple[str, int]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        label = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        kind = next((k for w, k in _METRIC_TYPES.items() if w in label.lower()), None)
        if kind is None:
            continue
        value = next((k.value for k in node.keywords if k.arg == "name"), node.args[0] if node.args else None)
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            out.setdefault(value.value, (kind, node.lineno))
    return tuple(out.items())


def _exported(defined: dict[str, tuple[str, int]]) -> dict[str, tuple[str, int, str]]:
    """The series names a scrape shows -> (type, line, defined name), as prometheus_client exports them."""
    out: dict[str, tuple[str, int, str]] = {}
    for name, (kind, line) in defined.items():
        base = name.removesuffix("_total") if kind == "counter" else name
        for suffix in _SUFFIXES.get(kind, ("",)):
            out.setdefault(base + suffix, (kind, line, name))
    return out


def _metrics(driver: ServingDriver, version: str, package: str, files: Files, where: str) -> list[Finding]:
    try:
        names = driver.metric_names(version)
    except LookupError as exc:
        return [Finding(kind="assumption", subject="metric names", where=where, status=Status.ERROR, message=str(exc))]
    exported: dict[str, tuple[str, int, str, str]] = {}
    # vLLM keeps them under v1/metrics/ (loggers.py), SGLang in srt/observability/metrics_collector.py.
    for path, text in files(package, _metrics_module):
        for series, (kind, line, defined) in _exported(metric_definitions(path, text)).items():
            exported.setdefault(series, (kind, line, defined, path))
    out = []
    for series in dict.fromkeys(n for n in names.all() if n):
        subject = f"metric {series}"
        if series in exported:
            kind, line, defined, path = exported[series]
            evidence = Evidence(package=package, version=version, file=path, line=line, text=f"{kind} {defined!r}")
            out.append(_finding("assumption", subject, where, evidence, ""))
            continue
        import difflib

        close = difflib.get_close_matches(series, list(exported), n=1, cutoff=0.75)
        hint = f"; closest: {close[0]} ({exported[close[0]][3]}:{exported[close[0]][1]})" if close else ""
        message = (
            f"the load test and the watchdog scrape it, and {package}=={version}'s metrics modules define no such "
            f"series ({len(exported)} seen){hint}"
        )
        out.append(_finding("assumption", subject, where, None, message))
    return out


def _metrics_module(path: str) -> bool:
    return path.endswith(".py") and ("/metrics/" in path or "metrics" in path.rsplit("/", 1)[-1])


# -- dead-engine markers ---------------------------------------------------------------------------


def _dead_markers(driver: ServingDriver, engine: list[PackageIndex], where: str) -> list[Finding]:
    out = []
    for marker in driver.dead_markers:
        evidence: Evidence | None = None
        for index in engine:
            info = index.classes.get(marker)
            if info is not None:
                evidence = Evidence(package=index.name, version=index.version, file=info.file, line=info.line)
                break
        evidence = evidence or literal_text(marker, engine)
        message = (
            f"a dead engine is told by this text in an error body or the log: no class or text of {_who(engine)} "
            "has it, so it can never be seen"
        )
        out.append(_finding("assumption", f"dead-engine marker: {marker}", where, evidence, message))
    return out


# -- FlashInfer's import-time version checks -------------------------------------------------------


@dataclass(frozen=True)
class ImportCheck:
    """What `import flashinfer` does on a mismatched kernel package, as the wheel's code says."""

    package: str  # cubin | jit_cache
    outcome: str  # raises | ignores
    line: int  # the raise, or the try that catches it


def flashinfer_checks(text: str) -> list[ImportCheck]:
    """The version checks run at import of jit/env.py: from each module-level statement, through the
    module's functions it calls, to a `raise` of a version mismatch; caught when a `try` on the way
    handles RuntimeError (or Exception). A check is `raises` if any path leaves it uncaught."""
    tree = ast.parse(text)
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    found: list[ImportCheck] = []
    for statement in tree.body:
        if not isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            _walk(statement, functions, caught=0, chain=(), found=found, depth=0)
    merged: dict[str, ImportCheck] = {}
    for check in found:
        prior = merged.get(check.package)
        if prior is None or (check.outcome == "raises" and prior.outcome != "raises"):
            merged[check.package] = check
    return list(merged.values())


def _walk(
    node: ast.AST,
    functions: dict[str, ast.FunctionDef],
    *,
    caught: int,
    chain: tuple[str, ...],
    found: list[ImportCheck],
    depth: int,
) -> None:
    if isinstance(node, ast.Try):
        catches = any(_catches(h) for h in node.handlers)
        for child in node.body:
            _walk(child, functions, caught=node.lineno if catches else caught, chain=chain, found=found, depth=depth)
        rest: list[ast.AST] = [*node.handlers, *node.orelse, *node.finalbody]
        for after in rest:
            _walk(after, functions, caught=caught, chain=chain, found=found, depth=depth)
        return
    if isinstance(node, ast.Raise) and node.exc is not None:
        text = " ".join([*chain, *_literals(node.exc)])
        if "does not match" in text and "version" in text:
            package = "cubin" if "cubin" in text else "jit_cache" if re.search(r"jit.cache", text) else None
            if package:
                outcome = "ignores" if caught else "raises"
                found.append(ImportCheck(package, outcome, caught or node.lineno))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in functions and depth < 6:
        callee = functions[node.func.id]
        if callee.name not in chain:
            labels = (*chain, callee.name, *(a for n in node.args for a in _literals(n)))
            for statement in callee.body:
                _walk(statement, functions, caught=caught, chain=labels, found=found, depth=depth + 1)
    for sub in ast.iter_child_nodes(node):
        if not isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            _walk(sub, functions, caught=caught, chain=chain, found=found, depth=depth)


def _catches(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any((n.id if isinstance(n, ast.Name) else getattr(n, "attr", "")) in _CATCHES for n in names)


def _literals(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _flashinfer(version: str, files: Files) -> list[Finding]:
    from verify.stages.imports import IGNORES, RAISES, flashinfer_import_check

    where = "verify/stages/imports.py FLASHINFER_IMPORT_CHECKS"
    sources = files("flashinfer-python", lambda p: p == FLASHINFER_ENV)
    if not sources:
        message = f"flashinfer-python=={version} has no {FLASHINFER_ENV}: its import-time checks were not read"
        return [
            Finding(
                kind="assumption",
                subject="flashinfer version check",
                where=where,
                status=Status.NOT_CHECKABLE,
                message=message,
            )
        ]
    checks = {c.package: c for c in flashinfer_checks(sources[0][1])}
    model = flashinfer_import_check(version)
    out = []
    for package, expected, cited in (
        ("cubin", model.cubin, model.cubin_where),
        ("jit_cache", model.jit_cache, model.jit_cache_where),
    ):
        subject = f"flashinfer {package.replace('_', '-')} version check {expected} (row since {model.since})"
        check = checks.get(package)
        if check is None:
            message = f"no version check of flashinfer-{package.replace('_', '-')} runs at import of {FLASHINFER_ENV}"
            out.append(Finding(kind="assumption", subject=subject, where=where, status=Status.ERROR, message=message))
            continue
        actual = RAISES if check.outcome == "raises" else IGNORES
        evidence = Evidence(
            package="flashinfer-python",
            version=version,
            file=FLASHINFER_ENV,
            line=check.line,
            text="raise (uncaught at import)" if check.outcome == "raises" else "caught: try at this line",
        )
        if actual == expected:
            out.append(Finding(kind="assumption", subject=subject, where=where, status=Status.OK, evidence=(evidence,)))
            continue
        message = (
            f"the wheel's check {'raises' if actual == RAISES else 'is caught and the import goes on'} "
            f"(the row cites {cited}): the imports stage would judge this version wrongly; add a row"
        )
        out.append(
            Finding(
                kind="assumption",
                subject=subject,
                where=where,
                status=Status.ERROR,
                message=message,
                evidence=(evidence,),
            )
        )
    return out
