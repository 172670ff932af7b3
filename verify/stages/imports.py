"""Stage `imports`: is the installed stack the one the cell asked for, and does it import?

Every check is a pure function of the probe's report and the cell, returning a `CheckResult`.
`run_imports` is the edge: it runs the probe in a container of the image (no server, no GPU
needed) and applies the checks.

A base image may ship conflicts of its own: vLLM v0.28.0's Dockerfile forces NCCL 2.30.7 where
torch 2.13.0 requires ==2.29.7. The cell cannot be blamed for those, so the untouched base is
probed too (once per base image id, cached) and only the conflicts the cell's own layers add are
judged; inherited ones are a WARN that names the base.
"""

from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.markers import InvalidMarker, default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from pipeline.cache import cache_dir
from pipeline.cmd import CommandFailed
from pipeline.docker.client import Docker
from pipeline.errors import CheckFailed, InfraError
from pipeline.findings import Distribution, ProbeReport
from pipeline.matrix.model import Arm, Cell
from pipeline.result import CheckResult, StageResult, Status
from verify.runtime import Runtime, as_runtime
from verify.runtime.docker import DockerRuntime
from verify.stages.probe import probe_image

__all__ = [
    "BYPASS_ENV",
    "check_bypass_env",
    "check_flashinfer_trio",
    "check_imports",
    "check_overrides",
    "check_requirements",
    "flashinfer_import_check",
    "judge",
    "probe_base",
    "requirement_findings",
    "run_imports",
]

STAGE = "imports"
# Setting either of these makes `import flashinfer` skip its own version checks.
BYPASS_ENV = {
    "FLASHINFER_DISABLE_VERSION_CHECK": 'any non-empty value (even "0") disables FlashInfer\'s package version checks',
    "FLASHINFER_CUBIN_DIR": "overrides the installed flashinfer-cubin, and skips the cubin version check",
}
FI_PYTHON, FI_CUBIN, FI_JIT = "flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache"


Finding = tuple[str, str, str | None]  # (requiring package, requirement text, installed version or None)


@dataclass(frozen=True, kw_only=True)
class BaseProbe:
    """What the untouched base image carries: its name for messages, and its conflicts."""

    name: str  # e.g. "vllm-openai-0.28.0 (vllm/vllm-openai:v0.28.0)"
    image_id: str
    findings: tuple[Finding, ...]


