"""The GPU host's A/B and bisect inputs: the eight planted versions as a local index, and a matrix of one cell.

- `stackproof-planted` 1.0 .. 8.0: the integration tier's planted regression (tests/recipes/planted:
  a .pth hook that sleeps DELAY_S before each `EngineCoreProc._process_engine_step`, the method the
  stall recipe wraps, which the H200 run of vLLM 0.26.0 stalled through: benchmarks/h200_host),
  DELAY_S 0 before 5.0 and `--delay` from 5.0 on. Real wheels (PEP 427) in a PEP 503 tree under --out.
- matrix.gpu-ab.yaml beside matrix.yaml (images/ is found beside the matrix): h200-vllm-0.26.0-tiny
  with the package pinned at 1.0 from the index `planted` (http://127.0.0.1:PORT/simple), and one
  more arm, `one-seq` (`--max-num-seqs 1`: the known-direction A/B of shared/reference/gpu-docker.md
  section 3, output tok/s -81.8% there).
- `--serve`: the index on 127.0.0.1:PORT until killed (bisect.sh starts it beside the bisect).

Usage: python benchmarks/gpu_ab/planted.py --out /tmp/planted [--delay 0.005] [--port 8765] [--serve]
       python benchmarks/gpu_ab/planted.py --quick   (the unit tier: build both into a temporary dir, load the matrix)
"""

from __future__ import annotations

import argparse
import base64
import functools
import hashlib
import http.server
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "tests" / "recipes" / "planted" / "stackproof_planted.py"
CELL = "h200-vllm-0.26.0-tiny"
PACKAGE = "stackproof-planted"
VERSIONS = tuple(f"{n}.0" for n in range(1, 9))
FIRST_BAD = "5.0"
# 5 ms per engine step: the tiny Llama's step at concurrency 8 on the H100 is about 2 ms (6.8 tokens
# a step at 2,300-2,875 tok/s), so tok/s falls by about two thirds: far past a 5% threshold.
DELAY_S = 0.005
MATRIX_NAME = "matrix.gpu-ab.yaml"


def wheel(directory: Path, version: str, delay: float) -> Path:
    """A real pure-Python wheel: the hook module, its .pth, METADATA, WHEEL and RECORD."""
    slow = delay if float(version) >= float(FIRST_BAD) else 0.0
    source = RECIPE.read_text().replace("DELAY_S = 0.0 ", f"DELAY_S = {slow!r} ")
    assert f"DELAY_S = {slow!r} " in source, f"{RECIPE}: its DELAY_S line moved"
    dist = f"stackproof_planted-{version}.dist-info"
    files = {
        "stackproof_planted.py": source.encode(),
        "stackproof_planted.pth": b"import stackproof_planted\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: gpu-ab\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    files[f"{dist}/RECORD"] = ("\n".join([*record, f"{dist}/RECORD,,"]) + "\n").encode()
    path = directory / f"stackproof_planted-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0)), data)
    return path


def build_index(root: Path, delay: float) -> Path:
    """The eight wheels and the PEP 503 page naming them, under root; the simple/ directory."""
    (root / "files").mkdir(parents=True, exist_ok=True)
    project = root / "simple" / PACKAGE
    project.mkdir(parents=True, exist_ok=True)
    anchors = []
    for version in VERSIONS:
        built = wheel(root / "files", version, delay)
        sha = hashlib.sha256(built.read_bytes()).hexdigest()
        anchors.append(f'<a href="../../files/{built.name}#sha256={sha}">{built.name}</a><br>')
    (project / "index.html").write_text("<!DOCTYPE html><html><body>\n" + "\n".join(anchors) + "\n</body></html>\n")
    return root / "simple"


def gpu_matrix(port: int, source: Path = REPO / "matrix.yaml") -> dict[str, Any]:
    """The one-cell matrix: the GPU host cell, the planted pin, the one-seq arm."""
    document = yaml.safe_load(source.read_text())
    cell = next(c for c in document["cells"] if c["id"] == CELL)
    cell["overrides"] = {PACKAGE: {"version": "1.0", "index": "planted"}}
    cell["arms"]["one-seq"] = {
        "description": "one sequence at a time (--max-num-seqs 1): the known-direction A/B",
        "args": ["--max-num-seqs", "1"],
    }
    return {
        "schema_version": document["schema_version"],
        "defaults": document.get("defaults", {}),
        "indexes": {**document["indexes"], "planted": {"url": f"http://127.0.0.1:{port}/simple"}},
        "cells": [cell],
    }


def write_matrix(port: int, target: Path) -> Path:
    target.write_text(
        f"# Written by benchmarks/gpu_ab/planted.py from matrix.yaml ({CELL}): not hand-edited.\n"
        + yaml.safe_dump(gpu_matrix(port), sort_keys=False)
    )
    return target


def serve(root: Path, port: int) -> None:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    print(f"planted index on http://127.0.0.1:{port}/simple", file=sys.stderr, flush=True)
    server.serve_forever()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/planted"))
    parser.add_argument("--delay", type=float, default=DELAY_S, help="seconds per engine step from 5.0 on")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--serve", action="store_true")
    parser.add_argument("--quick", action="store_true", help="build into a temporary dir and load the matrix")
    args = parser.parse_args()
    if args.quick:
        sys.path.insert(0, str(REPO))
        from pipeline.matrix.read import load_matrix

        with tempfile.TemporaryDirectory() as tmp:
            simple = build_index(Path(tmp), args.delay)
            matrix = write_matrix(args.port, REPO / f".{MATRIX_NAME}.quick-{Path(tmp).name}")
            try:
                cell = load_matrix(matrix, images_dir=REPO / "images").cell(CELL)
            finally:
                matrix.unlink()
            wheels = len(list((simple.parent / "files").iterdir()))
            arms = ", ".join(a.name for a in cell.arms)
            print(f"{wheels} wheels; {cell.id}: arms {arms}; overrides {', '.join(o.pin for o in cell.overrides)}")
        return 0
    build_index(args.out, args.delay)
    matrix = write_matrix(args.port, REPO / MATRIX_NAME)
    print(f"index under {args.out} ({len(VERSIONS)} versions, {args.delay * 1000:g} ms from {FIRST_BAD}); {matrix}")
    if args.serve:
        serve(args.out, args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
