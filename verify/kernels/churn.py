"""Judge the allocator-churn probe's counters: does a GEMM allocate device memory on every call?

Pure and stdlib-only (the H200 script imports it with nothing but torch installed). Input: the
document `verify/probes/churn_probe.py` writes (`churn_schema` 1): per GEMM, backend and M, the deltas
of torch.cuda.memory_stats() counters around each steady-state call. Per call:

    transient bytes       = allocated_bytes.all.allocated delta - allocated_bytes.all.current delta
    transient allocations = allocation.all.allocated delta      - allocation.all.current delta

(what the call allocated and gave back before it returned: the output it hands back is current, not
transient). A GEMM and M is `churn` when every measured call's transient bytes exceed the threshold
(the pattern of flashinfer-ai/flashinfer#4549: a 34 MiB private CUTLASS FP4 workspace per call for
M = 1..256 on SM120), `sporadic` when some do, `clean` when none do, `error` when the call raised,
and `unavailable` (with the reason) when the device or the environment cannot run that GEMM.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["CHURN_INCIDENT", "DEFAULT_THRESHOLD", "ChurnVerdict", "judge_churn", "render_table", "summary"]

CHURN_SCHEMA = 1
CHURN_INCIDENT = "flashinfer-ai/flashinfer#4549"
# Below 1 MiB a transient is a scale tensor or a cast the caching allocator serves from its pool
# without fragmenting; the incident's workspace is 34 MiB. `--threshold-bytes` moves it.
DEFAULT_THRESHOLD = 1024 * 1024
VERDICTS = ("churn", "sporadic", "clean", "error", "unavailable")


class ChurnInputError(ValueError):
    """The document is not a churn probe's (wrong schema, missing fields): says which field."""


@dataclass(frozen=True, kw_only=True)
class ChurnVerdict:
    gemm: str
    backend: str
    m: int | None  # None: the GEMM is unavailable here
    verdict: str  # one of VERDICTS
    calls: int = 0
    churn_calls: int = 0  # calls whose transient bytes exceed the threshold
    transient_bytes: int = 0  # median over the measured calls
    transient_allocations: int = 0  # median
    segments: int = 0  # median cudaMalloc calls per call (the caching allocator grew)
    peak_over_start: int = 0  # median
    median_us: float | None = None
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "gemm": self.gemm,
            "backend": self.backend,
            "m": self.m,
            "verdict": self.verdict,
            "calls": self.calls,
            "churn_calls": self.churn_calls,
            "transient_bytes": self.transient_bytes,
            "transient_allocations": self.transient_allocations,
            "segments": self.segments,
            "peak_over_start": self.peak_over_start,
            "median_us": self.median_us,
            "reason": self.reason,
        }


def judge_churn(document: Mapping[str, Any], threshold: int = DEFAULT_THRESHOLD) -> tuple[ChurnVerdict, ...]:
    """One verdict per GEMM, backend and M (one per unavailable GEMM); pure."""
    if document.get("churn_schema") != CHURN_SCHEMA:
        raise ChurnInputError(f"churn_schema: {document.get('churn_schema')!r}, expected {CHURN_SCHEMA}")
    gemms = document.get("gemms")
    if not isinstance(gemms, list):
        raise ChurnInputError("gemms: must be a list")
    verdicts: list[ChurnVerdict] = []
    for i, entry in enumerate(gemms):
        try:
            gemm, backend = str(entry["gemm"]), str(entry["backend"])
            if not entry.get("available"):
                verdicts.append(
                    ChurnVerdict(gemm=gemm, backend=backend, m=None, verdict="unavailable", reason=entry["reason"])
                )
                continue
            verdicts += [_judge_sample(gemm, backend, sample, threshold) for sample in entry["samples"]]
        except (KeyError, TypeError) as exc:
            raise ChurnInputError(f"gemms[{i}]: missing or malformed field {exc}") from exc
    return tuple(verdicts)


def _judge_sample(gemm: str, backend: str, sample: Mapping[str, Any], threshold: int) -> ChurnVerdict:
    m = int(sample["m"])
    if sample.get("error"):
        return ChurnVerdict(gemm=gemm, backend=backend, m=m, verdict="error", reason=str(sample["error"]))
    calls = list(sample["calls"])
    if not calls:
        return ChurnVerdict(gemm=gemm, backend=backend, m=m, verdict="error", reason="no measured calls")
    transient = [_transient(c, "allocated_bytes.all") for c in calls]
    churn_calls = sum(1 for t in transient if t > threshold)
    verdict = "churn" if churn_calls == len(calls) else ("sporadic" if churn_calls else "clean")
    return ChurnVerdict(
        gemm=gemm,
        backend=backend,
        m=m,
        verdict=verdict,
        calls=len(calls),
        churn_calls=churn_calls,
        transient_bytes=_median(transient),
        transient_allocations=_median([_transient(c, "allocation.all") for c in calls]),
        segments=_median([int(c.get("segment.all.allocated", 0)) for c in calls]),
        peak_over_start=_median([int(c.get("peak_over_start", 0)) for c in calls]),
        median_us=sample.get("median_us"),
    )


def _transient(call: Mapping[str, Any], family: str) -> int:
    return int(call[f"{family}.allocated"]) - int(call[f"{family}.current"])


def _median(values: list[int]) -> int:
    return int(statistics.median(values)) if values else 0


def summary(verdicts: tuple[ChurnVerdict, ...]) -> dict[str, Any]:
    """Per GEMM and backend: the M buckets that churn, and whether any did (the headline)."""
    out: dict[str, Any] = {}
    for v in verdicts:
        key = f"{v.gemm} ({v.backend})"
        row = out.setdefault(key, {"churn_m": [], "sporadic_m": [], "error_m": [], "unavailable": None})
        if v.verdict == "unavailable":
            row["unavailable"] = v.reason
        elif v.verdict in ("churn", "sporadic", "error"):
            row[f"{v.verdict}_m"].append(v.m)
    return out


def render_table(verdicts: tuple[ChurnVerdict, ...], threshold: int = DEFAULT_THRESHOLD) -> str:
    """The table the H200 script prints: one line per GEMM, backend and M; unavailable GEMMs say why."""
    lines = [
        f"per-call device allocations (threshold {threshold:,} B transient; {CHURN_INCIDENT})",
        f"{'gemm':<20} {'backend':<8} {'M':>5} {'allocs':>6} {'transient B':>13} {'cudaMalloc':>10} "
        f"{'peak over':>12} {'us':>8}  verdict",
    ]
    for v in verdicts:
        if v.verdict == "unavailable":
            lines.append(f"{v.gemm:<20} {v.backend:<8} {'-':>5}  {v.reason}")
            continue
        if v.verdict == "error":
            lines.append(f"{v.gemm:<20} {v.backend:<8} {v.m:>5}  error: {v.reason[:120]}")
            continue
        us = f"{v.median_us:.1f}" if v.median_us is not None else "-"
        lines.append(
            f"{v.gemm:<20} {v.backend:<8} {v.m:>5} {v.transient_allocations:>6} {v.transient_bytes:>13,} "
            f"{v.segments:>10} {v.peak_over_start:>12,} {us:>8}  {v.verdict}"
            + (f" ({v.churn_calls}/{v.calls} calls)" if v.verdict == "sporadic" else "")
        )
    return "\n".join(lines)
