"""Stage `imports`: is the installed stack the one the cell asked for, and does it import?

Every check is a pure function of the probe's report and the cell, returning a `CheckResult`.
`run_imports` is the edge: it runs the probe in a container of the image (no server, no GPU
needed) and applies the checks.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from packaging.markers import InvalidMarker, default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from pipeline.engine import Engine
from pipeline.model import Arm, Cell
from verify.probe import ProbeReport, probe_image
from verify.result import CheckResult, StageResult, Status

__all__ = [
    "BYPASS_ENV",
    "check_bypass_env",
    "check_flashinfer_trio",
    "check_imports",
    "check_overrides",
    "check_requirements",
    "judge",
    "run_imports",
]

STAGE = "imports"
# Setting either of these makes `import flashinfer` skip its own version checks.
BYPASS_ENV = {
    "FLASHINFER_DISABLE_VERSION_CHECK": 'any non-empty value (even "0") disables FlashInfer\'s package version checks',
    "FLASHINFER_CUBIN_DIR": "overrides the installed flashinfer-cubin, and skips the cubin version check",
}
FI_PYTHON, FI_CUBIN, FI_JIT = "flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache"


def run_imports(engine: Engine, cell: Cell, image: str, *, python: str, arm: Arm | None, out_dir: Path) -> StageResult:
    """Probe the image with the env its server would get, keep the probe's JSON, judge it."""
    started = time.monotonic()
    env = cell.serve_env(arm)
    report = probe_image(
        engine, image, python=python, modules=cell.imports, env=env, gpus=cell.serve.gpus if cell.serve else None
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    probe_file = out_dir / "imports-probe.json"
    probe_file.write_text(json.dumps(report.raw, indent=1, sort_keys=True) + "\n")
    return StageResult.of(STAGE, judge(cell, report), time.monotonic() - started, probe=str(probe_file))


def judge(cell: Cell, report: ProbeReport) -> list[CheckResult]:
    """All checks of the stage, in the order a reader wants them."""
    return [
        check_imports(report),
        check_overrides(cell, report),
        check_flashinfer_trio(report),
        check_bypass_env(report),
        check_requirements(cell, report),
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
    `<flashinfer-python>+cuXY` with XY from torch's CUDA. FlashInfer's own import check is looser
    (a prefix match for jit-cache, so 0.6.18.post10 passes next to 0.6.18.post1): both verdicts
    are reported side by side."""
    python = report.dist(FI_PYTHON)
    if python is None:
        return CheckResult(name="flashinfer-trio", status=Status.SKIP, message="flashinfer-python is not installed")
    cubin, jit = report.dist(FI_CUBIN), report.dist(FI_JIT)
    torch_cuda = report.torch.cuda if report.torch else None
    want_jit = f"{python.version}+cu{torch_cuda.replace('.', '')}" if torch_cuda else None
    bypassed = bool(report.env_value("FLASHINFER_DISABLE_VERSION_CHECK"))
    evidence: dict[str, object] = {
        FI_PYTHON: python.version,
        FI_CUBIN: cubin.version if cubin else None,
        FI_JIT: jit.version if jit else None,
        "torch.version.cuda": torch_cuda,
    }
    ours, theirs = [], []
    if cubin is not None and cubin.version != python.version:
        ours.append(f"{FI_CUBIN} {cubin.version} != {FI_PYTHON} {python.version}")
        theirs.append(f"{FI_CUBIN} version ({cubin.version}) does not match flashinfer version ({python.version})")
    if jit is not None:
        if want_jit is None:
            ours.append(f"{FI_JIT} {jit.version} is installed, but torch has no CUDA to match its +cu suffix")
        elif jit.version != want_jit:
            ours.append(f"{FI_JIT} {jit.version} != {want_jit} ({FI_PYTHON} {python.version}, torch CUDA {torch_cuda})")
        if not jit.version.startswith(python.version):
            theirs.append(f"{FI_JIT} version ({jit.version}) does not match flashinfer version ({python.version})")
    evidence["stackproof_verdict"] = "mismatch: " + "; ".join(ours) if ours else "coherent"
    evidence["flashinfer_import_check"] = (
        "skipped: FLASHINFER_DISABLE_VERSION_CHECK is set"
        if bypassed
        else ("raises: " + "; ".join(theirs) if theirs else "passes")
    )
    if ours:
        return CheckResult(name="flashinfer-trio", status=Status.FAIL, message="; ".join(ours), evidence=evidence)
    present = [n for n, d in ((FI_CUBIN, cubin), (FI_JIT, jit)) if d]
    return CheckResult(
        name="flashinfer-trio",
        status=Status.PASS,
        message=f"{FI_PYTHON} {python.version} coherent with {', '.join(present) or 'no companion package'}",
        evidence=evidence,
    )


def check_bypass_env(report: ProbeReport) -> CheckResult:
    found = {name: value for name, value in report.env if name in BYPASS_ENV and value != ""}
    if found:
        reasons = [f"{name}={value!r}: {BYPASS_ENV[name]}" for name, value in sorted(found.items())]
        return CheckResult(name="bypass-env", status=Status.FAIL, message="; ".join(reasons), evidence=found)
    return CheckResult(name="bypass-env", status=Status.PASS, message="no FlashInfer check bypass in the env")


def check_requirements(cell: Cell, report: ProbeReport) -> CheckResult:
    """Installed `Requires-Dist` against installed versions (extras and non-matching markers skipped).

    A conflict on a package the cell overrides is an intentional override of a release pin and is
    recorded; a conflict or absence the cell accepts is recorded with its reason; anything else FAILs.
    """
    environment = _marker_environment(report)
    overridden = {o.name for o in cell.overrides}
    accepted = dict(cell.accepted_conflicts)
    intentional, accepted_seen, problems = [], [], []
    for dist in report.distributions:
        for text in dist.requires:
            try:
                requirement = Requirement(text)
                if requirement.marker is not None and not requirement.marker.evaluate({**environment, "extra": ""}):
                    continue
            except (InvalidRequirement, InvalidMarker):
                continue  # a malformed record is the package's problem, not the stack's
            name = str(canonicalize_name(requirement.name))
            installed = report.dist(name)
            if installed is None:
                finding = {"package": dist.name, "requires": text, "installed": None}
            elif not _satisfies(requirement, installed.version):
                finding = {"package": dist.name, "requires": text, "installed": installed.version}
            else:
                continue
            if name in overridden and installed is not None:
                intentional.append({**finding, "note": "intentional override of a release pin"})
            elif name in accepted:
                accepted_seen.append({**finding, "accepted_because": accepted[name]})
            else:
                problems.append(finding)
    evidence = {"intentional_overrides": intentional, "accepted": accepted_seen, "conflicts": problems}
    if problems:
        first = problems[0]
        what = "missing" if first["installed"] is None else f"installed {first['installed']}"
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        return CheckResult(
            name="requirements",
            status=Status.FAIL,
            message=f"{first['package']} requires {first['requires']}, {what}{more}",
            evidence=evidence,
        )
    notes = []
    if intentional:
        notes.append(
            "intentional override(s): "
            + ", ".join(f"{f['package']} requires {f['requires']}, installed {f['installed']}" for f in intentional)
        )
    if accepted_seen:
        notes.append(f"{len(accepted_seen)} accepted conflict(s)")
    return CheckResult(
        name="requirements",
        status=Status.PASS,
        message="; ".join(notes) or "every declared requirement is satisfied",
        evidence=evidence,
    )


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
