"""The receipt's renderings: JUnit XML for CI viewers, Markdown for a step summary and the report, and
`write_all`, which writes the document with both beside it (atomically, one file at a time). Split from
pipeline/receipt.py, which keeps the document model and its reader."""

from __future__ import annotations

import json
import os
import stat
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from pipeline.guard.jsonfile import jsonable
from pipeline.receipt import Receipt
from pipeline.result import Status

__all__ = ["render_junit", "render_markdown", "write_all"]


# -- JUnit XML -------------------------------------------------------------------------------------


def render_junit(receipt: Receipt) -> str:
    """One testsuite per stage, one testcase per check: FAIL/ERROR fail, SKIP skips, INCONCLUSIVE fails.

    INCONCLUSIVE is reported as a failure so CI viewers do not show green for a check that proved
    nothing; its message says so.
    """
    cell = receipt.cell
    suites = ET.Element("testsuites", name=f"stackproof {cell}")
    total = failures = skipped = 0
    for stage in receipt.stages:
        name = f"{cell}{'/' + receipt.arm if receipt.arm else ''}.{stage.stage}"
        suite = ET.SubElement(suites, "testsuite", name=name, time=f"{stage.seconds:.2f}")
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        for check in stage.checks:
            counts["tests"] += 1
            case = ET.SubElement(suite, "testcase", classname=f"{cell}.{stage.stage}", name=check.name)
            status = check.status
            if status in (Status.FAIL, Status.INCONCLUSIVE):
                counts["failures"] += 1
                failure = ET.SubElement(case, "failure", message=f"{status}: {check.message}"[:1000], type=status)
                failure.text = json.dumps(check.evidence, indent=1, default=str)[:20000]
            elif status is Status.ERROR:
                counts["errors"] += 1
                ET.SubElement(case, "error", message=check.message[:1000], type=status)
            elif status is Status.SKIP:
                counts["skipped"] += 1
                ET.SubElement(case, "skipped", message=check.message[:1000])
            else:
                out = ET.SubElement(case, "system-out")
                out.text = f"{status}: {check.message}"
        for key, value in counts.items():
            suite.set(key, str(value))
        total += counts["tests"]
        failures += counts["failures"] + counts["errors"]
        skipped += counts["skipped"]
    if receipt.status == "NOT_REPRODUCED":
        # Neither red nor green in a CI viewer: the known bug did not show on this host.
        suite = ET.SubElement(suites, "testsuite", name=f"{cell}.expectation", tests="1", skipped="1")
        case = ET.SubElement(suite, "testcase", classname=f"{cell}.expectation", name="expected-failure")
        ET.SubElement(case, "skipped", message=receipt.status_reason[:1000], type="NOT_REPRODUCED")
        total += 1
        skipped += 1
    suites.set("tests", str(total))
    suites.set("failures", str(failures))
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


# -- Markdown ---------------------------------------------------------------------------------------

_ICON = {
    "PASS": "✅",
    "WARN": "⚠️",
    "FAIL": "❌",
    "ERROR": "❌",
    "INCONCLUSIVE": "❔",
    "SKIP": "⏭️",
    "NOT_REPRODUCED": "⭕",
}


def render_markdown(receipt: Receipt) -> str:
    arm = f" / arm `{receipt.arm}`" if receipt.arm else ""
    host = receipt.host
    lines = [
        f"### {_ICON.get(receipt.status, '')} stackproof `{receipt.cell}`{arm}: {receipt.status}",
        "",
        f"{receipt.status_reason}",
        "",
        f"- image `{receipt.image.ref}` id `{receipt.image.id}`",
        f"- host: {host.describe()} (key `{host.key}`), docker {host.docker}"
        + (f", CPU {host.cpu_model} x {host.cpu_cores}" if host.cpu_cores else ""),
        f"- {receipt.seconds:.0f}s, stackproof {receipt.tool_version}, matrix `{receipt.matrix_digest[:19]}`",
        "",
        "| stage | status | seconds | checks |",
        "|---|---|---|---|",
    ]
    for stage in receipt.stages:
        counted: dict[str, int] = {}
        for check in stage.checks:
            counted[check.status] = counted.get(check.status, 0) + 1
        summary = ", ".join(f"{n} {s}" for s, n in sorted(counted.items()))
        lines.append(
            f"| {stage.stage} | {_ICON.get(stage.status, '')} {stage.status} | {stage.seconds:.1f} | {summary} |"
        )
    shown = (Status.FAIL, Status.ERROR, Status.INCONCLUSIVE, Status.WARN)
    bad = [(stage.stage, c) for stage in receipt.stages for c in stage.checks if c.status in shown]
    if bad:
        lines += ["", "**Findings**", ""]
        lines += [f"- {_ICON.get(c.status, '')} `{s}` {c.name}: {_one_line(c.message)}" for s, c in bad[:30]]
    if receipt.load:
        load, q = receipt.load.summary, receipt.load.summary.questions
        ttft, tpot = load.latency_ms.get("ttft", {}), load.latency_ms.get("tpot", {})
        lines += [
            "",
            f"**Load**: {q.clean}/{q.attempted} questions clean, "
            f"{load.throughput.output_tok_s:.0f} output tok/s, TTFT p50/p99 {ttft.get('p50')}/{ttft.get('p99')} ms, "
            f"TPOT p50 {tpot.get('p50')} ms",
        ]
        if receipt.load.correctness:
            lines.append(_correctness_line(receipt.load.correctness))
    cost = _cost_line(receipt.cost, receipt.build)
    if cost:
        lines += ["", cost]
    return "\n".join(lines) + "\n"


