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
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "tqdm"
PREVIOUS = "4.70.0"
# Versions to move the override to, newest first. A version whose override step BuildKit has
# cached from an earlier run is skipped, so every sample is a real install.
CANDIDATES = tuple(f"4.{minor}.{patch}" for minor in range(69, 40, -1) for patch in (0, 1))
SAMPLES = 3
GOAL_RATIO = 1.5


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-cold", action="store_true", help="skip the --no-cache cold build (about 3 minutes)")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from pipeline.docker.client import Docker
    from pipeline.matrix.read import load_matrix
    from pipeline.matrix.site import load_site

    docker = Docker.connect()
    docker = docker.cli.path
    site = load_site(load_matrix(REPO / "matrix.yaml"))
    tags: list[str] = []
    with tempfile.TemporaryDirectory(prefix="stackproof-bench-") as tmp:
        work = Path(tmp)
        try:
            previous, _ = build(work, PREVIOUS, tags)
            print(f"previous image: {previous} ({PACKAGE}=={PREVIOUS})", file=sys.stderr)
            rebuilds, floors, images, changes = [], [], [], []
            for version in CANDIDATES:
                if len(rebuilds) == SAMPLES:
                    break
                if not version_exists(version):
                    continue
                tag, seconds = build(work, version, tags)
                if override_step_was_cached(work):
                    print(f"{PACKAGE}=={version}: override step cached earlier, not a sample", file=sys.stderr)
                    continue
                rebuilds.append(seconds)
                images.append(tag)
                changes.append(version)
                floors.append(floor(docker, previous, version, site.ca_bundle))
            if not rebuilds:
                sys.exit("every candidate version was cached; prune the build cache (docker builder prune)")
            cold = None
            if not args.skip_cold:
                _, cold = build(work, changes[-1], tags, extra=["--no-cache"])
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
    print(f"\nstackproof rebuild benchmark: cpu-tiny, override {PACKAGE} {PREVIOUS} -> {', '.join(changes)}")
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
    argv = [
        sys.executable,
        "-m",
        "pipeline",
        "build",
        "cpu-tiny",
        "--json",
        "--matrix",
        str(matrix),
        "--images",
        str(REPO / "images"),
        "--out",
        str(work / "out"),
        *(extra or []),
    ]
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=os.environ.copy())
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        sys.exit(f"build failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout)
    # Remember the image id as well as the tag: a later build of the same content moves the tag,
    # and the image it leaves behind must be removed too.
    tags.extend(ref for ref in (result["tag"], result["image_id"]) if ref not in tags)
    print(f"built {PACKAGE}=={version}{' ' + ' '.join(extra) if extra else ''}: {seconds:.1f}s", file=sys.stderr)
    return str(result["tag"]), seconds


def version_exists(version: str, _known: list[str] = []) -> bool:  # noqa: B006 - a per-process memo
    if not _known:
        argv = [sys.executable, "-m", "pip", "index", "versions", PACKAGE]
        out = subprocess.run(argv, capture_output=True, text=True)
        _known.extend(v.strip() for v in out.stdout.partition("Available versions:")[2].split(","))
    return version in _known


def override_step_was_cached(work: Path) -> bool:
    """True when the last build's log shows BuildKit reused the override step instead of running it."""
    log = (work / "out" / "cpu-tiny" / "build.log").read_text()
    step = re.search(r"^(#\d+) \[\d+/\d+\] RUN .*overrides-pypi\.txt", log, re.MULTILINE)
    return step is not None and f"{step.group(1)} CACHED" in log


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
    """(rebuilt layers also in the previous image, rebuilt layers, bytes of the others, image bytes)."""

    def inspect(ref: str) -> dict[str, Any]:
        out = subprocess.run([docker, "image", "inspect", ref], check=True, capture_output=True, text=True).stdout
        return json.loads(out)[0]  # type: ignore[no-any-return]

    old_layers = set(inspect(previous)["RootFS"]["Layers"])
    info = inspect(rebuilt)
    layers: list[str] = info["RootFS"]["Layers"]
    # History entries that write a filesystem layer (RUN, COPY, ADD, the imported base), oldest
    # first, correspond one to one with RootFS layers; ENV and LABEL entries write none.
    history = subprocess.run(
        [docker, "image", "history", "--no-trunc", "--human=false", "--format", "{{.Size}}|{{.CreatedBy}}", rebuilt],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    sizes = []
    for line in reversed(history):
        size, _, created_by = line.partition("|")
        if not created_by.strip() or created_by.split()[0] in ("RUN", "COPY", "ADD"):
            sizes.append(int(size))
    if len(sizes) != len(layers):
        sys.exit(f"cannot map {len(sizes)} history entries onto {len(layers)} layers of {rebuilt}")
    new_bytes = sum(size for size, layer in zip(sizes, layers, strict=True) if layer not in old_layers)
    return sum(layer in old_layers for layer in layers), len(layers), new_bytes, int(info["Size"])


def _samples(values: list[float]) -> str:
    return "samples " + ", ".join(f"{v:.1f}" for v in values)


if __name__ == "__main__":
    raise SystemExit(main())