def run_imports(
    runtime: Runtime | Docker,
    cell: Cell,
    image: str,
    *,
    python: str,
    arm: Arm | None,
    out_dir: Path,
    base_ref: str | None = None,
) -> StageResult:
    """Probe the image with the env its server would get, keep the probe's JSON, judge it.

    With `base_ref`, the untouched base is probed as well (cached by its image id), so that the
    requirements check judges only what the cell's layers changed."""
    started = time.monotonic()
    env = cell.serve_env(arm)
    runtime = as_runtime(runtime)
    report = probe_image(
        runtime, image, python=python, modules=cell.imports, env=env, gpus=cell.serve.gpus if cell.serve else None
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    probe_file = out_dir / "imports-probe.json"
    probe_file.write_text(json.dumps(report.raw, indent=1, sort_keys=True) + "\n")
    # The untouched base is an image: only the docker runtime has one to probe.
    docker = runtime.docker if isinstance(runtime, DockerRuntime) else None
    base, base_note = probe_base(docker, cell, base_ref, python=python) if base_ref and docker else (None, None)
    checks = judge(cell, report, base)
    if base_note:
        checks.append(CheckResult(name="base-probe", status=Status.WARN, message=base_note))
    return StageResult.of(STAGE, checks, time.monotonic() - started, probe_report=report, probe=str(probe_file))


def probe_base(docker: Docker, cell: Cell, base_ref: str, *, python: str) -> tuple[BaseProbe | None, str | None]:
    """The base's conflicts, from a probe of the untouched base image cached by its image id.

    A registry base that is not local is pulled once (progress on stderr). When the base cannot be
    had, (None, why): the requirements check then judges every conflict as the cell's own."""
    name = f"{cell.base.name} ({base_ref})"
    info = docker.image(base_ref)
    if info is None:
        print(f"imports: pulling base {base_ref} to probe it untouched (once per base digest)", file=sys.stderr)
        try:
            docker.pull(base_ref)
        except (CommandFailed, InfraError) as exc:
            return None, f"base {name} could not be pulled to probe it ({exc}); its conflicts count as the cell's"
        info = docker.image(base_ref)
        if info is None:
            return None, f"base {name} is not available after a pull; its conflicts count as the cell's"
    cached = cache_dir() / "base-probes" / f"{info.id.replace(':', '-')}.json"
    try:
        report = ProbeReport.parse(json.loads(cached.read_text()))
    except (OSError, ValueError, KeyError, CheckFailed):
        report = probe_image(docker, base_ref, python=python, modules=(), env={})
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_text(json.dumps(report.raw, sort_keys=True) + "\n")
    return BaseProbe(name=name, image_id=info.id, findings=tuple(requirement_findings(report))), None


def judge(cell: Cell, report: ProbeReport, base: BaseProbe | None = None) -> list[CheckResult]:
    """All checks of the stage, in the order a reader wants them."""
    return [
        check_imports(report),
        check_overrides(cell, report),
        check_flashinfer_trio(report),
        check_bypass_env(report),
        check_requirements(cell, report, base),
    ]


def check_imports(report: ProbeReport) -> CheckResult:
    failed = [o for o in report.imports if not o.ok and not (o.absent and o.optional)]
    evidence: dict[str, object] = {
        o.module: ("ok" if o.ok else ("absent (optional)" if o.absent and o.optional else o.quoted))
        for o in report.imports
    }
    if failed:
        first = failed[0]
        evidence["traceback"] = list(first.traceback)
        return CheckResult(
            name="import", status=Status.FAIL, message=f"import {first.module} raised {first.quoted}", evidence=evidence
        )
    imported = [o.module for o in report.imports if o.ok]
    return CheckResult(
        name="import", status=Status.PASS, message=f"imported {', '.join(imported) or 'nothing'}", evidence=evidence
    )


def check_overrides(cell: Cell, report: ProbeReport) -> CheckResult:
    if not cell.overrides:
        return CheckResult(name="overrides", status=Status.SKIP, message="the cell declares no overrides")
    evidence = {}
    wrong = []
    for override in cell.overrides:
        dist = report.dist(override.name)
        got = dist.version if dist else None
        evidence[override.name] = {"pinned": override.version, "installed": got, "index": override.index}
        if got is None or not _same_version(got, override.version):
            wrong.append(f"{override.name}: pinned {override.version}, installed {got or 'nothing'}")
    if wrong:
        return CheckResult(name="overrides", status=Status.FAIL, message="; ".join(wrong), evidence=evidence)
    return CheckResult(
        name="overrides",
        status=Status.PASS,
        message=f"{len(cell.overrides)} override(s) installed at their pinned versions",
        evidence=evidence,
    )


def check_flashinfer_trio(report: ProbeReport) -> CheckResult:
    """flashinfer-cubin must equal flashinfer-python exactly; flashinfer-jit-cache must be
    `<flashinfer-python>+cuXY` with XY from torch's CUDA, and from 0.7.0 on (a shim) it needs its
    per-architecture providers at the shim's version. FlashInfer's own import check is looser (a
    prefix match for jit-cache, so 0.6.18.post10 passes next to 0.6.18.post1) and, from 0.7.2 on,
    ignores a mismatched kernel package instead of raising: kernels are then downloaded or compiled
    at start, which a verified image must never do. Both verdicts are reported side by side."""
    python = report.dist(FI_PYTHON)
    if python is None:
        return CheckResult(name="flashinfer-trio", status=Status.SKIP, message="flashinfer-python is not installed")
    cubin, jit = report.dist(FI_CUBIN), report.dist(FI_JIT)
    providers = [d for d in report.distributions if _JIT_PROVIDER.fullmatch(d.name)]
    model = flashinfer_import_check(python.version)
    torch_cuda = report.torch.cuda if report.torch else None
    want_jit = f"{python.version}+cu{torch_cuda.replace('.', '')}" if torch_cuda else None
    bypassed = bool(report.env_value("FLASHINFER_DISABLE_VERSION_CHECK"))
    evidence: dict[str, object] = {
        FI_PYTHON: python.version,
        FI_CUBIN: cubin.version if cubin else None,
        FI_JIT: jit.version if jit else None,
        "torch.version.cuda": torch_cuda,
    }
    if model.providers:
        evidence["flashinfer-jit-cache providers"] = {d.name: d.version for d in providers}
    ours: list[str] = []
    theirs: dict[str, list[str]] = {RAISES: [], IGNORES: []}
    if cubin is not None and cubin.version != python.version:
        if model.cubin == IGNORES and not bypassed:
            ours.append(
                f"{FI_PYTHON} {python.version} ignores {FI_CUBIN} {cubin.version} (not {python.version}) and "
                f"would download cubins at start, which a verified image must never do ({model.cubin_where})"
            )
        else:
            ours.append(f"{FI_CUBIN} {cubin.version} != {FI_PYTHON} {python.version}")
        theirs[model.cubin].append(
            f"{FI_CUBIN} version ({cubin.version}) does not match flashinfer version ({python.version})"
        )
    if jit is not None:
        if want_jit is None:
            ours.append(f"{FI_JIT} {jit.version} is installed, but torch has no CUDA to match its +cu suffix")
        elif jit.version != want_jit:
            ours.append(f"{FI_JIT} {jit.version} != {want_jit} ({FI_PYTHON} {python.version}, torch CUDA {torch_cuda})")
        if not model.jit_cache_matches(jit.version, python.version):
            theirs[model.jit_cache].append(
                f"{FI_JIT} version ({jit.version}) does not match flashinfer version ({python.version})"
            )
            if model.jit_cache == IGNORES and not bypassed:
                ours.append(
                    f"{FI_PYTHON} {python.version} ignores {FI_JIT} {jit.version} and would JIT-compile "
                    f"kernels at start ({model.jit_cache_where})"
                )
    if model.providers:
        ours.extend(_provider_findings(model, jit, providers, theirs))
    # What FlashInfer itself said while importing: proof where the model above has none.
    logged = _flashinfer_import_log(report)
    if logged:
        evidence["flashinfer_import_log"] = logged
        if not ours and not bypassed:
            ours.append(f"import flashinfer ignored a kernel package: {logged[0]}")
    evidence["stackproof_verdict"] = "mismatch: " + "; ".join(ours) if ours else "coherent"
    if bypassed:
        evidence["flashinfer_import_check"] = "skipped: FLASHINFER_DISABLE_VERSION_CHECK is set"
    elif theirs[RAISES]:
        evidence["flashinfer_import_check"] = "raises: " + "; ".join(theirs[RAISES])
    elif theirs[IGNORES]:
        evidence["flashinfer_import_check"] = "ignores, and downloads or compiles kernels at start: " + "; ".join(
            theirs[IGNORES]
        )
    else:
        evidence["flashinfer_import_check"] = "passes"
    if ours:
        return CheckResult(name="flashinfer-trio", status=Status.FAIL, message="; ".join(ours), evidence=evidence)
    present = [d.name for d in (cubin, jit, *providers) if d]
    return CheckResult(
        name="flashinfer-trio",
        status=Status.PASS,
        message=f"{FI_PYTHON} {python.version} coherent with {', '.join(present) or 'no companion package'}",
        evidence=evidence,
    )


RAISES, IGNORES = "raises", "ignores"
# Provider wheels are named so (flashinfer/__main__.py:221 @0.7.4).
_JIT_PROVIDER = re.compile(r"flashinfer-jit-cache-sm[0-9]{2,3}[af]?")
# FlashInfer's warnings when it goes on without a kernel package (flashinfer/jit/env.py:122-127,
# 204-208, 219-223 @0.7.4).
_IGNORING = re.compile(r"Ignoring incompatible flashinfer[- ](?:cubin|jit-cache)")


@dataclass(frozen=True, kw_only=True)
class FlashInferImportCheck:
    """What `import flashinfer` does about a kernel package of another version, from a release on."""

    since: str  # the first flashinfer-python release that behaves so
    cubin: str  # RAISES or IGNORES
    cubin_where: str  # upstream file:line @version
    jit_cache: str
    jit_cache_where: str
    providers: bool  # jit-cache is a shim over per-architecture provider wheels
    jit_cache_exact: bool  # the shim must be `<version>` or `<version>+...`, not a mere prefix

    def jit_cache_matches(self, jit: str, python: str) -> bool:
        if self.jit_cache_exact:
            return jit == python or jit.startswith(f"{python}+")
        return jit.startswith(python)


# Keyed by release, newest last: when upstream changes its check, add a row, never edit one.
FLASHINFER_IMPORT_CHECKS: tuple[FlashInferImportCheck, ...] = (
    FlashInferImportCheck(
        since="0",
        cubin=RAISES,
        cubin_where="flashinfer/jit/env.py:97-98 @0.6.18.post1",
        jit_cache=RAISES,  # a prefix check: env.py:132 @0.6.18.post1
        jit_cache_where="flashinfer/jit/env.py:132 @0.6.18.post1",
        providers=False,
        jit_cache_exact=False,
    ),
    # jit-cache becomes a shim; a provider of another version is skipped with a warning
    # (env.py:192-196 @0.7.0), a mismatched cubin or shim still raises (env.py:105-110, 151 and 182).
    FlashInferImportCheck(
        since="0.7.0",
        cubin=RAISES,
        cubin_where="flashinfer/jit/env.py:105-110 @0.7.0",
        jit_cache=RAISES,
        jit_cache_where="flashinfer/jit/env.py:151, 182 @0.7.0",
        providers=True,
        jit_cache_exact=True,
    ),
    # A mismatched cubin or shim is ignored with a warning, and the import goes on: cubins are
    # downloaded on demand, kernels JIT-compiled (env.py:119-127 and 199-209 @0.7.2, the same
    # lines @0.7.4). 0.7.1 still raised (env.py:105).
    FlashInferImportCheck(
        since="0.7.2",
        cubin=IGNORES,
        cubin_where="flashinfer/jit/env.py:119-127 @0.7.4",
        jit_cache=IGNORES,
        jit_cache_where="flashinfer/jit/env.py:199-209 @0.7.4",
        providers=True,
        jit_cache_exact=True,
    ),
)


def flashinfer_import_check(version: str) -> FlashInferImportCheck:
    """The row of FLASHINFER_IMPORT_CHECKS for this flashinfer-python version (the oldest for one
    that does not parse)."""
    try:
        parsed = Version(version).release
    except InvalidVersion:
        return FLASHINFER_IMPORT_CHECKS[0]
    rows = [row for row in FLASHINFER_IMPORT_CHECKS if Version(row.since).release <= parsed]
    return rows[-1] if rows else FLASHINFER_IMPORT_CHECKS[0]


def _provider_findings(
    model: FlashInferImportCheck,
    jit: Distribution | None,
    providers: list[Distribution],
    theirs: dict[str, list[str]],
) -> list[str]:
    """0.7's per-architecture jit-cache providers: each at the shim's exact version, and a shim
    never alone (env.py:174-187 and 211-224 @0.7.4)."""
    if jit is None:
        return [
            f"{d.name} {d.version} is installed without the {FI_JIT} shim, which FlashInfer finds providers through"
            for d in providers
        ]
    if not providers:
        return [
            f"{FI_JIT} {jit.version} is a shim since 0.7.0 and no flashinfer-jit-cache-sm* provider is installed: "
            f"kernels would be JIT-compiled at start ({model.jit_cache_where})"
        ]
    findings = []
    for d in providers:
        if d.version != jit.version:
            theirs[IGNORES].append(f"{d.name} version ({d.version}) does not match {FI_JIT} version ({jit.version})")
            findings.append(f"{d.name} {d.version} != {FI_JIT} {jit.version}: FlashInfer ignores that provider")
    return findings


def _flashinfer_import_log(report: ProbeReport) -> list[str]:
    outcome = next((o for o in report.imports if o.module == "flashinfer"), None)
    return [line for line in (outcome.log if outcome else ()) if _IGNORING.search(line)]


def check_bypass_env(report: ProbeReport) -> CheckResult:
    found = {name: value for name, value in report.env if name in BYPASS_ENV and value != ""}
    if found:
        reasons = [f"{name}={value!r}: {BYPASS_ENV[name]}" for name, value in sorted(found.items())]
        return CheckResult(name="bypass-env", status=Status.FAIL, message="; ".join(reasons), evidence=found)
    return CheckResult(name="bypass-env", status=Status.PASS, message="no FlashInfer check bypass in the env")


def requirement_findings(report: ProbeReport) -> list[Finding]:
    """Every installed `Requires-Dist` the installed versions do not meet (extras and
    non-matching markers skipped): (requiring package, requirement, installed version or None)."""
    environment = _marker_environment(report)
    findings: list[Finding] = []
    for dist in report.distributions:
        for text in dist.requires:
            try:
                requirement = Requirement(text)
                if requirement.marker is not None and not requirement.marker.evaluate({**environment, "extra": ""}):
                    continue
            except (InvalidRequirement, InvalidMarker):
                continue  # a malformed record is the package's problem, not the stack's
            installed = report.dist(str(canonicalize_name(requirement.name)))
            if installed is None:
                findings.append((dist.name, text, None))
            elif not _satisfies(requirement, installed.version):
                findings.append((dist.name, text, installed.version))
    return findings


def check_requirements(cell: Cell, report: ProbeReport, base: BaseProbe | None = None) -> CheckResult:
    """Installed `Requires-Dist` against installed versions.

    A conflict on a package the cell overrides is an intentional override of a release pin and is
    recorded; a conflict or absence the cell accepts is recorded with its reason; one the untouched
    base already has is inherited (WARN, naming the base); anything else FAILs.
    """
    overridden = {o.name for o in cell.overrides}
    accepted = dict(cell.accepted_conflicts)
    inherited_from = set(base.findings) if base else set()
    intentional, accepted_seen, inherited, problems = [], [], [], []
    for package, text, version in requirement_findings(report):
        finding: dict[str, Any] = {"package": package, "requires": text, "installed": version}
        name = str(canonicalize_name(Requirement(text).name))
        if name in overridden and version is not None:
            intentional.append({**finding, "note": "intentional override of a release pin"})
        elif name in accepted:
            accepted_seen.append({**finding, "accepted_because": accepted[name]})
        elif (package, text, version) in inherited_from:
            inherited.append({**finding, "inherited_from": base.name if base else ""})
        else:
            problems.append(finding)
    evidence = {
        "intentional_overrides": intentional,
        "accepted": accepted_seen,
        "inherited": inherited,
        "conflicts": problems,
        "base": {"name": base.name, "image_id": base.image_id} if base else None,
    }
    if problems:
        first = problems[0]
        what = "missing" if first["installed"] is None else f"installed {first['installed']}"
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        origin = " (added by this cell's layers)" if base else ""
        return CheckResult(
            name="requirements",
            status=Status.FAIL,
            message=f"{first['package']} requires {first['requires']}, {what}{more}{origin}",
            evidence=evidence,
        )
    notes = []
    if inherited and base is not None:
        notes.append(
            f"{len(inherited)} conflict(s) inherited from base {base.name}, not added by this cell: "
            + "; ".join(f"{f['package']} requires {f['requires']}, {_installed(f)}" for f in inherited[:3])
        )
    if intentional:
        notes.append(
            "intentional override(s): "
            + ", ".join(f"{f['package']} requires {f['requires']}, installed {f['installed']}" for f in intentional)
        )
    if accepted_seen:
        notes.append(f"{len(accepted_seen)} accepted conflict(s)")
    return CheckResult(
        name="requirements",
        status=Status.WARN if inherited else Status.PASS,
        message="; ".join(notes) or "every declared requirement is satisfied",
        evidence=evidence,
    )


def _installed(finding: dict[str, Any]) -> str:
    return "missing" if finding["installed"] is None else f"installed {finding['installed']}"


def _marker_environment(report: ProbeReport) -> dict[str, str]:
    environment: dict[str, str] = {k: str(v) for k, v in default_environment().items()}
    major_minor = ".".join(report.python_version.split(".")[:2])
    environment.update(
        {
            "python_version": major_minor,
            "python_full_version": report.python_version,
            "sys_platform": report.platform,
            "platform_machine": report.machine,
            "platform_system": "Linux" if report.platform.startswith("linux") else environment["platform_system"],
        }
    )
    return environment


def _satisfies(requirement: Requirement, version: str) -> bool:
    try:
        return requirement.specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def _same_version(installed: str, pinned: str) -> bool:
    try:
        return Version(installed) == Version(pinned)
    except InvalidVersion:
        return installed == pinned
