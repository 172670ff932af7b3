"""How fast a broken stack is caught: `stackproof verify fi-mismatch` to its verdict, beside the time
`cpu-tiny` takes just to become ready.

Goal (issue: stage imports): the mismatched FlashInfer pair gets its verdict within 15 s of verify
time, with 0 server starts. Prints measured numbers side by side; asserts nothing.
Needs a docker daemon; builds the two cells first when their images are missing (not timed).
Usage: python benchmarks/failfast.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GOAL_S = 15.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from pipeline.docker.client import Docker

    docker = Docker.connect()
    out = Path(os.environ.get("TMPDIR", "/tmp")) / "stackproof-bench-failfast"
    for cell in ("cpu-tiny", "fi-mismatch"):
        stackproof("build", cell, "--out", str(out))

    verdicts, server_starts, outcomes = [], [], []
    for _ in range(args.repeat):
        since = time.time() - 1
        seconds, report = timed("verify", "fi-mismatch", "--json", "--out", str(out))
        verdicts.append(seconds)
        server_starts.append(len(docker.created_since(since, "io.stackproof.role=server")))
        outcomes.append(report["stages"][0]["status"] + (" as expected" if report["outcome"]["passed"] else ""))

    seconds, report = timed("verify", "cpu-tiny", "--stages", "startup", "--json", "--out", str(out))
    startup = report["stages"][0]
    ready = next(c for c in startup["checks"] if c["name"] == "readiness")["evidence"]["seconds"]

    rows = [
        (
            "fi-mismatch: verify start to verdict (s)",
            f"{statistics.median(verdicts):.1f}",
            f"goal <= {GOAL_S:.0f}; samples {', '.join(f'{v:.1f}' for v in verdicts)}",
        ),
        ("fi-mismatch: imports verdict", outcomes[0], ""),
        ("fi-mismatch: server containers started", str(max(server_starts)), "goal 0"),
        ("cpu-tiny: container start to /health 200 (s)", f"{ready:.1f}", "what a server-first check would wait"),
        ("cpu-tiny: verify --stages startup, whole (s)", f"{seconds:.1f}", "incl. one completion and teardown"),
    ]
    print("\nstackproof fail-fast benchmark")
    width = max(len(r[0]) for r in rows)
    for name, value, note in rows:
        print(f"  {name:<{width}}  {value:>16}  {note}")
    return 0


def stackproof(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=REPO, capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        sys.exit(f"stackproof {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


def timed(*args: str) -> tuple[float, dict]:  # type: ignore[type-arg]
    started = time.monotonic()
    proc = stackproof(*args)
    return time.monotonic() - started, json.loads(proc.stdout)


if __name__ == "__main__":
    raise SystemExit(main())
