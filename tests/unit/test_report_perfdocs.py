"""The report's compare view and sweep curve: the A/B, bisect and sweep documents of the producers,
found among the report's sources, rendered with their numbers; a malformed one refused, located."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pipeline.errors import InputError
from stackproof.cli import main
from stackproof.site_report.model import build_site
from stackproof.site_report.perfdocs import perfdocs_from_dirs
from stackproof.site_report.render import render_site
from stackproof.site_report.sources import receipts_from_dirs
from tests.unit.test_ab import config as ab_config
from tests.unit.test_ab import synthetic
from tests.unit.test_bisect import report as bisect_report
from tests.unit.test_sweep import config as sweep_config
from tests.unit.test_sweep import point
from verify.perf.ab import AbReport, judge
from verify.perf.bisection import BisectReport
from verify.perf.sweep import SweepReport, judge_sweep

RECEIPTS = Path(__file__).parents[1] / "fixtures" / "receipts"


def ab_document() -> AbReport:
    """The producer's judge over interleaved slices with a planted 10% effect: a REGRESSION."""
    return judge(synthetic(10, effect=0.10), a="cpu-tiny:base", b="cpu-tiny:bumped", config=ab_config(10))


def bisect_document() -> BisectReport:
    return replace(bisect_report(), cell="cpu-tiny", result="FOUND", first_bad="5.0", last_good="4.0",
                   reason="5.0 is the first bad version: 4.0 before it is good")  # fmt: skip


def sweep_document() -> SweepReport:
    points = [point(1, 100.0, 40.0), point(2, 180.0, 70.0), point(4, 300.0, 130.0), point(8, 320.0, 400.0)]
    return judge_sweep(points, target="cpu-tiny:base", config=sweep_config(100.0), seconds=30.0, files={})


def sources(tmp_path: Path, **override: Any) -> Path:
    """The fixture receipts with the three documents beside them, as the producers write them."""
    root = tmp_path / "runs"
    shutil.copytree(RECEIPTS, root)
    documents = {
        "ab/ab.json": ab_document().to_json(),
        "bisect/bisect.json": bisect_document().to_json(),
        "sweep/sweep.json": sweep_document().to_json(),
        **override,
    }
    for name, document in documents.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(document if isinstance(document, str) else json.dumps(document))
    return root


def site_of(root: Path) -> dict[str, str]:
    files = render_site(build_site(receipts_from_dirs([root])), generated_at="now", perf=perfdocs_from_dirs([root]))
    return {k: v.decode() for k, v in files.items() if k.endswith(".html")}


def test_the_documents_are_read_through_the_producers_types(tmp_path: Path) -> None:
    perf = perfdocs_from_dirs([sources(tmp_path)])
    assert [r for _, r in perf.ab] == [AbReport.from_json(ab_document().to_json())]
    assert [r for _, r in perf.bisect] == [bisect_document()]
    assert [r for _, r in perf.sweep] == [sweep_document()]
    assert perf.sweeps_of("cpu-tiny") and not perf.sweeps_of("cpu-tin")
    assert not perfdocs_from_dirs([RECEIPTS])  # receipts alone: no document, an empty view


def test_a_bisect_s_own_ab_runs_are_its_steps_not_ab_entries(tmp_path: Path) -> None:
    """bisect writes each step's ab.json under its own folder: they show in its table, once."""
    step = ab_document().to_json()
    root = sources(tmp_path, **{"bisect/steps/4.0/ab.json": step, "bisect/steps/5.0/ab.json": step})
    perf = perfdocs_from_dirs([root])
    assert [source for source, _ in perf.ab] == [str(root / "ab" / "ab.json")] and len(perf.bisect) == 1
    solo = perfdocs_from_dirs([root / "bisect" / "steps"])  # a step folder given alone is an A/B of its own
    assert len(solo.ab) == 2 and not solo.bisect


def test_the_compare_view_shows_each_metric_s_change_interval_and_verdict(tmp_path: Path) -> None:
    ab = ab_document()
    index = site_of(sources(tmp_path))["index.html"]
    assert 'id="compare-view"' in index
    assert "A/B: cpu-tiny:base → cpu-tiny:bumped" in index and "REGRESSION" in index
    for m in ab.metrics:
        assert m.change is not None and m.ci_low is not None and m.ci_high is not None
        row = f'{m.change * 100:+.1f}%</td><td class="num">[{m.ci_low * 100:+.1f}%, {m.ci_high * 100:+.1f}%]'
        assert row in index, m.name
    tpot = next(m for m in ab.metrics if m.name == "tpot_p50")
    assert 0.07 < (tpot.change or 0) < 0.13 and f"{(tpot.change or 0) * 100:+.1f}%" in index  # a ~+10% effect


