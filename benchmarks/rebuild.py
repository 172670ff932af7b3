"""Rebuild cost after changing one override's version, against its floor.

Goal (issue: the spine): a rebuild after changing one override costs at most 1.5x the floor,
the time to `pip install --no-deps` that one wheel into a container of the previous image, and
the base layers are reused. Prints measured numbers side by side; asserts nothing.

Runs on the embedded default `cpu-tiny` (3 GB image) with an override of `tqdm`, a package its
lock already holds: previous image tqdm==4.70.0, then rebuilds with 4.69.0, 4.68.0, 4.67.0.
Needs a docker daemon and the same site settings as `stackproof build` (STACKPROOF_MIRRORS).
Usage: python benchmarks/rebuild.py [--skip-cold]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "tqdm"
PREVIOUS = "4.70.0"
CHANGES = ("4.69.0", "4.68.0", "4.67.0")
GOAL_RATIO = 1.5


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-cold", action="store_true", help="skip the --no-cache cold build (about 3 minutes)")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from pipeline.engine import Engine
    from pipeline.load import load_matrix
    from pipeline.site import load_site

    engine = Engine.connect()
    docker = engine.cli.path
    site = load_site(load_matrix(REPO / "matrix.yaml"))
    tags: list[str] = []
    with tempfile.TemporaryDirectory(prefix="stackproof-bench-") as tmp:
        work = Path(tmp)
        try:
            previous, _ = build(work, PREVIOUS, tags)
            print(f"previous image: {previous} ({PACKAGE}=={PREVIOUS})", file=sys.stderr)
            rebuilds, floors, images = [], [], []
            for version in CHANGES:
                tag, seconds = build(work, version, tags)
                rebuilds.append(seconds)
                images.append(tag)
                floors.append(floor(docker, previous, version, site.ca_bundle))
            cold = None
            if not args.skip_cold:
                _, cold = build(work, CHANGES[-1], tags, extra=["--no-cache"])
            reused, total, new_bytes, size = layer_reuse(docker, previous, images[0])
        finally:
            for tag in tags:
                subprocess.run([docker, "image", "rm", "--force", tag], capture_output=True)
    rebuild_med, floor_med = statistics.median(rebuilds), statistics.median(floors)
    rows = [
        ("rebuild after one override change (s)", f"{rebuild_med:.1f}", _samples(rebuilds)),
        ("floor: pip install --no-deps in a container (s)", f"{floor_med:.1f}", _samples(floors)),
        ("rebuild / floor", f"{rebuild_med / floor_med:.2f}", f"goal <= {GOAL_RATIO}"),
        ("full cold build, --no-cache (s)", "skipped" if cold is None else f"{cold:.1f}", ""),
        ("new layer bytes / image bytes", f"{new_bytes:,} / {size:,}", f"{100 * new_bytes / max(size, 1):.3f}%"),
        ("layers reused from the previous image", f"{reused} of {total}", "base layers reused" if reused else "NONE"),
    ]
    print(f"\nstackproof rebuild benchmark: cpu-tiny, override {PACKAGE} {PREVIOUS} -> {', '.join(CHANGES)}")
    width = max(len(r[0]) for r in rows)
    for name, value, note in rows:
        print(f"  {name:<{width}}  {value:>24}  {note}")
    return 0


def build(work: Path, version: str, tags: list[str], extra: list[str] | None = None) -> tuple[str, float]:
    """`stackproof build cpu-tiny` with the override set to `version`; (tag, wall seconds)."""
    data = yaml.safe_load((REPO / "matrix.yaml").read_text())
    for cell in data["cells"]:
        if cell["id"] == "cpu-tiny":
            cell["install"]["lock"] = str(REPO / cell["install"]["lock"])
            cell["overrides"] = {PACKAGE: {"version": version, "index": "pypi"}}
    matrix = work / "matrix.yaml"
    matrix.write_text(yaml.safe_dump(data, sort_keys=False))
    argv = [sys.executable, "-m", "pipeline", "build", "cpu-tiny", "--json", "--matrix", str(matrix),
            "--images", str(REPO / "images"), "--out", str(work / "out"), *(extra or [])]
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=os.environ.copy())
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        sys.exit(f"build failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout)
    if result["tag"] not in tags:
        tags.append(result["tag"])
    print(f"built {PACKAGE}=={version}{' ' + ' '.join(extra) if extra else ''}: {seconds:.1f}s", file=sys.stderr)
    return str(result["tag"]), seconds


def floor(docker: str, image: str, version: str, ca_bundle: Path | None) -> float:
    """Wall time of `pip install --no-deps PACKAGE==version` in a fresh container of `image`."""
    argv = [docker, "run", "--rm", "--network", "host", "--entrypoint", "/opt/venv/bin/python"]
    pip = ["-m", "pip", "install", "--isolated", "--no-deps", "--no-cache-dir", "--disable-pip-version-check"]
    if ca_bundle:
        argv += ["--volume", f"{ca_bundle}:/run/ca.pem:ro"]
        pip.append("--cert=/run/ca.pem")
    started = time.monotonic()
    subprocess.run([*argv, image, *pip, f"{PACKAGE}=={version}"], check=True, capture_output=True)
    return time.monotonic() - started


def layer_reuse(docker: str, previous: str, rebuilt: str) -> tuple[int, int, int, int]:
    """(layers shared with the previous image, layers in the rebuilt one, new-layer bytes, image bytes)."""
    def inspect(ref: str) -> dict[str, object]:
        out = subprocess.run([docker, "image", "inspect", ref], check=True, capture_output=True, text=True).stdout
        return json.loads(out)[0]  # type: ignore[no-any-return]

    old_layers = inspect(previous)["RootFS"]["Layers"]  # type: ignore[index]
    new_info = inspect(rebuilt)
    new_layers = new_info["RootFS"]["Layers"]  # type: ignore[index]
    shared = 0
    for a, b in zip(old_layers, new_layers, strict=False):
        if a != b:
            break
        shared += 1
    # Non-empty history entries (oldest first) correspond one to one with RootFS layers.
    history = subprocess.run([docker, "image", "history", "--no-trunc", "--human=false", "--format", "{{.Size}}",
                              rebuilt], check=True, capture_output=True, text=True).stdout.split()
    sizes = [int(s) for s in reversed(history) if int(s) > 0]
    new_bytes = sum(sizes[shared:]) if len(sizes) == len(new_layers) else -1
    return shared, len(new_layers), new_bytes, int(new_info["Size"])  # type: ignore[arg-type]


def _samples(values: list[float]) -> str:
    return "samples " + ", ".join(f"{v:.1f}" for v in values)


if __name__ == "__main__":
    raise SystemExit(main())
