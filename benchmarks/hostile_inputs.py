"""Issue 27's and issue 43's hostile-input suite, counted per defect class: handled / total.

Runs the cases of tests/unit/test_fuzz.py that carry a class (`_reliability_cases`: report,
compare, repro sources, doctor input, load URLs, logs, FIFOs, /dev/zero) through the same child
process and judgement as the unit test (exit code, located message, no traceback or hang, strict
JSON, no canary printed or written, no false PASS), against the code at `--code` (default: this
checkout). The baseline is the same cases against main's code:

    git -C /work/main archive main pipeline verify stackproof | tar -x -C /tmp/main-code
    python benchmarks/hostile_inputs.py --code /tmp/main-code      # before
    python benchmarks/hostile_inputs.py                            # after

Issue 43's cases (`i43-*`, class `43.N` for the issue's class N: tests/unit/test_fuzz.py
`_surface_cases`) run in the same driver; those that need a real process (a closed or full
stdout, a closed stderr, a file-size limit under `repro --write`) are PROCESS_CASES below, each a
shell line judged by its exit code, no traceback, and the file it must leave whole. `--only 43`
runs issue 43's alone.
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
    "43.1": "quadratic work",
    "43.2": "in-place edits",
    "43.5": "arguments checked late",
    "43.6": "documents read back",
    "43.7": "not a terminal",
    "43.8": "index trouble",
}

# (id, class, shell line with {PY} the interpreter, {DIR} the case's folder, {REPO}; codes; file left whole)
PROCESS_CASES: list[tuple[str, str, str, tuple[int, ...], str]] = [
    ("i43-7-stdout-closed", "43.7", "{PY} -m pipeline matrix list --matrix {REPO}/matrix.yaml >&-", (3,), ""),
    ("i43-7-stdout-full", "43.7", "{PY} -m pipeline matrix list --matrix {REPO}/matrix.yaml >/dev/full", (3,), ""),
    (
        "i43-7-stderr-closed",
        "43.7",
        "{PY} -m pipeline matrix list --matrix {REPO}/matrix.yaml 2>&- >/dev/null",
        (0,),
        "",
    ),
    ("i43-7-stderr-closed-usage", "43.7", "{PY} -m pipeline matrix bogus 2>&- >/dev/null", (2,), ""),
    # A write stopped half-way: a 41 KB file-size limit (SIGXFSZ ignored: the write fails, EFBIG)
    # under `repro --write`, whose matrix must stay whole (main: truncated, then restored by a
    # plain write that failed the same way).
    (
        "i43-2-repro-write-file-size-limit",
        "43.2",
        "trap '' XFSZ; ulimit -f 41; {PY} -m pipeline repro {REPO}/tests/fixtures/repro/rtx-pro-6000-env-block.md "
        "--matrix {DIR}/m.yaml --images {REPO}/images --offline --write >/dev/null",
        (2, 3),
        "m.yaml",
    ),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", type=Path, default=REPO, help="a tree holding pipeline/ verify/ stackproof/")
    parser.add_argument("--only", default="", help="a class prefix: `43` for issue 43's cases alone")
    args = parser.parse_args()
    cases = [c for c in CASES if c.klass and c.klass.startswith(args.only)]
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
    for case_id, klass, problem in _run_processes(args.code.resolve(), args.only):
        total[klass] += 1
        if problem is None:
            handled[klass] += 1
        else:
            failed.append(f"  {case_id}: {problem}")
    print(f"hostile inputs against {args.code}")
    for klass, name in CLASSES.items():
        if total[klass]:
            print(f"  class {klass:<4} {name:<28} {handled[klass]:>3} / {total[klass]:<3} handled")
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


def _run_processes(code: Path, only: str) -> list[tuple[str, str, str | None]]:
    """PROCESS_CASES, each in its own folder: (id, class, problem or None)."""
    root = Path(tempfile.mkdtemp(prefix="hostile-process-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("STACKPROOF_")}
    env |= {"PYTHONPATH": f"{code}{os.pathsep}{REPO}"}
    out = []
    for n, (case_id, klass, line, expect, whole) in enumerate(PROCESS_CASES):
        if not klass.startswith(only):
            continue
        directory = root / f"p{n:02d}"
        directory.mkdir()
        (directory / "m.yaml").write_bytes((REPO / "matrix.yaml").read_bytes())
        before = (directory / whole).read_bytes() if whole else b""
        shell = line.format(PY=sys.executable, DIR=directory, REPO=REPO)
        try:
            proc = subprocess.run(["bash", "-c", shell], cwd=code, env=env, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            out.append((case_id, klass, "no answer within 120s"))
            continue
        problem = None
        if "Traceback (most recent call last)" in proc.stderr or "Exception ignored" in proc.stderr:
            problem = "traceback on stderr"
        elif proc.returncode not in expect:
            problem = f"exit {proc.returncode}, expected {expect}"
        elif whole and (directory / whole).read_bytes() != before:
            problem = f"{whole} not left whole"
        out.append((case_id, klass, problem))
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
