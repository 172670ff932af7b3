"""`ab`, `bisect` and `sweep` on a GPU host (issue 45), without a GPU: the engine facts and the refusal
of sides whose KV caches differ, the sequential looks and where they stop, the start order (apart,
the first restarted), the GPU defaults, and `--python` for a host cell with no `install:`.

The runner's servers are stand-ins (start, ready, state, remove, a log file) and its slices are
drawn, not measured (`measure_slices` replaced): what is tested is the schedule around them. The
slices against real fake servers are tests/unit/test_ab.py's (slow tier)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema
import numpy as np
import pytest

from pipeline.matrix.read import load_matrix
from stackproof.cli import main
from verify.perf.ab import AbReport, SliceMetrics, look_sizes, per_metric_confidence
from verify.perf.engines import EngineFacts, engine_facts, mismatch

REPO = Path(__file__).parents[2]
FIXTURES = REPO / "tests" / "fixtures"
H200_LOG = FIXTURES / "h200-vllm-0.26.0" / "receipts" / "pass-bf16" / "server.log"
H200_FP8_LOG = FIXTURES / "h200-vllm-0.26.0" / "receipts" / "pass-fp8" / "server.log"
CPU_LOG = FIXTURES / "logs" / "vllm-0.28.0-cpu-startup.log"
SCHEMA = json.loads((REPO / "docs" / "ab.schema.json").read_text())
GPU_CELL = "h200-vllm-0.26.0-tiny"
MATRIX = load_matrix(REPO / "matrix.yaml", images_dir=REPO / "images")


def starved(text: str) -> str:
    """The real H200 log with the figures the H100 gave the side started second when both started at
    once (shared/reference/gpu-docker.md, section 4: 0.63 GiB, 330 k tokens against 26.47 GiB)."""
    return text.replace("Available KV cache memory: 41.59 GiB", "Available KV cache memory: 0.63 GiB").replace(
        "GPU KV cache size: 21,803,104 tokens", "GPU KV cache size: 330,016 tokens"
    )


# -- the engine facts, from real logs --------------------------------------------------------------


def test_the_kv_cache_facts_come_from_real_vllm_logs() -> None:
    gpu = engine_facts(H200_LOG.read_text())
    assert (gpu.kv_cache_gib, gpu.kv_cache_tokens) == (41.59, 21_803_104)
    cpu = engine_facts(CPU_LOG.read_text())  # a CPU engine writes the token count only
    assert (cpu.kv_cache_gib, cpu.kv_cache_tokens) == (None, 524_288)
    assert engine_facts("no engine lines here") == EngineFacts(kv_cache_gib=None, kv_cache_tokens=None)


def test_two_lone_starts_compare_and_a_starved_side_is_refused() -> None:
    """bf16 against fp8 (two real H200 starts, 41.59 GiB each, 2,672 tokens apart) compare; the
    concurrent start's 41.59 against 0.63 GiB is refused, naming both; so is a negative cache."""
    text = H200_LOG.read_text()
    assert mismatch(engine_facts(text), engine_facts(H200_FP8_LOG.read_text())) is None
    why = mismatch(engine_facts(text), engine_facts(starved(text)))
    assert why is not None and "66.02-fold" in why and "A 41.59 GiB, B 0.63 GiB" in why
    dead = text.replace("Available KV cache memory: 41.59 GiB", "Available KV cache memory: -0.63 GiB")
    assert "side B's engine has -0.63 GiB" in str(mismatch(engine_facts(text), engine_facts(dead)))
    cpu = engine_facts(CPU_LOG.read_text())  # no memory line: the token counts decide
    half = EngineFacts(kv_cache_gib=None, kv_cache_tokens=262_144)
    assert mismatch(cpu, cpu) is None and "tokens" in str(mismatch(cpu, half))
    assert mismatch(cpu, half, tolerance=1.5) is None  # within a wider tolerance


# -- the sequential looks --------------------------------------------------------------------------


def test_looks_double_up_to_the_largest() -> None:
    assert look_sizes(12, 96) == [12, 24, 48, 96]
    assert look_sizes(12, 30) == [12, 24, 30]
    assert look_sizes(5, 5) == [5]


