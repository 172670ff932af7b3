"""The receipt as a document: its kind and version, whether one read back holds together, and its
JUnit XML and Markdown renderings. It sits below the checks (which build receipts, verify/receipt.py)
and the registry work (which gates publishing on them), so both read it without reaching up.

A receipt names the image by its id and the host by its fingerprint; it never claims more. Its
`status` is what publish gates on: PASS only when every stage ran and passed (WARN counts as
passed; SKIP with its reason, e.g. autotune on a CPU cell) and the cell is not a known-bad one kept
to prove a check (`expect: fail`); INCONCLUSIVE when a stage proved nothing either way or only some
stages ran; FAIL otherwise, including a known-bad cell that failed as expected, which is a pipeline
success but never a verified image; NOT_REPRODUCED when a known-bad cell's failure depends on the
host (`may_not_reproduce`) and it did not happen here.
"""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from pipeline.jsonfile import jsonable
from pipeline.model import STAGES
from pipeline.result import Status, worst

__all__ = ["RECEIPT_KIND", "RECEIPT_SCHEMA_VERSION", "receipt_problems", "render_junit", "render_markdown", "write_all"]

RECEIPT_SCHEMA_VERSION = 1
RECEIPT_KIND = "stackproof.receipt"


def receipt_problems(receipt: dict[str, Any]) -> list[str]:
    """Why a receipt read back from a file does not hold together, judged from its own stages.

    A receipt is data anyone can edit: its `status` is believed only when the stages it carries
    give that same status by the rules above (every stage the status of its worst check, the stages
    of a PASS exactly STAGES in order, none FAIL/ERROR/INCONCLUSIVE, the outcome passed, no
    expected failure). Empty: consistent."""
    problems: list[str] = []
    stages = receipt.get("stages")
    if not isinstance(stages, list) or not all(isinstance(s, dict) for s in stages):
        return ["it has no list of stages"]
    for stage in stages:
        try:
            checks = [Status(c["status"]) for c in stage.get("checks") or []]
            claimed = Status(stage["status"])
        except (KeyError, ValueError, TypeError):
            problems.append(f"stage {stage.get('stage')!r} has an unknown status")
            continue
        if checks and worst(checks) is not claimed and not (claimed is Status.PASS and worst(checks) is Status.WARN):
            problems.append(f"stage {stage.get('stage')} says {claimed} but its checks say {worst(checks)}")
    if receipt.get("status") != "PASS":
        return problems
    names = [s.get("stage") for s in stages]
    if names != list(STAGES):
        problems.append(f"a PASS receipt must carry the stages {', '.join(STAGES)} in order, not {names}")
    bad = [f"{s.get('stage')} {s.get('status')}" for s in stages if s.get("status") not in ("PASS", "WARN", "SKIP")]
    if bad:
        problems.append(f"PASS, but stages {', '.join(bad)}")
    if all(s.get("status") == "SKIP" for s in stages):
        problems.append("PASS, but every stage was skipped")
    outcome = receipt.get("outcome") or {}
    if outcome.get("passed") is not True or outcome.get("expected_failure") or outcome.get("not_reproduced"):
        problems.append("PASS, but its outcome is not a plain pass")
    return problems


# -- JUnit XML -------------------------------------------------------------------------------------


