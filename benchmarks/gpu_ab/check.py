"""What the GPU session's documents must show (issue 45, "Done when"), read back from a directory.

In DIR (the $OUT of the gpu_ab scripts, then kept as tests/fixtures/gpu_ab/):
- aa*.ab.json: every A/A report (`stackproof ab CELL CELL`): no false alarm (no metric called a
  REGRESSION or an IMPROVEMENT of the cell against itself), and the NO CHANGE rate with pairs and
  minutes to the verdict; the engines compared (both KV caches read, not REFUSED);
- ab-one-seq.ab.json: the known-direction A/B: REGRESSION with output tok/s down;
- bisect.bisect.json: the bisect names 5.0 as the first bad version.
Prints one line per claim (PASS/FAIL and the figures) and exits 1 when any fails, 2 when a
document is missing or not one. The unit tier runs the same checks on documents made there
(tests/unit/test_ab_gpu_check.py), both ways.

Usage: python benchmarks/gpu_ab/check.py DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
FIRST_BAD = "5.0"


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"{path}: {exc}") from None
    if not isinstance(data, dict):
        raise SystemExit(f"{path}: not a JSON object")
    return data


def check_aa(reports: list[dict[str, Any]]) -> list[tuple[bool, str]]:
    if not reports:
        return [(False, "A/A: no aa*.ab.json")]
    out = []
    alarms = [r for r in reports if any(m["verdict"] in ("REGRESSION", "IMPROVEMENT") for m in r["metrics"])]
    calls = sum(len(r["metrics"]) for r in reports)
    out.append((not alarms, f"A/A false alarms: {len(alarms)}/{len(reports)} runs ({calls} metric verdicts)"))
    no_change = [r for r in reports if r["verdict"] == "NO CHANGE"]
    pairs = [r["config"]["pairs"] for r in reports]
    minutes = [r["seconds"] / 60 for r in reports]
    out.append(
        (
            True,
            f"A/A NO CHANGE {len(no_change)}/{len(reports)}; pairs {pairs}; minutes {[round(m, 1) for m in minutes]}",
        )
    )
    refused = [r for r in reports if r["verdict"] == "REFUSED"]
    read = all(all(e.get("kv_cache_gib") is not None for e in r.get("engines", {}).values()) and r.get("engines")
               for r in reports)  # fmt: skip
    out.append(
        (not refused and read, f"A/A engines: KV caches read on both sides of every run, {len(refused)} REFUSED")
    )
    return out


def check_ab(report: dict[str, Any] | None) -> list[tuple[bool, str]]:
    if report is None:
        return [(False, "A/B: no ab-one-seq.ab.json")]
    tok = next((m for m in report["metrics"] if m["name"] == "output_tok_s"), None)
    right = (
        report["verdict"] == "REGRESSION" and tok is not None and tok["verdict"] == "REGRESSION" and tok["change"] < 0
    )
    change = (
        "-"
        if tok is None or tok["change"] is None
        else f"{tok['change']:+.1%} [{tok['ci_low']:+.1%}, {tok['ci_high']:+.1%}]"
    )
    return [(right, f"A/B one-seq: {report['verdict']}, output tok/s {change} in {report['config']['pairs']} pairs")]


def check_bisect(report: dict[str, Any] | None) -> list[tuple[bool, str]]:
    if report is None:
        return [(False, "bisect: no bisect.bisect.json")]
    ok = report.get("first_bad") == FIRST_BAD
    return [(ok, f"bisect: {report.get('result')}, first bad {report.get('first_bad')} after {report.get('ab_runs')} "
                 f"A/B runs, {report.get('seconds', 0) / 60:.1f} min")]  # fmt: skip


def check_dir(directory: Path) -> list[tuple[bool, str]]:
    aa = [_read(p) for p in sorted(directory.glob("aa*.ab.json"))]
    ab = directory / "ab-one-seq.ab.json"
    bisect = directory / "bisect.bisect.json"
    return [
        *check_aa(aa),
        *check_ab(_read(ab) if ab.is_file() else None),
        *check_bisect(_read(bisect) if bisect.is_file() else None),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path)
    args = parser.parse_args()
    if not args.dir.is_dir():
        print(f"{args.dir}: no such directory", file=sys.stderr)
        return 2
    results = check_dir(args.dir)
    for ok, line in results:
        print(f"{'PASS' if ok else 'FAIL'}  {line}")
    return 0 if all(ok for ok, _ in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
