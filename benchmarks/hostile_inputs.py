"""Issue 27's hostile-input suite, counted per defect class: handled / total.

Runs the cases of tests/unit/test_fuzz.py that carry a class (`_reliability_cases`: report,
compare, repro sources, doctor input, load URLs, logs, FIFOs, /dev/zero) through the same child
process and judgement as the unit test (exit code, located message, no traceback or hang, strict
JSON, no canary printed or written, no false PASS), against the code at `--code` (default: this
checkout). The baseline is the same cases against main's code:

    git -C /work/main archive main pipeline verify stackproof | tar -x -C /tmp/main-code
    python benchmarks/hostile_inputs.py --code /tmp/main-code      # before
    python benchmarks/hostile_inputs.py                            # after
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.unit.test_fuzz import CASES, MEMORY_CAP, Case, reliability_problems  # noqa: E402

CLASSES = {
    "1": "false verification",
    "2": "files and secrets",
    "3": "waits without an end",
    "4": "unbounded memory",
    "5": "tracebacks",
    "6": "exit code / JSON contract",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", type=Path, default=REPO, help="a tree holding pipeline/ verify/ stackproof/")
    args = parser.parse_args()
    cases = [c for c in CASES if c.klass]
    results = _run(cases, args.code.resolve())
    handled: Counter[str] = Counter()
    total: Counter[str] = Counter()
    failed: list[str] = []
    for case in cases:
        total[case.klass] += 1
        problem = _judge(case, results[case.id])
        if problem is None:
            handled[case.klass] += 1
        else:
            failed.append(f"  {case.id}: {problem}")
    print(f"hostile inputs against {args.code}")
    for klass, name in CLASSES.items():
        print(f"  class {klass} {name:<28} {handled[klass]:>3} / {total[klass]:<3} handled")
    print(f"  {'all':<36} {sum(handled.values()):>3} / {sum(total.values()):<3} handled")
    if failed:
        print("not handled:")
        print("\n".join(failed))
    return 0


def _run(cases: list[Case], code: Path) -> dict[str, dict[str, Any]]:
    root = Path(tempfile.mkdtemp(prefix="hostile-"))
    documents = []
    for n, case in enumerate(cases):
        directory = root / f"c{n:03d}"
        directory.mkdir()
        for name, data in case.files.items():
            (directory / name).parent.mkdir(parents=True, exist_ok=True)
            (directory / name).write_bytes(data.replace(b"{DIR}", str(directory).encode()))
        for name in case.fifos:
            os.mkfifo(directory / name)
        argv = [a.replace("{DIR}", str(directory)) for a in case.argv]
        documents.append({"id": case.id, "argv": argv, "stdin": case.stdin, "timeout": case.timeout, "env": case.env})
    (root / "cases.json").write_text(json.dumps(documents))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STACKPROOF_", "HTTP", "http", "ALL_", "all_"))}
    env |= {"OPENBLAS_NUM_THREADS": "1", "NO_PROXY": "127.0.0.1", "PYTHONPATH": f"{code}{os.pathsep}{REPO}"}
    subprocess.run(
        [sys.executable, str(REPO / "tests/unit/fuzz_driver.py"), str(root / "cases.json"), str(root / "out.json")],
        cwd=root,
        env=env,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP)),
        check=True,
        timeout=1200,
    )
    out: dict[str, dict[str, Any]] = json.loads((root / "out.json").read_text())
    for n, case in enumerate(cases):
        out[case.id]["dir"] = str(root / f"c{n:03d}")
    return out


def _judge(case: Case, result: dict[str, Any]) -> str | None:
    """The unit test's judgement (tests/unit/test_fuzz.py test_hostile_input), as a reason or None."""
    if result["traceback"] is not None:
        return "traceback: " + result["traceback"].strip().splitlines()[-1][:120]
    if result["hang"]:
        return f"no answer within {case.timeout}s"
    if "Traceback (most recent call last)" in result["stderr"]:
        return "traceback on stderr"
    if result["code"] not in case.expect:
        return f"exit {result['code']}, expected {case.expect}"
    if result["code"] != 0 and case.located:
        pattern = case.located.replace("{DIR}", re.escape(result["dir"]))
        if not re.search(pattern, result["stderr"]):
            return f"not located by {pattern!r}"
    if "--json" in case.argv:
        try:
            json.dumps(json.loads(result["stdout"]), allow_nan=False)
        except ValueError:
            return "--json printed no strict JSON document"
    problems = reliability_problems(case, result)
    return problems[0] if problems else None


if __name__ == "__main__":
    raise SystemExit(main())
