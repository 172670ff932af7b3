"""The H100's interrupted `stackproof ab` (tests/fixtures/gpu-ab-interrupted/README.md), read back:
the judge over its eight measured pairs, the engines it compared, and what its three starts cost
without a shared compile/JIT cache (why ab, bisect and sweep now share one per command)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from verify.perf.ab import AbConfig, SliceMetrics, judge, look_sizes, metrics_of_summary
from verify.perf.engines import engine_facts, mismatch

RUN = Path(__file__).parents[2] / "tests" / "fixtures" / "gpu-ab-interrupted"
INIT = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s \(compilation: ([\d.]+) s\)")


def measured_slices() -> list[SliceMetrics]:
    slices = []
    for pair in range(8):
        for side in ("A", "B"):
            load = json.loads((RUN / f"pair{pair:03d}" / side / "load.json").read_text())
            slices.append(
                SliceMetrics(
                    side=side,
                    pair=pair,
                    position=len(slices),
                    seconds=load["seconds"],
                    questions=load["questions"]["attempted"],
                    faulted=load["questions"]["faulted"],
                    values=metrics_of_summary(load),
                )
            )
    return slices


def test_the_judge_over_the_measured_pairs_calls_one_seq_a_regression_in_tok_s() -> None:
    sizes = look_sizes(12, 96)  # the GPU defaults the command ran with
    config = AbConfig(
        threshold=0.05, confidence=0.95, resamples=4000, slice_s=3.0, pairs=8, concurrency=8, seed=0,
        max_tokens=64, family=8, looks=len(sizes), max_pairs=sizes[-1],
    )  # fmt: skip
    report = judge(measured_slices(), a="cell", b="cell:one-seq", config=config)
    by_name = {m.name: m for m in report.metrics}
    tok = by_name["output_tok_s"]
    assert report.verdict == "REGRESSION" and tok.verdict == "REGRESSION" and tok.pairs == 8
    assert tok.change is not None and tok.ci_high is not None and -0.85 < tok.change < tok.ci_high < -0.75
    assert by_name["ttft_p50"].verdict == "REGRESSION" and by_name["tpot_p90"].verdict == "IMPROVEMENT"


def test_the_sides_started_apart_got_the_same_kv_cache() -> None:
    a = engine_facts((RUN / "server-A-restart" / "server.log").read_text())
    b = engine_facts((RUN / "server-B" / "server.log").read_text())
    assert (a.kv_cache_gib, b.kv_cache_gib) == (23.41, 23.44) and mismatch(a, b) is None


def test_every_start_paid_the_engine_init_cold_though_the_restart_was_meant_to_be_warm() -> None:
    inits = {}
    for server in ("server-A", "server-B", "server-A-restart"):
        (took, compiled), *_ = INIT.findall((RUN / server / "server.log").read_text())
        inits[server] = (float(took), float(compiled))
    assert all(took > 100 and compiled < 10 for took, compiled in inits.values()), inits
    said = (RUN / "ab.stderr").read_text()
    assert "restarting side A (h200-vllm-0.26.0-tiny), started first, on the caches now warm" in said
    assert "compile cache" not in said  # no server was given one
