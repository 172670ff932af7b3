"""`stackproof sweep` for real: one vLLM 0.28.0 CPU server of `cpu-tiny-host` on the host runtime,
kept up for a warm-up and four load points (concurrency 1, 2, 4, 8) of a few seconds each.

The curve's shape on any host: more requests in flight give more output tokens per second than one
at a time (the engine batches them) and a longer TTFT tail (they queue). The judge's reading of the
limit is proven both ways on the same real points: a limit above every point's TTFT p99 is WITHIN
LIMIT, one below the lightest load's is OVER AT FIRST. Bounded (a hang guard) and leaves nothing.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
import yaml

from pipeline.host.proc import marked_processes
from tests.integration.conftest import EAGER, IMAGES, MATRIX, REPO, runner_dir, stackproof, write_matrix
from verify.perf.sweep import SweepPoint, SweepReport, judge_sweep

pytestmark = pytest.mark.integration

CELL = "cpu-tiny-host"
SCHEMA = json.loads((REPO / "docs" / "sweep.schema.json").read_text())
SERVER = re.compile(r"server process group (\S+) on http://127\.0\.0\.1:")
# A server start took 7 min and more with three other vLLM servers compiling on the two cores (load
# average 35): the test's matrix waits up to READY_S, and the hang guard covers that and 5 slices of 4 s.
READY_S = 900
BOUND_S = READY_S + 180


@pytest.fixture(scope="module")
def built(cpu_tiny_host_env: str) -> None:
    """The cell's environment, built once per session (tests/integration/conftest.py)."""


@pytest.fixture
def out() -> Iterator[Path]:
    path = runner_dir(None, "sweep")
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


def patient(path: Path) -> Path:
    """The real matrix, the cell's server given READY_S to get ready on a crowded host, without
    torch.compile (EAGER in tests/integration/conftest.py)."""
    cell = next(c for c in yaml.safe_load(MATRIX.read_text())["cells"] if c["id"] == CELL)
    serve = {**cell["serve"], "args": [*cell["serve"]["args"], EAGER], "readiness_timeout": READY_S}
    return write_matrix(path, edit={CELL: {"serve": serve}})


def test_a_concurrency_sweep_draws_the_curve_and_reads_the_limit(built: None, out: Path) -> None:
    args = ["sweep", CELL, "--sweep", "concurrency=1,2,4,8", "--slice", "4", "--max-tokens", "16"]
    args += ["--matrix", str(patient(out / "matrix.yaml")), "--images", str(IMAGES)]
    done = stackproof([*args, "--ttft-p99-limit", "2s", "--out", str(out), "--json"], timeout=BOUND_S)
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads(done.stdout)
    jsonschema.validate(document, SCHEMA)
    assert json.loads(Path(document["files"]["report"]).read_text()) == document  # printed = written
    report = SweepReport.from_json(document)
    for p in report.points:  # the measured numbers, in the test log (-s)
        print(
            f"  c={p.value:g} tok/s {p.output_tok_s} TTFT p50 {p.ttft_p50_ms} p99 {p.ttft_p99_ms} TPOT {p.tpot_p50_ms}"
        )
    print(f"  {report.verdict}, crossed at {report.crossed_at}, best within limit {report.best_within_limit}")
    assert [p.value for p in report.points] == [1, 2, 4, 8]
    one, eight = report.points[0], report.points[-1]
    assert all(p.output_tok_s and p.ttft_p99_ms for p in report.points), report.points
    assert eight.output_tok_s > one.output_tok_s, (one, eight)  # type: ignore[operator]
    assert eight.ttft_p99_ms > one.ttft_p99_ms, (one, eight)  # type: ignore[operator]
    assert report == judge_sweep(
        list(report.points), target=report.target, config=report.config, seconds=report.seconds, files=report.files
    )  # the verdict in the document is the judge's on its own points
    p99s = [p.ttft_p99_ms for p in report.points if p.ttft_p99_ms is not None]
    assert _rejudged(report, max(p99s) + 1).verdict == "WITHIN LIMIT"
    low = _rejudged(report, min(p99s) / 2)
    assert (low.verdict, low.crossed_at, low.best_within_limit) == ("OVER AT FIRST", 1, None)
    runs = set(SERVER.findall(done.stderr))
    assert len(runs) == 1, runs  # one server for the whole sweep
    assert not [m for m in marked_processes() if m.run in runs], "the server outlived the sweep"


def _rejudged(report: SweepReport, limit: float) -> SweepReport:
    from dataclasses import replace

    points: list[SweepPoint] = list(report.points)
    config = replace(report.config, ttft_p99_limit_ms=limit)
    return judge_sweep(points, target=report.target, config=config, seconds=report.seconds, files=report.files)