class StandIn:
    """A server as run_ab sees it: start, ready, state, remove, and a log on disk."""

    def __init__(self, key: str, log: Path, events: list[str], text: str) -> None:
        self.key, self.events, self.log_path = key, events, log
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(text)
        self.base_url = f"http://stand-in/{key}"
        self.cache_use: Any = None
        self.shared_cache: set[str] | None = None  # slots filled by earlier starts (a compile cache), or none

    def start(self) -> None:
        self.events.append(f"start {self.key}")
        if self.shared_cache is not None:
            self.cache_use = SimpleNamespace(warm="tiny" in self.shared_cache)
            self.shared_cache.add("tiny")

    def wait_ready(self) -> None:
        self.events.append(f"ready {self.key}")

    def state(self) -> tuple[str, int]:
        return ("running", 0)

    def remove(self) -> None:
        self.events.append(f"remove {self.key}")


def drawn_slices(noise: float, effect: float = 0.0) -> Any:
    """A `measure_slices` that draws each slice's metrics: log-normal noise, B `effect` slower."""
    rng = np.random.default_rng(7)

    def measure(servers: Any, sides: Any, spec: Any, slice_s: float, order: list[tuple[int, str]], out_dir: Path,
                *, first_position: int = 0) -> list[SliceMetrics]:  # fmt: skip
        made = []
        for offset, (pair, side) in enumerate(order):
            worse = 1 + effect if side == "B" else 1.0
            jitter = float(np.exp(rng.normal(0, noise)))
            values: dict[str, float | None] = {
                name: 10.0 * worse * jitter for name in ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90")
            }
            values |= {n: 10.0 * worse * jitter for n in ("itl_p50", "itl_p90", "e2el_p50")}
            values["output_tok_s"] = 1000.0 / worse * jitter
            made.append(SliceMetrics(side=side, pair=pair, position=first_position + offset, seconds=slice_s,
                                     questions=8, faulted=0, values=values))  # fmt: skip
        return made

    return measure


def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, logs: tuple[str, str] = ("", ""), noise: float = 0.01,
        effect: float = 0.0, cache: set[str] | None = None, **plan: Any) -> tuple[AbReport, list[str]]:  # fmt: skip
    import stackproof.ab as ab
    from pipeline.matrix.model import LoadSpec

    events: list[str] = []
    made: dict[str, int] = {}

    def new_server(runtime: Any, cell: Any, image: str, *, out_dir: Path, **_: Any) -> StandIn:
        made[image] = made.get(image, 0) + 1
        key = image if made[image] == 1 else f"{image}{made[image]}"
        server = StandIn(key, out_dir / "server.log", events, logs[0] if image == "A" else logs[1])
        server.shared_cache = cache
        return server

    monkeypatch.setattr(ab, "measure_slices", drawn_slices(noise, effect))
    cell = MATRIX.cell(GPU_CELL)
    sides = [ab.Side(label=f"{GPU_CELL}{s}", cell=cell, arm=None, runtime=None, image=k)  # type: ignore[arg-type]
             for k, s in (("A", ""), ("B", ":b"))]  # fmt: skip
    settings = {"slice_s": 1.0, "pairs": 12, "max_pairs": 96} | plan
    report = ab.run_ab(sides[0], sides[1], spec=LoadSpec(), plan=ab.Plan(**settings), out_dir=tmp_path,
                       new_server=new_server)  # fmt: skip
    return report, events


def test_a_quiet_a_a_stops_at_the_first_look_no_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report, _ = run(tmp_path, monkeypatch, noise=0.005)
    assert report.verdict == "NO CHANGE" and report.config.pairs == 12
    assert len([s for s in report.slices if s.pair >= 0]) == 24  # 12 pairs: one look, no more measured
    assert report.config.looks == 4 and report.config.max_pairs == 96
    jsonschema.validate(report.to_json(), SCHEMA)
    assert AbReport.from_json(json.loads((tmp_path / "ab.json").read_text())) == report


