"""Run the kernel probe (on this host, or in a GPU container of a cell's image) and judge its cache.

The probe (`kernel_probe.py`) needs torch with CUDA and flashinfer; this side needs neither. It
reads the probe's report and FlashInfer's own cache file, builds the same winners table and
policy verdict as the autotune stage, and reports whether the bmm_fp8 workspace grew (WARN).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline import cmd
from pipeline.docker.client import Container, Docker, Mount
from pipeline.errors import CheckFailed, InfraError
from pipeline.guard.jsonfile import read_json
from pipeline.result import CheckResult, Status
from verify.kernels.autotune import judge_cache, load_policies, read_cache
from verify.kernels.churn import CHURN_INCIDENT, ChurnInputError, ChurnVerdict, judge_churn
from verify.stages.autotune import winners_table
from verify.stages.probe import PROBE_ROLE

__all__ = ["KERNEL_PROBE_FILE", "KernelProbeResult", "arch_of", "churn_checks", "judge_probe", "probe_kernels"]

_PROBES = Path(__file__).resolve().parents[1] / "verify" / "probes"  # stdlib/torch scripts run on a GPU host
KERNEL_PROBE_FILE = _PROBES / "kernel_probe.py"
CHURN_PROBE_FILE = _PROBES / "churn_probe.py"  # imported by kernel_probe.py --churn


@dataclass(frozen=True, kw_only=True)
class KernelProbeResult:
    arch: str
    report: dict[str, Any]
    table: list[dict[str, Any]]
    checks: list[CheckResult]
    seconds: float
    cache_file: str

    def to_json(self) -> dict[str, Any]:
        return {
            "arch": self.arch,
            "report": self.report,
            "winners": self.table,
            "seconds": self.seconds,
            "cache_file": self.cache_file,
            "checks": [
                {"name": c.name, "status": str(c.status), "message": c.message, "evidence": c.evidence}
                for c in self.checks
            ],
        }


def arch_of(capability: str) -> str:
    """ "12.0" -> "sm120", "9.0" -> "sm90"."""
    major, _, minor = capability.partition(".")
    return f"sm{int(major)}{int(minor or 0)}"


def probe_kernels(
    *,
    config: Path,
    out_dir: Path,
    max_tokens: int,
    python: str,
    arch: str | None,
    docker: Docker | None = None,
    image: str | None = None,
    gpus: str | None = None,
    churn: bool = False,
) -> KernelProbeResult:
    out_dir.mkdir(parents=True, exist_ok=True)
    cache, report = out_dir / "autotune.json", out_dir / "kernel-probe.json"
    for stale in (cache, report):
        stale.unlink(missing_ok=True)  # FlashInfer merges into an existing file: always start fresh
    started = time.monotonic()
    args = ["--max-num-batched-tokens", str(max_tokens), *(["--churn"] if churn else [])]
    if docker is not None and image is not None:
        _probe_in_container(docker, image, config, out_dir, python=python, gpus=gpus, args=args)
    else:
        _check_interpreter(python)
        argv = [python, str(KERNEL_PROBE_FILE), "--config", str(config), "--cache", str(cache), "--report", str(report)]
        try:
            cmd.run([*argv, *args], timeout=3600)
        except cmd.CommandFailed as exc:  # the probe's own traceback: its last line says what broke
            last = (exc.output_tail.strip().splitlines() or ["no output"])[-1][:300]
            raise InfraError(
                f"the kernel probe under --python {python} failed (exit {exc.returncode}): {last}"
            ) from None
    if not report.is_file() or not cache.is_file():
        raise CheckFailed(f"the kernel probe wrote no {'report' if not report.is_file() else 'cache'} in {out_dir}")
    return judge_probe(
        read_json(report, "kernel probe report", mapping=False), cache, arch=arch, seconds=time.monotonic() - started
    )


PROBE_MODULES = ("torch", "flashinfer")  # what verify/probes/kernel_probe.py imports
CHECK_TIMEOUT_S = 120


def _check_interpreter(python: str) -> None:
    """`--python` runs and imports what the probe needs, within CHECK_TIMEOUT_S (issue 43): a missing
    module is exit 3 naming what to install, and a hung interpreter is given up on in minutes, not
    after the probe's hour."""
    script = (
        "import importlib.util, sys; "
        f"print(' '.join(m for m in {PROBE_MODULES!r} if importlib.util.find_spec(m) is None))"
    )
    try:
        done = cmd.run([python, "-c", script], timeout=CHECK_TIMEOUT_S, check=False, quiet=True)
    except InfraError as exc:
        raise InfraError(f"--python {python}: {exc}") from None
    if done.returncode != 0:
        raise InfraError(f"--python {python}: not a working Python interpreter (exit {done.returncode})")
    missing = done.stdout.split()
    if missing:
        packages = " ".join("flashinfer-python" if m == "flashinfer" else m for m in missing)
        raise InfraError(
            f"--python {python} cannot import {', '.join(missing)}: install them into it "
            f"(`{python} -m pip install {packages}`) or probe a built CELL"
        )


