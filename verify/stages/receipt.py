"""Building a receipt from one verification: its status from the stages, and what the stages found
(the image's runtime, the load summary, the autotune winners). The document itself (kind, version,
consistency, JUnit and Markdown) is pipeline/receipt.py."""

from __future__ import annotations

import time
from typing import Any

from pipeline.host.geometry import HostFingerprint
from pipeline.matrix.model import STAGES
from pipeline.receipt import CompileCacheRecord, ImageRef, Receipt, Runtime
from pipeline.result import Status, VerifyReport
from verify.forensics.costreceipt import cost_and_forensics
from verify.serving import DRIVERS

__all__ = ["build_receipt", "build_section", "receipt_status"]

# The serving engines' own distributions (each driver's), then the stack under them.
RUNTIME_DISTS = (
    *(name for driver in DRIVERS.values() for name in driver.distributions),
    *("torch", "flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache", "nvidia-cudnn-cu13"),
)


def receipt_status(report: VerifyReport) -> tuple[str, str]:
    """(PASS | FAIL | INCONCLUSIVE | NOT_REPRODUCED, why)."""
    if not report.outcome.passed:
        return "FAIL", report.outcome.summary
    if report.outcome.not_reproduced:
        return "NOT_REPRODUCED", report.outcome.summary
    if report.outcome.expected_failure is not None:
        return "FAIL", f"a known-bad cell: {report.outcome.summary}"
    unsure = [s.stage for s in report.stages if s.status is Status.INCONCLUSIVE]
    if unsure:
        return "INCONCLUSIVE", f"stages that proved nothing either way: {', '.join(unsure)}"
    missing = [stage for stage in STAGES if stage not in {s.stage for s in report.stages}]
    if missing:  # a partial verification (--stages) proves only part of what "verified" means
        return "INCONCLUSIVE", f"not every stage ran (missing: {', '.join(missing)})"
    if all(s.status is Status.SKIP for s in report.stages):
        return "INCONCLUSIVE", "every stage was skipped"
    return "PASS", report.outcome.summary


def build_receipt(
    report: VerifyReport,
    *,
    matrix_digest: str,
    host: HostFingerprint,
    started_at: float,
    finished_at: float,
    repo_digests: tuple[str, ...] = (),
    image_store: str = "classic",
    build: dict[str, Any] | None = None,
    environment: dict[str, Any] | None = None,
    gpu_access: dict[str, Any] | None = None,
    base: dict[str, Any] | None = None,
) -> Receipt:
    """`environment`: the host runtime's environment (`HostEnv.to_json`); the image fields then
    name it, its inventory digest in place of an image digest."""
    status, reason = receipt_status(report)
    load = report.load
    spent = cost_and_forensics(load, seconds=finished_at - started_at)
    return Receipt(
        status=status,
        status_reason=reason,
        cell=report.cell,
        arm=report.arm,
        image=ImageRef(
            ref=report.image,
            id=report.image_id,
            id_is="environment" if environment else "manifest" if image_store == "containerd" else "config",
            repo_digests=repo_digests,
            runtime="host" if environment else "docker",
            environment=environment,
            gpu_access=gpu_access,
            base=base,
        ),
        matrix_digest=matrix_digest,
        host=host,
        started_at=_iso(started_at),
        finished_at=_iso(finished_at),
        seconds=round(finished_at - started_at, 2),
        outcome=report.outcome,
        stages=report.stages,
        runtime=_runtime(report),
        load=load,
        autotune=_autotune_winners(report),
        servers=report.servers,
        cost=spent["cost"],
        forensics=tuple(spent["forensics"]),
        build=build,
        compile_cache=CompileCacheRecord.of_starts(list(report.servers.get("compile_cache") or [])),
    )


def build_section(*, source: str, made_in_s: float | None, image_size: int | None) -> dict[str, Any]:
    """The receipt's `build`: how the image came to be (built by this run, `local`: found under its
    content tag, `registry`: pulled), how long its build took and how large it is; an empty value
    says why."""
    why = {
        "registry": "pulled from the site's registry: built elsewhere",
        "local": "the image was here already and no log of its build is",
    }.get(source, "the build's time was not recorded")
    seconds: dict[str, Any] = {"value": made_in_s, "unit": "s"}
    if made_in_s is None:
        seconds["reason"] = why
    size = (
        {"value": image_size, "unit": "bytes"}
        if image_size
        else {"value": None, "unit": "bytes", "reason": "the daemon reported no size"}
    )
    return {"source": source, "build_seconds": seconds, "image_size_bytes": size}


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def _runtime(report: VerifyReport) -> Runtime | None:
    """What the image's own stack saw on this host (the imports probe): torch, CUDA, cuDNN, GPUs."""
    probe = report.probe
    if probe is None:
        return None
    versions = {name: d.version for name in RUNTIME_DISTS if (d := probe.dist(name)) is not None}
    torch = probe.torch
    return Runtime(
        python=probe.python_version,
        torch=torch.version if torch else None,
        cuda=torch.cuda if torch else None,
        cudnn=torch.cudnn if torch else None,
        gpus_seen_by_torch=tuple(torch.gpus) if torch else (),
        distributions=versions,
    )


def _autotune_winners(report: VerifyReport) -> tuple[dict[str, Any], ...] | None:
    stage = next((s for s in report.stages if s.stage == "autotune"), None)
    if stage is None:
        return None
    check = next((c for c in stage.checks if c.name == "autotune-cache"), None)
    winners = check.evidence.get("winners") if check else None
    return tuple(winners) if winners else None