def test_a_noisy_a_a_looks_again_until_every_metric_is_decided(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """6% per slice (the H100 p90s and TTFT): 12 pairs leave metrics UNDECIDED, a later look decides them."""
    report, _ = run(tmp_path, monkeypatch, noise=0.06)
    assert report.config.pairs > 12 and report.verdict == "NO CHANGE"
    assert [s.pair for s in report.slices if s.side == "A"] == [-1, *range(report.config.pairs)]
    positions = [s.position for s in report.slices]
    assert positions == list(range(len(positions)))  # the looks continue one interleaving


def test_a_regression_is_called_at_the_first_look_with_its_sign(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report, _ = run(tmp_path, monkeypatch, noise=0.005, effect=0.2)
    tok = next(m for m in report.metrics if m.name == "output_tok_s")
    assert report.verdict == "REGRESSION" and report.config.pairs == 12
    assert tok.verdict == "REGRESSION" and tok.change is not None and tok.change < -0.1


def test_each_look_pays_for_the_looks_planned() -> None:
    """Bonferroni over 8 metrics and 4 looks: 99.84% per metric and look, against 99.375% for one."""
    assert per_metric_confidence(0.95, 8 * 4) == pytest.approx(1 - 0.05 / 32)
    assert per_metric_confidence(0.95, 8) == pytest.approx(0.99375)


# -- the starts -------------------------------------------------------------------------------------


def test_apart_each_side_is_ready_before_the_next_starts_and_the_first_is_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = H200_LOG.read_text()
    report, events = run(tmp_path, monkeypatch, logs=(text, text), noise=0.005, apart=True, restart_first=True)
    assert events[:7] == ["start A", "ready A", "start B", "ready B", "remove A", "start A2", "ready A2"]
    assert sorted(events[7:]) == ["remove A2", "remove B"]  # each server removed once, the restarted one too
    assert report.engines["A"]["restarted"] and not report.engines["B"]["restarted"]
    assert report.engines["A"]["kv_cache_gib"] == report.engines["B"]["kv_cache_gib"] == 41.59
    assert report.engines["A"]["compile_cache"] is report.engines["B"]["compile_cache"] is None  # no cache given


def test_with_a_shared_cache_the_restart_makes_both_sides_warm_and_the_report_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stackproof.cli.ab import _text

    text = H200_LOG.read_text()
    both, _ = run(tmp_path / "r", monkeypatch, logs=(text, text), apart=True, restart_first=True, cache=set())
    assert both.engines["A"]["compile_cache"] == both.engines["B"]["compile_cache"] == "warm"
    assert "started #1, restarted, compile cache warm" in _text(both)
    jsonschema.validate(both.to_json(), SCHEMA)
    once, _ = run(tmp_path / "n", monkeypatch, logs=(text, text), apart=True, restart_first=False, cache=set())
    assert (once.engines["A"]["compile_cache"], once.engines["B"]["compile_cache"]) == ("cold", "warm")


def test_together_both_start_before_either_is_waited_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, events = run(tmp_path, monkeypatch, apart=False, restart_first=False)
    assert events[:4] == ["start A", "start B", "ready A", "ready B"]


def test_a_kv_cache_mismatch_is_refused_before_any_slice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both ready, 41.59 against 0.63 GiB: REFUSED with both figures, no slice measured, ab.json
    written and valid; with the tolerance off (--allow-kv-mismatch) the same sides are measured."""
    text = H200_LOG.read_text()
    report, events = run(tmp_path / "r", monkeypatch, logs=(text, starved(text)), apart=True)
    assert report.verdict == "REFUSED" and report.slices == () and report.metrics == ()
    assert report.refusal is not None and "0.63 GiB" in report.refusal
    assert events[:4] == ["start A", "ready A", "start B", "ready B"] and sorted(events[4:]) == ["remove A", "remove B"]
    jsonschema.validate(report.to_json(), SCHEMA)
    allowed, _ = run(tmp_path / "a", monkeypatch, logs=(text, starved(text)), kv_tolerance=None)
    assert allowed.verdict != "REFUSED" and allowed.slices


# -- the command line -------------------------------------------------------------------------------


def test_gpu_defaults_and_cpu_defaults() -> None:
    from stackproof.ab import defaults_for

    gpu, cpu = defaults_for(MATRIX.cell(GPU_CELL)), defaults_for(MATRIX.cell("cpu-tiny-host"))
    assert (gpu.slice_s, gpu.pairs, gpu.max_pairs, gpu.apart, gpu.restart_first) == (3.0, 12, 96, True, True)
    assert (cpu.slice_s, cpu.pairs, cpu.max_pairs, cpu.apart, cpu.restart_first) == (20.0, 5, 5, False, False)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["ab", GPU_CELL, GPU_CELL, "--pairs", "12", "--max-pairs", "6"], "--max-pairs 6: must be at least --pairs"),
        (["ab", GPU_CELL, GPU_CELL], "has no `install:` to build a host environment from: pass --python PY"),
        (["ab", GPU_CELL, GPU_CELL, "--python", "/no/such/python"], "--python /no/such/python: no such file"),
        (["ab", "cpu-tiny", "cpu-tiny", "--python", "/usr/bin/python3"], "only for a host cell"),
        (["sweep", GPU_CELL, "--sweep", "concurrency=1,2", "--python", "/no/such/python"], "no such file"),
    ],
)
def test_bad_gpu_options_are_exit_2_before_anything_starts(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--json"]) == 2
    assert said in json.loads(capsys.readouterr().out)["error"]["message"]


def test_the_refusal_reads_as_what_to_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from stackproof.cli.ab import _text

    text = H200_LOG.read_text()
    report, _ = run(tmp_path, monkeypatch, logs=(text, starved(text)), apart=True)
    said = _text(report)
    assert "engine A: KV cache 41.59 GiB (21,803,104 tokens), started #1" in said
    assert "engine B: KV cache 0.63 GiB (330,016 tokens), started #2" in said
    assert "REFUSED: the sides' KV cache memory differ 66.02-fold" in said and "fix: start the sides apart" in said


def test_a_bisect_step_stops_on_its_own_metric(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bisect --metric tok_s: a step whose tok/s is decided (GOOD or BAD) stops at the first look even
    while other metrics are UNDECIDED; the same drawn slices under the A/B's own rule look on."""
    from dataclasses import replace

    import stackproof.ab as ab
    from stackproof.bisection import step_decided

    stop = step_decided("tok_s")
    report, _ = run(tmp_path / "tok", monkeypatch, noise=0.06, effect=0.8, stop=stop)
    assert report.config.pairs == 12  # tok/s -44%: BAD at the first look
    whole, _ = run(tmp_path / "all", monkeypatch, noise=0.06)
    assert whole.config.pairs > 12  # an A/A at 6%: the p90s need more looks
    assert step_decided("greedy")(whole) and step_decided("start")(whole)
    assert ab.Plan(slice_s=1.0, pairs=2, max_pairs=2).stop is ab.decided
    assert replace(ab.Plan(slice_s=1.0, pairs=2, max_pairs=2), stop=stop).stop is stop


def test_a_refused_bisect_step_is_exit_3_naming_the_sides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import stackproof.bisection as bisection
    from pipeline.errors import InfraError
    from stackproof.ab import Plan

    text = H200_LOG.read_text()
    refused, _ = run(tmp_path, monkeypatch, logs=(text, starved(text)))
    monkeypatch.setattr(bisection, "run_ab", lambda *args, **kwargs: refused)
    cell = MATRIX.cell(GPU_CELL)
    ask = bisection.Bisect(cell=cell, package="p", good="1.0", bad="8.0", metric="tok_s", threshold=0.05, index=None,
                           plan=Plan(slice_s=1.0, pairs=2, max_pairs=2))  # fmt: skip
    a, b = (SimpleNamespace(label=f"{GPU_CELL}@p=={v}") for v in ("1.0", "5.0"))
    with pytest.raises(InfraError, match=r"@p==5\.0 against .*@p==1\.0: REFUSED: the sides' KV cache memory differ"):
        bisection._step(a, b, ask, None, tmp_path / "step", None)  # type: ignore[arg-type]


def test_slices_whose_client_was_cpu_bound_are_named_and_not_judged() -> None:
    """A client at 97% of a core in two of four slices: the report says so beside the verdicts; the
    share is not a metric (the verdicts are the same without it)."""
    from stackproof.cli.ab import _text
    from verify.perf.ab import CLIENT_CPU, AbConfig, judge

    def slices(shares: list[float | None]) -> list[SliceMetrics]:
        made = []
        for i, share in enumerate(shares):
            values: dict[str, float | None] = {"output_tok_s": 1000.0 + i, "tpot_p50": 2.0}
            if share is not None:
                values[CLIENT_CPU] = share
            made.append(SliceMetrics(side="AB"[i % 2], pair=i // 2, position=i, seconds=3.0, questions=8, faulted=0,
                                     values=values))  # fmt: skip
        return made

    config = AbConfig(threshold=0.05, confidence=0.95, resamples=500, slice_s=3.0, pairs=2, concurrency=64, seed=0,
                      max_tokens=64)  # fmt: skip
    bound = judge(slices([0.97, 0.97, 0.4, 0.4]), a="a", b="b", config=config)
    quiet = judge(slices([0.4, 0.4, 0.4, 0.4]), a="a", b="b", config=config)
    unsaid = judge(slices([None, None, None, None]), a="a", b="b", config=config)
    assert "client: more than 85% of a core in 2 of 4 slices" in _text(bound)
    assert "client:" not in _text(quiet) and "client:" not in _text(unsaid)
    assert [m.verdict for m in bound.metrics] == [m.verdict for m in unsaid.metrics]