def _probe_in_container(
    docker: Docker, image: str, config: Path, out_dir: Path, *, python: str, gpus: str | None, args: list[str]
) -> None:
    """The probe in a named GPU container whose outputs stay inside it (an anonymous volume) and are
    read out with `docker cp`: the image runs as root and FlashInfer writes its cache 0600, which an
    ordinary runner user could not read through a bind mount. Removed on every path, Ctrl-C too."""
    out = "/stackproof/out"
    container = Container(
        image=image,
        name=f"stackproof-kernels-{uuid.uuid4().hex[:12]}",
        role=PROBE_ROLE,
        command=(
            *(python, "/stackproof/kernel_probe.py", "--config", "/stackproof/config.json"),
            *("--cache", f"{out}/autotune.json", "--report", f"{out}/kernel-probe.json", *args),
        ),
        mounts=(
            Mount(source=KERNEL_PROBE_FILE, target="/stackproof/kernel_probe.py"),
            Mount(source=CHURN_PROBE_FILE, target="/stackproof/churn_probe.py"),
            Mount(source=config.resolve(), target="/stackproof/config.json"),
        ),
        volumes=(out,),
        network="none",
        gpus=gpus or "all",
    )
    with docker.removing(container.name):
        docker.run(container, timeout=3600)  # a non-zero exit raises, with the output's tail
        for file in ("autotune.json", "kernel-probe.json"):
            docker.copy_out(container.name, f"{out}/{file}", out_dir / file)


def judge_probe(report: dict[str, Any], cache_file: Path, *, arch: str | None, seconds: float) -> KernelProbeResult:
    """Pure but for reading the cache: the winners table, the policy verdict and the workspace."""
    arch = arch or arch_of(str(report.get("capability", "0.0")))
    cache = read_cache(cache_file)
    table = winners_table(cache)
    checks = []
    probed = {(s["n"], s["k"]) for s in report.get("shapes", {}).values()}
    tuned = {(t["n"], t["k"]) for t in table}
    status = Status.PASS if probed == tuned else Status.FAIL
    checks.append(
        CheckResult(
            name="cache-covers-probe",
            status=status,
            evidence={"probed": sorted(probed), "in_cache": sorted(tuned)},
            message=f"FlashInfer's cache holds {len(tuned)} of the {len(probed)} probed shapes",
        )
    )
    checks += judge_cache(
        cache,
        arch=arch,
        policies=load_policies(),
        expected={
            "flashinfer_version": report.get("flashinfer"),
            "cudnn_version": str(report["cudnn"]) if report.get("cudnn") else None,
        },
    )
    workspace = report.get("workspace") or {}
    if workspace.get("grew") is None:
        checks.append(
            CheckResult(
                name="workspace",
                status=Status.SKIP,
                evidence=workspace,
                message=str(workspace.get("found_in", "workspace size unknown")),
            )
        )
    elif workspace["grew"]:
        checks.append(
            CheckResult(
                name="workspace",
                status=Status.WARN,
                evidence=workspace,
                message=f"the shared bmm_fp8 workspace grew to {workspace['bytes']:,} bytes "
                f"(default {workspace['default_bytes']:,}): the cuDNN resize_ path ran; under "
                "CUDA graph capture this is the suspected SM120 fault mechanism",
            )
        )
    else:
        checks.append(
            CheckResult(
                name="workspace",
                status=Status.PASS,
                evidence=workspace,
                message=f"the shared bmm_fp8 workspace stayed at {workspace['bytes']:,} bytes",
            )
        )
    checks += churn_checks(report.get("churn"))
    return KernelProbeResult(
        arch=arch, report=report, table=table, checks=checks, seconds=round(seconds, 1), cache_file=str(cache_file)
    )


def churn_checks(documents: list[dict[str, Any]] | None) -> list[CheckResult]:
    """One item per probed shape and GEMM: WARN where every steady-state call allocates (churn),
    SKIP saying why where the GEMM cannot run here; nothing when the probe ran without --churn."""
    checks: list[CheckResult] = []
    for document in documents or []:
        try:
            verdicts = judge_churn(document)
        except ChurnInputError as exc:
            checks.append(CheckResult(name="allocator-churn", status=Status.ERROR, message=str(exc)))
            continue
        for (gemm, backend), rows in _by_gemm(verdicts).items():
            name = f"allocator-churn:{document.get('shape', '?')}:{gemm}:{backend}"
            evidence = {"n": document.get("n"), "k": document.get("k"), "verdicts": [v.to_json() for v in rows]}
            checks.append(CheckResult(name=name, evidence=evidence, **_churn_status(gemm, rows)))
    return checks


def _by_gemm(verdicts: tuple[ChurnVerdict, ...]) -> dict[tuple[str, str], list[ChurnVerdict]]:
    grouped: dict[tuple[str, str], list[ChurnVerdict]] = {}
    for v in verdicts:
        grouped.setdefault((v.gemm, v.backend), []).append(v)
    return grouped


def _churn_status(gemm: str, rows: list[ChurnVerdict]) -> dict[str, Any]:
    if rows[0].verdict == "unavailable":
        return {"status": Status.SKIP, "message": rows[0].reason}
    churn = [v for v in rows if v.verdict in ("churn", "sporadic")]
    errors = [v for v in rows if v.verdict == "error"]
    if churn:
        worst = max(churn, key=lambda v: v.transient_bytes)
        return {
            "status": Status.WARN,
            "message": f"{gemm} allocates per call (churn) at M={','.join(str(v.m) for v in churn)} "
            f"(up to {worst.transient_bytes:,} transient bytes per call; {CHURN_INCIDENT})",
        }
    if errors and len(errors) == len(rows):
        return {"status": Status.SKIP, "message": f"{gemm}: every M raised: {errors[0].reason}"}
    note = f"; M={','.join(str(v.m) for v in errors)} raised" if errors else ""
    return {"status": Status.PASS, "message": f"{gemm}: no per-call allocation beyond the output{note}"}
