"""The sweep judge (verify/perf/sweep.py): where TTFT p99 crosses the limit, the best point before it,
the axis parser's refusals, and the JSON round trip against docs/sweep.schema.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from pipeline.errors import InputError
from verify.perf.sweep import SweepConfig, SweepPoint, SweepReport, judge_sweep, parse_sweep, point_of_summary

SCHEMA = json.loads((Path(__file__).parents[2] / "docs" / "sweep.schema.json").read_text())


def point(value: float, tok_s: float | None, ttft_p99: float | None) -> SweepPoint:
    return SweepPoint(
        value=value, seconds=5.0, questions=10, faulted=0, output_tok_s=tok_s,
        requests_s=None if tok_s is None else 1.0, ttft_p50_ms=None if ttft_p99 is None else ttft_p99 / 2,
        ttft_p99_ms=ttft_p99, tpot_p50_ms=5.0, e2el_p50_ms=90.0,
    )  # fmt: skip


def config(limit: float = 100.0) -> SweepConfig:
    return SweepConfig(
        axis="concurrency", values=(1, 2, 4, 8), slice_s=5.0, warmup_s=5.0, ttft_p99_limit_ms=limit, seed=0,
        max_tokens=16,
    )  # fmt: skip


def judged(points: list[SweepPoint], limit: float = 100.0) -> SweepReport:
    return judge_sweep(points, target="c", config=config(limit), seconds=30.0, files={})


def test_the_first_point_over_the_limit_is_where_it_crosses() -> None:
    report = judged([point(1, 100, 20), point(2, 180, 40), point(4, 300, 150), point(8, 320, 90)])
    assert (report.verdict, report.crossed_at, report.best_within_limit) == ("CROSSES", 4, 2)


def test_a_curve_under_the_limit_everywhere_is_within_it() -> None:
    report = judged([point(1, 100, 20), point(2, 180, 40), point(4, 170, 60)])
    assert (report.verdict, report.crossed_at, report.best_within_limit) == ("WITHIN LIMIT", None, 2)


def test_a_limit_the_lightest_load_misses_is_over_at_first() -> None:
    report = judged([point(1, 100, 20), point(2, 180, 40)], limit=10.0)
    assert (report.verdict, report.crossed_at, report.best_within_limit) == ("OVER AT FIRST", 1, None)


def test_a_point_that_answered_nothing_counts_as_over_the_limit() -> None:
    report = judged([point(1, 100, 20), point(2, None, None), point(4, 300, 30)])
    assert (report.verdict, report.crossed_at, report.best_within_limit) == ("CROSSES", 2, 1)


def test_a_point_of_a_real_summary_takes_its_percentiles() -> None:
    summary: dict[str, Any] = {
        "seconds": 5.2, "questions": {"attempted": 12, "faulted": 1}, "requests": {"ok": 11},
        "throughput": {"output_tok_s": 210.5, "requests_s": 2.1},
        "latency_ms": {"ttft": {"p50": 30.0, "p99": 80.0}, "tpot": {"p50": 6.0}, "e2el": {"p50": 120.0}, "itl": {}},
    }  # fmt: skip
    p = point_of_summary(4, summary)
    assert (p.output_tok_s, p.ttft_p50_ms, p.ttft_p99_ms, p.tpot_p50_ms, p.e2el_p50_ms) == (210.5, 30, 80, 6, 120)
    assert (p.questions, p.faulted) == (12, 1)
    nothing = point_of_summary(8, {**summary, "requests": {"ok": 0}, "latency_ms": {}})
    assert (nothing.output_tok_s, nothing.ttft_p99_ms) == (None, None)  # not a rate of 0 that looks measured


def test_the_report_round_trips_through_its_schema() -> None:
    report = judged([point(1, 100, 20), point(2, None, None)])
    document = json.loads(json.dumps(report.to_json(), allow_nan=False))
    jsonschema.validate(document, SCHEMA)
    assert SweepReport.from_json(document) == report
    with pytest.raises(InputError, match="not a sweep report"):
        SweepReport.from_json({**document, "kind": "stackproof.ab"})
    with pytest.raises(InputError, match="malformed"):
        SweepReport.from_json({k: v for k, v in document.items() if k != "points"})


def test_the_axis_parses_and_refuses_what_is_not_a_curve() -> None:
    assert parse_sweep("concurrency=1,2,4,8").values == (1, 2, 4, 8)
    assert parse_sweep("rate=0.5,1").name == "rate"
    for bad, why in (
        ("concurrency=1", "2 to"),
        ("qps=1,2", "AXIS"),
        ("concurrency=1,x", "not a number"),
        ("concurrency=1,2.5", "whole number"),
        ("rate=0,1", "positive"),
        ("concurrency=2,2", "twice"),
        ("concurrency", "AXIS"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_sweep(bad)


def test_the_runner_keeps_one_server_for_every_point(tmp_path: Path) -> None:
    """Fake-backed (tests/unit/fake_openai.py): one server made and removed once, a warm-up and a
    slice per point in the axis's order, each point's files, and sweep.json the report returned."""
    from pipeline.matrix.model import LoadSpec
    from pipeline.matrix.read import load_matrix
    from stackproof.ab import Side
    from stackproof.sweep import run_sweep

    from .fake_openai import FakeVllm
    from .test_ab import StandIn

    repo = Path(__file__).parents[2]
    cell = load_matrix(repo / "matrix.yaml", images_dir=repo / "images").cell("cpu-tiny-host")
    fake = FakeVllm(chunk_delay_s=0.002).start()
    removed: list[str] = []
    made: list[str] = []

    def new_server(runtime: Any, cell: Any, image: str, **_: Any) -> StandIn:
        made.append(image)
        return StandIn(fake, removed)

    try:
        report = run_sweep(
            Side(label="cpu-tiny-host", cell=cell, arm=None, runtime=None, image="s"),  # type: ignore[arg-type]
            axis=parse_sweep("concurrency=1,3"), spec=LoadSpec(max_tokens=8, scrape_interval_s=0.2), slice_s=0.6,
            ttft_p99_limit_ms=60_000.0, out_dir=tmp_path, new_server=new_server,
        )  # fmt: skip
    finally:
        fake.stop()
    assert made == ["s"] and len(removed) == 1  # one server for the whole sweep
    assert [p.value for p in report.points] == [1, 3]
    assert all(p.output_tok_s and p.questions for p in report.points), report.points
    assert (report.verdict, report.crossed_at) == ("WITHIN LIMIT", None)
    for name in ("warmup", "point000", "point001"):
        assert json.loads((tmp_path / name / "load.json").read_text())["questions"]["attempted"] > 0
    assert SweepReport.from_json(json.loads((tmp_path / "sweep.json").read_text())) == report


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--sweep", "qps=1,2"], "--sweep"),
        (["--sweep", "concurrency=1"], "--sweep"),
        (["--sweep", "concurrency=1,2", "--ttft-p99-limit", "0ms"], "--ttft-p99-limit"),
        (["--sweep", "concurrency=1,2", "--ttft-p99-limit", "soon"], "--ttft-p99-limit"),
        (["--sweep", "concurrency=1,2", "--slice", "0"], "--slice"),
        ([], "--sweep"),
    ],
)
def test_bad_options_are_exit_2_naming_the_option(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from stackproof.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["sweep", "cpu-tiny-host", *argv, "--json"])
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert named in err
    assert json.loads(out)["error"]["exit_code"] == 2


@pytest.mark.parametrize(
    ("target", "said"), [("no-such-cell", "no cell 'no-such-cell'"), ("cpu-tiny-host:nope", "no arm")]
)
def test_an_unknown_cell_or_arm_is_exit_2_before_anything_starts(
    target: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from stackproof.cli import main

    assert main(["sweep", target, "--sweep", "concurrency=1,2", "--json"]) == 2
    assert said in json.loads(capsys.readouterr().out)["error"]["message"]


def test_the_limit_reads_milliseconds_and_seconds() -> None:
    from stackproof.cli.sweep import parse_limit_ms

    assert (parse_limit_ms("2s"), parse_limit_ms("1500ms"), parse_limit_ms("250")) == (2000.0, 1500.0, 250.0)
