"""The audit as a table per cell (text) or one JSON document."""

from __future__ import annotations

import dataclasses
from typing import Any

from verify.audit import AuditReport
from verify.audit.checks import Status

__all__ = ["render_json", "render_text"]

SCHEMA_VERSION = 1


def render_json(report: AuditReport) -> dict[str, Any]:
    def finding(f: Any) -> dict[str, Any]:
        d = dataclasses.asdict(f)
        d["status"] = f.status.value
        d["evidence"] = [dataclasses.asdict(e) | {"at": str(e)} for e in f.evidence]
        return d

    return {
        "schema_version": SCHEMA_VERSION,
        "errors": report.errors,
        "warnings": sum(f.status is Status.WARN for c in report.cells for f in c.findings),
        "seconds": round(report.seconds, 2),
        "downloaded": list(report.downloaded),
        "download_seconds": round(report.download_seconds, 2),
        "unavailable_seconds": round(report.unavailable_seconds, 2),
        "cells": [
            {
                "cell": c.cell,
                "arch": c.arch,
                "errors": c.errors,
                "packages": [dataclasses.asdict(p) for p in c.packages],
                "findings": [finding(f) for f in c.findings],
            }
            for c in report.cells
        ],
    }


def render_text(report: AuditReport) -> str:
    lines: list[str] = []
    for c in report.cells:
        lines.append(f"== {c.cell} ({c.arch})")
        for p in c.packages:
            version = p.version or "unpinned"
            note = f"  ({p.note})" if p.note else ""
            lines.append(f"  package  {p.name}=={version:<16} {p.status:<14} {p.source}{note}")
        width = min(max((len(f.subject) for f in c.findings), default=10), 90)
        for f in c.findings:
            subject = f.subject if len(f.subject) <= width else f.subject[: width - 1] + "…"
            evidence = "; ".join(str(e) for e in f.evidence)
            detail = " ".join(x for x in (evidence, f.message) if x)
            lines.append(f"  {f.status.value:<14} {f.kind:<10} {subject:<{width}}  [{f.where}] → {detail}")
        lines.append("")
    errors = report.errors
    warns = sum(f.status is Status.WARN for c in report.cells for f in c.findings)
    lines.append(
        f"audit: {len(report.cells)} cell(s), {errors} error(s), {warns} warning(s) in {report.seconds:.1f}s"
        + (
            f"; downloaded {len(report.downloaded)} wheel(s) in {report.download_seconds:.1f}s"
            if report.downloaded
            else ""
        )
    )
    return "\n".join(lines)