def test_the_compare_view_shows_the_bisect_s_steps_and_first_bad_version(tmp_path: Path) -> None:
    index = site_of(sources(tmp_path))["index.html"]
    assert "Bisect: cpu-tiny, p 1.0 → 8.0 on tok_s" in index and "FOUND" in index
    assert '<strong class="first-bad">5.0</strong>' in index
    assert "<code>8.0</code></td><td>BAD</td>" in index  # the version tried and its judgement
    assert "[-70.0%, -50.0%]" in index and "1.0 … 8.0" in index  # the step's interval, the search's after it


def test_the_sweep_links_to_its_cell_whose_page_draws_the_curve_with_the_crossing(tmp_path: Path) -> None:
    pages = site_of(sources(tmp_path))
    assert (
        '<a href="cells/cpu-tiny.html#sweep">cpu-tiny:base</a>: concurrency sweep, CROSSES at 4' in pages["index.html"]
    )
    cell = pages["cells/cpu-tiny.html"]
    assert 'id="sweep"' in cell and "Throughput against TTFT p99: cpu-tiny:base" in cell
    assert 'crossed at concurrency <strong class="crossed">4</strong>' in cell
    assert "TTFT p99 limit 100 ms" in cell  # the declared limit, drawn as a line and said in the text
    assert "crosses at concurrency 4" in cell  # the plot's text alternative names the crossing
    assert '<th scope="row">4 <strong>crosses</strong></th>' in cell
    ids = re.findall(r'\bid="([^"]+)"', cell)
    assert len(ids) == len(set(ids))


def test_without_documents_the_view_says_how_to_make_them() -> None:
    files = render_site(build_site(receipts_from_dirs([RECEIPTS])), generated_at="now")
    index = files["index.html"].decode()
    assert "No ab.json, bisect.json or sweep.json among the sources" in index
    assert 'id="sweep"' not in files["cells/cpu-tiny.html"].decode()


@pytest.mark.parametrize(
    ("name", "edit", "message"),
    [
        ("ab/ab.json", lambda d: d.pop("verdict"), r"ab\.json: a malformed A/B report \(KeyError: 'verdict'\)"),
        ("ab/ab.json", lambda d: d.update(kind="stackproof.sweep"), r"ab\.json: not an A/B report"),
        (
            "bisect/bisect.json",
            lambda d: d.pop("steps"),
            r"bisect\.json: a malformed bisect report \(KeyError: 'steps'\)",
        ),
        ("sweep/sweep.json", lambda d: d["config"].pop("ttft_p99_limit_ms"), r"sweep\.json: .*'ttft_p99_limit_ms'"),
        ("ab/ab.json", lambda d: d.update(files=["x"]), r"ab\.json: a malformed A/B report \(AttributeError"),
        ("sweep/sweep.json", lambda d: d.update(points=[3]), r"sweep\.json: a malformed sweep report \(TypeError"),
        ("bisect/bisect.json", lambda d: d["steps"][0].update(interval=[]), r"bisect\.json: a malformed bisect"),
    ],
)
def test_a_malformed_document_is_refused_naming_the_file_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, edit: Any, message: str
) -> None:
    documents = {
        "ab/ab.json": ab_document(),
        "bisect/bisect.json": bisect_document(),
        "sweep/sweep.json": sweep_document(),
    }
    document = documents[name].to_json()
    edit(document)
    root = sources(tmp_path, **{name: document})
    with pytest.raises(InputError, match=message):
        perfdocs_from_dirs([root])
    assert main(["report", "--receipts", str(root), "--out", str(tmp_path / "site")]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and str(root / name) in err and "Traceback" not in err
    assert not (tmp_path / "site").exists()


def test_a_document_that_is_not_json_is_located(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = sources(tmp_path, **{"sweep/sweep.json": "{not json"})
    assert main(["report", "--receipts", str(root), "--out", str(tmp_path / "site")]) == 2
    assert re.search(r"sweep\.json:1:2: not JSON", capsys.readouterr().err)


def test_the_command_renders_the_documents_it_finds(tmp_path: Path) -> None:
    root = sources(tmp_path)
    assert main(["report", "--receipts", str(root), "--out", str(tmp_path / "site")]) == 0
    index = (tmp_path / "site" / "index.html").read_text()
    assert "A/B: cpu-tiny:base → cpu-tiny:bumped" in index and '<strong class="first-bad">5.0</strong>' in index
    assert (
        'crossed at concurrency <strong class="crossed">4</strong>'
        in (tmp_path / "site/cells/cpu-tiny.html").read_text()
    )