def _cost_line(cost: dict[str, Any] | None, build: dict[str, Any] | None) -> str:
    """The numbers of the cost and build sections that have values (CPU cells: CPU-s per token,
    peak RSS, tok/s per core; every cell: build time and image size)."""
    shown = [
        ("CPU-s/token", (cost or {}).get("cpu_seconds_per_output_token"), "{:.5f}"),
        ("peak RSS", (cost or {}).get("peak_rss_bytes"), "bytes"),
        ("tok/s per core", (cost or {}).get("output_tok_s_per_core"), "{:.1f}"),
        ("peak GPU memory", (cost or {}).get("peak_memory_bytes"), "bytes"),
        ("J/token", (cost or {}).get("energy_per_output_token_j"), "{:.3f}"),
        ("build", (build or {}).get("build_seconds"), "{:.0f} s"),
        ("image", (build or {}).get("image_size_bytes"), "bytes"),
    ]
    parts = []
    for name, measure, form in shown:
        value = measure.get("value") if isinstance(measure, dict) else None
        if isinstance(value, int | float):
            parts.append(f"{name} {_bytes(value) if form == 'bytes' else form.format(value)}")
    return "**Cost**: " + ", ".join(parts) if parts else ""


def _bytes(value: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def _correctness_line(section: dict[str, Any]) -> str:
    """Each detector's rate beside the cell's baseline, and the canary score (verify/load/correctness.py)."""
    rates, base = section["rates"], (section["baseline"]["rates"] or {})
    parts = [
        f"{name} {rates[name]:.0%}" + (f" (baseline {base[name]:.0%})" if base.get(name) is not None else "")
        for name in ("loop", "empty", "length", "collapse")
        if rates.get(name) is not None
    ]
    canary = section.get("canary") or {}
    if canary.get("asked"):
        parts.append(f"canary {canary['right']}/{canary['asked']} right (floor {canary['floor']:.0%})")
    note = " (baseline recorded by this run)" if section["baseline"]["recorded_now"] else ""
    return "\n**Correctness**: " + ", ".join(parts) + note


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300].replace("|", "\\|")


def write_all(receipt: Receipt, out_dir: Path) -> dict[str, Path]:
    """receipt.json, junit.xml and summary.md in `out_dir`; the summary also to $GITHUB_STEP_SUMMARY."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"receipt": out_dir / "receipt.json", "junit": out_dir / "junit.xml", "summary": out_dir / "summary.md"}
    # Strict JSON: a NaN or an infinity (which strict parsers reject) is written as null.
    paths["receipt"].write_text(json.dumps(jsonable(receipt.to_json()), indent=2, default=str, allow_nan=False) + "\n")
    paths["junit"].write_text(render_junit(receipt))
    markdown = render_markdown(receipt)
    paths["summary"].write_text(markdown)
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        _append_step_summary(step_summary, markdown)
    return paths


def _append_step_summary(path: str, markdown: str) -> None:
    """The runner's job summary file gets the summary appended. Opened without blocking: a FIFO with no
    reader (or a device) there is refused with a warning instead of waiting for ever; the run's own
    files are written already, so the run goes on."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o644)
    except OSError as exc:
        print(f"stackproof: GITHUB_STEP_SUMMARY={path}: not written ({exc.strerror})", file=sys.stderr)
        return
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            print(f"stackproof: GITHUB_STEP_SUMMARY={path}: not a regular file, not written", file=sys.stderr)
            return
        f.write(markdown + "\n")
