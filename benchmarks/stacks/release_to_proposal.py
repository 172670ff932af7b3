"""From a release appearing on an index to proposed, audited cells: `stackproof matrix propose --new`
against a local index on 127.0.0.1 where a stand-in vLLM release (wheels whose METADATA is all pip
reads) appears next to the ones the matrix has.

    python benchmarks/stacks/release_to_proposal.py WORKDIR [--no-audit]

Copies matrix.yaml (with locks/) and the release-pin table into WORKDIR, serves WORKDIR/index, adds
vllm 0.35.0 (torch 2.14.0, flashinfer-python 0.7.4), runs the command with the site's mirrors pointed
at that index, and prints the seconds from the wheel's appearance to the written proposal, and the
proposal's summary (JSON). The stand-in wheels carry no source: the audit of their cells reports what
it cannot find, which is what a real run's pull-request body would list.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from tests.release_index import local_index, release_wheel  # noqa: E402


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", type=Path, help="where the matrix copy, the table copy and the index go")
    parser.add_argument("--no-audit", action="store_true", help="propose without auditing the cells")
    args = parser.parse_args(argv)
    work, audit = args.workdir, not args.no_audit
    work.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "matrix.yaml", work / "matrix.yaml")
    shutil.copytree(REPO / "locks", work / "locks", dirs_exist_ok=True)
    shutil.copy(REPO / "pipeline/releases/release_pins.json", work / "release_pins.json")
    index = work / "index"
    release_wheel(index, "vllm", "0.34.0", ["torch==2.14.0"])
    release_wheel(index, "sglang", "0.5.23", [], tag="cp312-cp312")
    release_wheel(index, "flashinfer-python", "0.7.4", [], tag="py3-none")
    # Projects a real index has, with none of the versions a 0.35.0 cell pins: the audit says "not
    # checkable" for them (pip reads a 404 project page as an unreachable index).
    for name in ("flashinfer-cubin", "flashinfer-jit-cache", "uvicorn"):
        (index / name).mkdir(exist_ok=True)
    with local_index(index) as url:
        env = {
            **os.environ,
            "STACKPROOF_MIRRORS": f"pypi={url},flashinfer={url},flashinfer-cu130={url}",
            "STACKPROOF_RELEASE_PINS": str(work / "release_pins.json"),
            "STACKPROOF_CACHE_DIR": str(work / "cache"),
            "STACKPROOF_CA_BUNDLE": "none",
        }
        argv_ = [
            sys.executable,
            "-m",
            "stackproof",
            "matrix",
            "propose",
            "--new",
            "--matrix",
            str(work / "matrix.yaml"),
        ]
        argv_ += ["--images", str(REPO / "images"), "--out", str(work / "proposal"), "--json"]
        argv_ += [] if audit else ["--no-audit"]
        appeared = time.monotonic()
        release_wheel(index, "vllm", "0.35.0", ["torch==2.14.0", "flashinfer-python==0.7.4"])
        release_wheel(
            index, "torch", "2.14.0", ['nvidia-cudnn-cu13==9.24.0.43; platform_system == "Linux"'], tag="cp312-cp312"
        )
        done = subprocess.run(argv_, env=env, capture_output=True, text=True, timeout=900, check=False)
        seconds = time.monotonic() - appeared
    if done.returncode not in (0, 1):
        print(done.stderr[-3000:], file=sys.stderr)
        return done.returncode
    document = json.loads(done.stdout)
    summary = {
        "seconds_release_to_proposal": round(seconds, 1),
        "exit": done.returncode,
        "new": document["new"],
        "cells": [c for p in document["proposals"] for c in p["cells"]],
        "audit_errors": [p["audit"]["errors"] if p.get("audit") else None for p in document["proposals"]],
        "files": sorted(p.name for p in (work / "proposal").iterdir()),
    }
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
