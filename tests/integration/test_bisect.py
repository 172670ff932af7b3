"""`stackproof bisect` for real: a planted regression found among eight versions of a real package.

`stackproof-planted` 1.0 .. 8.0 are real wheels built here, served by a PEP 503 simple index
(http.server on 127.0.0.1 over a temporary directory). Each carries tests/recipes/planted (a .pth
hook around vLLM 0.28.0's engine step); from 5.0 on its DELAY_S is 200 ms, before it 0. The cell
is cpu-tiny-host (vLLM 0.28.0 CPU, host runtime) with the package pinned at 1.0 from that index,
in a matrix of this test's own; each probed version is a layer over the cell's environment
(pipeline/host/layer.py). Bisect must name 5.0 after at most 1 + 3 A/B runs (the bad end, then
halving 2.0 .. 8.0), with the good end's server started once for all of them, and a rerun must
build nothing. Each A/B runs in sequential looks (`--pairs 4 --max-pairs 8`) under the step's own
stopping rule (stackproof/bisection.py: step_decided): it ends at the first look whose interval makes
the step BAD or GOOD, so a large planted effect costs 4 pairs of short slices, not 8.

The serve args add `--enforce-eager`: vLLM 0.28.0 then skips torch.compile
(vllm/config/vllm.py:1284, "Enforce eager set, disabling torch.compile and CUDAGraphs"), which
shortens each of the eight server starts of a bisect on two shared cores; the planted delay is in
the engine step either way.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import json
import re
import shutil
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from pipeline.host.proc import marked_processes
from tests.integration.conftest import IMAGES, MATRIX, runner_dir, stackproof

pytestmark = pytest.mark.integration

CELL = "cpu-tiny-host"
PACKAGE = "stackproof-planted"
RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "planted"
VERSIONS = tuple(f"{n}.0" for n in range(1, 9))
DELAY_S = 0.2  # per engine step, from 5.0 on: 50 ms read -51% to -76% in tok/s here, too near a wide threshold
FIRST_BAD = "5.0"
# Looks at 4 and 8 pairs of 4 s slices (until 2026-12-06 six pairs of 5 s, every pair measured). Four
# pairs, not three: the A/B's interval widens by sqrt(n/(n-1)) t(n-1)/z (docs/ab.md), 2.7 at three
# pairs; with three pairs of 4 s a good version against the good end read tok/s +18% [-76%, +366%]
# here (load average 21 on two cores). 200 ms read -97.5% [-98.1%, -96.8%] at the bad end, far past
# the 60% threshold: the first look decides a BAD step; a GOOD one the first look leaves open goes
# on to 8 pairs, whose interval is narrower than six's was.
# Eight tokens a turn, not sixteen (until 2026-12-07): a slice ends when its questions in flight end,
# and a slow version's question is its 2-3 turns x max_tokens x 200 ms: with 16 tokens each of its
# 4 s slices took 10.6 s (2 questions), five of them per BAD step. The planted effect is per token,
# so the step's verdict is as clear: 200 ms read -95.6% to -95.9% at 16 tokens, far past 60%.
LOAD = [
    "--concurrency", "2", "--max-tokens", "8", "--slice", "4", "--pairs", "4", "--max-pairs", "8",
    "--threshold", "60%",
]  # fmt: skip
FIRST_LOOK, LAST_LOOK = 4, 8
SERVER = re.compile(r"server process group (\S+) on http://127\.0\.0\.1:")
BOUND_S = 3000  # a hang guard: up to 5 server starts (~2-3 min each here) and 4 A/B runs of 18 slices


def _wheel(directory: Path, version: str) -> Path:
    """A real pure-Python wheel (PEP 427): the hook module, its .pth, METADATA, WHEEL and RECORD."""
    delay = DELAY_S if float(version) >= float(FIRST_BAD) else 0.0
    source = (RECIPE / "stackproof_planted.py").read_text().replace("DELAY_S = 0.0 ", f"DELAY_S = {delay!r} ")
    dist = f"stackproof_planted-{version}.dist-info"
    files = {
        "stackproof_planted.py": source.encode(),
        "stackproof_planted.pth": b"import stackproof_planted\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: stackproof-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    files[f"{dist}/RECORD"] = ("\n".join([*record, f"{dist}/RECORD,,"]) + "\n").encode()
    path = directory / f"stackproof_planted-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0)), data)
    return path


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A PEP 503 simple index of the eight versions on 127.0.0.1, for the module's tests."""
    root = tmp_path_factory.mktemp("planted-index")
    (root / "files").mkdir()
    project = root / "simple" / PACKAGE
    project.mkdir(parents=True)
    anchors = []
    for version in VERSIONS:
        wheel = _wheel(root / "files", version)
        sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
        anchors.append(f'<a href="../../files/{wheel.name}#sha256={sha}">{wheel.name}</a><br>')
    (project / "index.html").write_text("<!DOCTYPE html><html><body>\n" + "\n".join(anchors) + "\n</body></html>\n")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def matrix(index: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This test's matrix: cpu-tiny-host with the planted package pinned at 1.0 from the local index."""
    source = yaml.safe_load(MATRIX.read_text())
    cell = next(c for c in source["cells"] if c["id"] == CELL)
    cell["install"]["lock"] = str((MATRIX.parent / cell["install"]["lock"]).resolve())
    cell["overrides"] = {PACKAGE: {"version": "1.0", "index": "planted"}}
    cell["serve"]["args"] = [*cell["serve"]["args"], "--enforce-eager"]
    document = {
        "schema_version": source["schema_version"],
        "defaults": source.get("defaults", {}),
        "indexes": {**source["indexes"], "planted": {"url": index}},
        "cells": [cell],
    }
    path = tmp_path_factory.mktemp("planted-matrix") / "matrix.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def built(cpu_tiny_host_env: str) -> None:
    """The cell's environment, built once per session (tests/integration/conftest.py)."""


def bisect(matrix: Path, out: Path, *extra: str) -> tuple[dict[str, object], float, str]:
    started = time.monotonic()
    argv = ["bisect", CELL, "--matrix", str(matrix), "--images", str(IMAGES), "--package", PACKAGE]
    argv += [
        "--good",
        VERSIONS[0],
        "--bad",
        VERSIONS[-1],
        "--metric",
        "tok_s",
        *LOAD,
        *extra,
        "--out",
        str(out),
        "--json",
    ]
    done = stackproof(argv, timeout=BOUND_S)
    seconds = time.monotonic() - started
    assert done.returncode in (0, 1), done.stderr[-4000:]  # 1: UNDECIDED (asserted by the caller)
    report = json.loads(done.stdout)
    assert json.loads(Path(report["files"]["report"]).read_text()) == report  # printed = written
    print(
        f"bisect: {report['result']} {report['first_bad']} in {seconds:.0f}s, {report['ab_runs']} A/B runs, "
        f"{report['builds']} builds"
    )
    for step in report["steps"]:
        print(
            f"  step {step['number']} {step['version']}: {step['judgement']} {step['why']} "
            f"({step['environment']['source']}, {step['evidence']['seconds']}s, {_pairs(step)} pairs)"
        )
    return report, seconds, done.stderr


def _pairs(step: dict[str, object]) -> int | None:
    """How many pairs the step's A/B measured before its stopping rule ended it (None: no A/B report)."""
    report = step["evidence"]["report"]  # type: ignore[index]
    return int(json.loads(Path(report).read_text())["config"]["pairs"]) if report else None


def test_bisect_names_the_first_slow_version_and_a_rerun_builds_nothing(built: None, matrix: Path) -> None:
    out = runner_dir(None, "bisect")
    layers: list[str] = []
    try:
        first, first_s, stderr = bisect(matrix, out)
        runs = set(SERVER.findall(stderr))
        # The good end's server is kept up for the whole search: one, plus one per A/B run.
        assert len(runs) == 1 + first["ab_runs"], runs
        left = [m for m in marked_processes() if m.run in runs]  # this run's only: others share the host
        assert not left, f"a server of the bisect outlived it: {left}"
        layers = [e["ref"] for e in first["environments"]]
        assert first["result"] == "FOUND" and first["first_bad"] == FIRST_BAD and first["last_good"] == "4.0"
        assert first["versions"] == list(VERSIONS)
        assert first["ab_runs"] <= 1 + 3
        steps = first["steps"]
        assert steps[0]["version"] == VERSIONS[-1] and steps[0]["judgement"] == "BAD"  # the bad end first
        judged = {s["version"]: s["judgement"] for s in steps}
        assert all((v >= FIRST_BAD) == (j == "BAD") for v, j in judged.items()), judged
        assert steps[-1]["interval"] == {"good": "4.0", "bad": FIRST_BAD}
        for step in steps:  # every A/B ran in looks and ended at one: its measured pairs are the look's
            ab = json.loads(Path(step["evidence"]["report"]).read_text())
            assert ab["config"]["max_pairs"] == LAST_LOOK and ab["config"]["looks"] == 2, ab["config"]
            measured = len({s["pair"] for s in ab["slices"] if s["pair"] >= 0})
            assert measured == ab["config"]["pairs"] in (FIRST_LOOK, LAST_LOOK), (measured, ab["config"])
            # it stopped early only where the step was decided (the rule's own reason to stop)
            assert measured == LAST_LOOK or step["judgement"] in ("BAD", "GOOD"), step
        # Built here or found from an earlier session: each counted once, never twice.
        sources = [e["source"] for e in first["environments"]]
        assert first["builds"] == sources.count("built"), sources  # built here, or left by an earlier session

        # The rerun: every one of the eight environments found built, none made again. `--build-only`
        # stops before the A/Bs (whose verdicts are the first run's question): its reuse is this one's.
        second, second_s, _ = bisect(matrix, out, "--build-only")
        assert second["builds"] == 0 and second["result"] == "NOT RUN" and second["steps"] == [], second
        assert [e["source"] for e in second["environments"]] == ["local"] * len(VERSIONS)
        assert [e["ref"] for e in second["environments"]] == [e["ref"] for e in first["environments"]]
        assert [e["digest"] for e in second["environments"]] == [e["digest"] for e in first["environments"]]
        print(f"bisect: first run {first_s:.0f}s ({first['builds']} builds), rerun {second_s:.0f}s (0 builds)")
    finally:
        shutil.rmtree(out, ignore_errors=True)
        for ref in layers:  # the layers this test made: a few kB each, named by content
            root = Path(ref.removeprefix("host:"))
            if "-L" in root.name:
                shutil.rmtree(root, ignore_errors=True)
                root.with_name(root.name + ".log").unlink(missing_ok=True)