def render_junit(receipt: dict[str, Any]) -> str:
    """One testsuite per stage, one testcase per check: FAIL/ERROR fail, SKIP skips, INCONCLUSIVE fails.

    INCONCLUSIVE is reported as a failure so CI viewers do not show green for a check that proved
    nothing; its message says so.
    """
    suites = ET.Element("testsuites", name=f"stackproof {receipt['cell']}")
    total = failures = skipped = 0
    for stage in receipt["stages"]:
        suite = ET.SubElement(
            suites,
            "testsuite",
            name=f"{receipt['cell']}{'/' + receipt['arm'] if receipt['arm'] else ''}.{stage['stage']}",
            time=f"{stage['seconds']:.2f}",
        )
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        for check in stage["checks"]:
            counts["tests"] += 1
            case = ET.SubElement(suite, "testcase", classname=f"{receipt['cell']}.{stage['stage']}", name=check["name"])
            status = check["status"]
            if status in ("FAIL", "INCONCLUSIVE"):
                counts["failures"] += 1
                failure = ET.SubElement(case, "failure", message=f"{status}: {check['message']}"[:1000], type=status)
                failure.text = json.dumps(check["evidence"], indent=1, default=str)[:20000]
            elif status == "ERROR":
                counts["errors"] += 1
                ET.SubElement(case, "error", message=check["message"][:1000], type=status)
            elif status == "SKIP":
                counts["skipped"] += 1
                ET.SubElement(case, "skipped", message=check["message"][:1000])
            else:
                out = ET.SubElement(case, "system-out")
                out.text = f"{status}: {check['message']}"
        for key, value in counts.items():
            suite.set(key, str(value))
        total += counts["tests"]
        failures += counts["failures"] + counts["errors"]
        skipped += counts["skipped"]
    if receipt["status"] == "NOT_REPRODUCED":
        # Neither red nor green in a CI viewer: the known bug did not show on this host.
        suite = ET.SubElement(suites, "testsuite", name=f"{receipt['cell']}.expectation", tests="1", skipped="1")
        case = ET.SubElement(suite, "testcase", classname=f"{receipt['cell']}.expectation", name="expected-failure")
        ET.SubElement(case, "skipped", message=receipt["status_reason"][:1000], type="NOT_REPRODUCED")
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


def render_markdown(receipt: dict[str, Any]) -> str:
    arm = f" / arm `{receipt['arm']}`" if receipt["arm"] else ""
    host = receipt["host"]
    lines = [
        f"### {_ICON.get(receipt['status'], '')} stackproof `{receipt['cell']}`{arm}: {receipt['status']}",
        "",
        f"{receipt['status_reason']}",
        "",
        f"- image `{receipt['image']['ref']}` id `{receipt['image']['id']}`",
        f"- host: {host['summary']} (key `{host['key']}`), docker {host['docker']}",
        f"- {receipt['seconds']:.0f}s, stackproof {receipt['tool']['version']}, "
        f"matrix `{receipt['matrix_digest'][:19]}`",
        "",
        "| stage | status | seconds | checks |",
        "|---|---|---|---|",
    ]
    for stage in receipt["stages"]:
        counted: dict[str, int] = {}
        for check in stage["checks"]:
            counted[check["status"]] = counted.get(check["status"], 0) + 1
        summary = ", ".join(f"{n} {s}" for s, n in sorted(counted.items()))
        icon = _ICON.get(stage["status"], "")
        lines.append(f"| {stage['stage']} | {icon} {stage['status']} | {stage['seconds']:.1f} | {summary} |")
    bad = [
        (stage["stage"], c)
        for stage in receipt["stages"]
        for c in stage["checks"]
        if c["status"] in ("FAIL", "ERROR", "INCONCLUSIVE", "WARN")
    ]
    if bad:
        lines += ["", "**Findings**", ""]
        lines += [f"- {_ICON.get(c['status'], '')} `{s}` {c['name']}: {_one_line(c['message'])}" for s, c in bad[:30]]
    load = receipt.get("load")
    if load:
        ttft, tpot = load["latency_ms"]["ttft"], load["latency_ms"]["tpot"]
        q = load["questions"]
        lines += [
            "",
            f"**Load**: {q['clean']}/{q['attempted']} questions clean, "
            f"{load['throughput']['output_tok_s']:.0f} output tok/s, TTFT p50/p99 {ttft['p50']}/{ttft['p99']} ms, "
            f"TPOT p50 {tpot['p50']} ms",
        ]
    return "\n".join(lines) + "\n"


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300].replace("|", "\\|")


def write_all(receipt: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """receipt.json, junit.xml and summary.md in `out_dir`; the summary also to $GITHUB_STEP_SUMMARY."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"receipt": out_dir / "receipt.json", "junit": out_dir / "junit.xml", "summary": out_dir / "summary.md"}
    # Strict JSON: a NaN or an infinity (which strict parsers reject) is written as null.
    paths["receipt"].write_text(json.dumps(jsonable(receipt), indent=2, default=str, allow_nan=False) + "\n")
    paths["junit"].write_text(render_junit(receipt))
    markdown = render_markdown(receipt)
    paths["summary"].write_text(markdown)
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        with open(step_summary, "a", encoding="utf-8") as f:
            f.write(markdown + "\n")
    return paths
