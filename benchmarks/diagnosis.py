"""How well `stackproof inspect log` names what failed, on the real logs of tests/fixtures/logs/real/.

For each log of the corpus (index.yaml: the expected class, incident and phase, judged from the
thread) it runs `python -m pipeline inspect log FILE --json` and counts, over the failing logs:
detected (exit != 0), correct class, correct incident (among the logs that have one), and wrong
attributions (an incident named that the log is not); over the clean logs: false positives (exit
!= 0) and clean logs that carry a FAIL check. `--before DIR` also runs an older checkout (e.g.
`git archive main | tar -x -C DIR`) and reads its JSON, which had signatures but no classes: its
first failing signature is mapped to the class it stands for. Prints a table; asserts nothing.
Usage: python benchmarks/diagnosis.py [--before DIR] [--list]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "fixtures" / "logs" / "real"

# The class each signature of the old catalog stands for (the old output had no classes).
OLD_SIGNATURE_CLASS = {
    "cuda-illegal-memory-access": "illegal-memory-access",
    "cuda-out-of-memory": "out-of-memory",
    "flashinfer-sm120-dynamic-workspace-oom": "out-of-memory",
    "mla-fp8-kv-decode-shared-memory": "triton-out-of-resources",
    "flashinfer-package-mismatch": "flashinfer-version-mismatch",
    "vllm-engine-core-init-failed": "engine-init-failed",
    "ple-offload-engine-init": "engine-init-failed",
    "nvrm-xid-13": "xid-13",
    "nvrm-xid-31": "xid-31",
    "nvrm-xid-43": "xid-43",
    "nvrm-xid-79": "xid-79",
}


@dataclass
class Answer:
    exit_code: int
    cls: str  # the class named ("none" when none)
    incident: str  # the incident named ("none" when none)
    phase: str | None
    fail_checks: list[str] = field(default_factory=list)


@dataclass
class Tally:
    failing: int = 0
    detected: int = 0
    correct_class: int = 0
    with_incident: int = 0
    correct_incident: int = 0
    wrong_attribution: int = 0
    clean: int = 0
    false_positive: int = 0
    clean_with_fail_check: int = 0
    misses: list[str] = field(default_factory=list)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="an older checkout to compare against (its own pipeline/)")
    parser.add_argument("--list", action="store_true", help="print every log's answer")
    args = parser.parse_args()
    index = yaml.safe_load((CORPUS / "index.yaml").read_text())["logs"]
    columns = {"after (this tree)": REPO}
    if args.before:
        columns = {f"before ({args.before})": args.before, **columns}
    results = {name: tally(index, code, verbose=args.list) for name, code in columns.items()}
    rows = [
        ("failing logs", "failing"),
        ("  detected (exit != 0)", "detected"),
        ("  correct class", "correct_class"),
        ("  logs with an expected incident", "with_incident"),
        ("  correct incident", "correct_incident"),
        ("  wrong attribution (an incident it is not)", "wrong_attribution"),
        ("clean logs", "clean"),
        ("  false positives (exit != 0)", "false_positive"),
        ("  clean logs with a FAIL check", "clean_with_fail_check"),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"\nstackproof diagnosis coverage on {len(index)} real logs ({CORPUS.relative_to(REPO)})")
    print(f"  {'':<{width}}  " + "  ".join(f"{name:>24}" for name in results))
    for label, attr in rows:
        print(f"  {label:<{width}}  " + "  ".join(f"{getattr(t, attr):>24}" for t in results.values()))
    for name, t in results.items():
        if t.misses:
            print(f"\n{name}: misses")
            for miss in t.misses:
                print(f"  {miss}")
    return 0


def tally(index: list[dict[str, Any]], code: Path, *, verbose: bool) -> Tally:
    t = Tally()
    for entry in index:
        answer = run(code, CORPUS / entry["file"])
        expected_class = entry["class"]
        if verbose:
            print(f"{code.name}: {entry['file']}: {answer}")
        if entry["status"] == "clean":
            t.clean += 1
            t.false_positive += answer.exit_code != 0
            t.clean_with_fail_check += bool(answer.fail_checks)
            if answer.exit_code != 0:
                t.misses.append(f"{entry['file']}: clean, got {answer.cls} / {answer.incident}")
            continue
        t.failing += 1
        t.detected += answer.exit_code != 0
        phase_ok = "phase" not in entry or answer.phase == entry["phase"]
        good_class = answer.cls == expected_class and phase_ok
        t.correct_class += good_class
        if entry["incident"] != "none":
            t.with_incident += 1
            t.correct_incident += answer.incident == entry["incident"]
        if answer.incident != "none" and answer.incident != entry["incident"]:
            t.wrong_attribution += 1
        if not good_class or answer.incident != entry["incident"]:
            t.misses.append(
                f"{entry['file']}: want {expected_class}/{entry['incident']}"
                f"{'/' + entry['phase'] if 'phase' in entry else ''}, got {answer.cls}/{answer.incident}"
                f"{'/' + answer.phase if answer.phase else ''} (exit {answer.exit_code})"
            )
    return t


def run(code: Path, log: Path) -> Answer:
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "inspect", "log", str(log), "--json"], cwd=code, capture_output=True
    )
    if proc.returncode not in (0, 1):
        return Answer(exit_code=proc.returncode, cls="error", incident="none", phase=None)
    document = json.loads(proc.stdout)
    fails = [c["name"] for c in document.get("checks", []) if c.get("status") == "FAIL"]
    if "diagnosis" in document:
        return _answer_now(proc.returncode, document, fails)
    return _answer_before(proc.returncode, document, fails)


def _answer_now(exit_code: int, document: dict[str, Any], fails: list[str]) -> Answer:
    d = document["diagnosis"]
    if d["class"]:
        cls, phase = d["class"]["id"], d["class"]["phase"]
    elif d["verdict"] == "inconclusive":
        cls, phase = "startup-incomplete", d["startup"]["last_phase"]
    else:
        cls, phase = "none", None
    incident = d["incident"]["id"] if d["incident"] else "none"
    return Answer(exit_code=exit_code, cls=cls, incident=incident, phase=phase, fail_checks=fails)


def _answer_before(exit_code: int, document: dict[str, Any], fails: list[str]) -> Answer:
    """The old output: signature matches with refs, and rule checks (no classes, no phases)."""
    failing = [m for m in document["matches"] if m["kind"] == "signature" and m.get("severity") == "fail"]
    first = failing[0] if failing else None
    if first is not None:
        cls = OLD_SIGNATURE_CLASS.get(first["id"], first["id"])
    elif "forbid:no-traceback" in fails:
        cls = "python-exception"  # "a traceback was seen"
    else:
        cls = "none"
    incident = first["id"] if first is not None and first.get("refs") else "none"
    return Answer(exit_code=exit_code, cls=cls, incident=incident, phase=None, fail_checks=fails)


if __name__ == "__main__":
    raise SystemExit(main())
