"""Warm cost of reading wheel indexes back (`verify/audit/index.py`), without the real wheel cache.

The whole-matrix warm audit (benchmarks/audit.py) needs every pinned wheel downloaded; where they are
not (a fresh dev box, no network), this stands in: a wheel-shaped zip of this environment's own
site-packages (about 5,600 Python files, the size of vLLM's and FlashInfer's wheels together) is
indexed once, then its index is read back `--reads` times, as a six-cell audit reads its wheels.

    python benchmarks/audit_index.py [--work DIR] [--reads N] [--code CHECKOUT]

Measured 2026-12-03 on the 2-core dev box (load 1-4; no real wheel cache on it: this synthetic
index, 23,142 messages from 5,609 files, 3.0 MB of JSON, stands in), two runs each:
  before (main a09637e, index version 8: per-file rows, every hole decoded anew, each read rebuilt)
    first read 0.27-0.29 s, six more reads 2.09-4.61 s
  after  (index version 9: file and hole tables; each wheel decoded once per process)
    first read 0.12-0.24 s, six more reads 0.05 s
"""

from __future__ import annotations

import argparse
import site
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_TIMED = """
import sys, time
from pathlib import Path
from verify.audit.index import load_or_build
wheel, reads = Path(sys.argv[1]), int(sys.argv[2])
t = time.monotonic(); index = load_or_build(wheel, name="bench", version="1", sha256="b" * 64)
print(f"first {time.monotonic() - t:.2f} s ({len(index.messages)} messages, {index.files} files)")
t = time.monotonic()
for _ in range(reads):
    index = load_or_build(wheel, name="bench", version="1", sha256="b" * 64)
    sum(len(m.literal) for m in index.messages)
print(f"warm reads x{reads}: {time.monotonic() - t:.2f} s")
"""


def synthetic_wheel(work: Path) -> Path:
    """A zip of site-packages' .py files under a cache-shaped path (root/wheels/<pkg>/<ver>/)."""
    wheel = work / "wheels" / "bench" / "1" / "bench-1-py3-none-any.whl"
    if wheel.exists():
        return wheel
    wheel.parent.mkdir(parents=True, exist_ok=True)
    packages = Path(site.getsitepackages()[0])
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(packages.rglob("*.py")):
            archive.write(path, path.relative_to(packages).as_posix())
    return wheel


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/stackproof-audit-index-bench"))
    parser.add_argument("--reads", type=int, default=6)
    parser.add_argument("--code", type=Path, default=REPO, help="the checkout whose code runs")
    args = parser.parse_args()
    wheel = synthetic_wheel(args.work)
    cmd = [sys.executable, "-c", _TIMED, str(wheel), str(args.reads)]
    return subprocess.run(cmd, cwd=args.code, env={"PYTHONPATH": str(args.code)}, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
