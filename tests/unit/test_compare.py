"""`stackproof compare`: greedy samples of two runs, agreement, first divergence, the gap there."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipeline.matrix.model import LoadSpec
from stackproof.cli import main
from verify.load import watchdog
from verify.load.compare import compare_runs, find_greedy, read_greedy, render_table, write_greedy
from verify.load.determinism import Sample
from verify.load.outcome import LoadTarget
from verify.load.run import run_load

from .fake_openai import FakeVllm


@pytest.fixture(autouse=True)
def _no_proxy_no_kernel_log(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(watchdog, "_kernel_xid", lambda since: [])


def _sample(prompt: int, tokens: list[int], gaps: list[float | None]) -> Sample:
    return Sample(prompt=prompt, phase="A", tokens=tuple(f"token_id:{t}" for t in tokens), top2_gaps=tuple(gaps))


def _run_dir(root: Path, name: str, samples: list[Sample], max_tokens: int = 4) -> Path:
    load = root / name / "load"
    load.mkdir(parents=True)
    write_greedy(load / "greedy.json", model="m", max_tokens=max_tokens, label=name, samples=samples)
    return root / name


REFERENCE = [_sample(0, [1, 2, 3, 4], [3.0, 2.0, 0.2, 5.0]), _sample(1, [7, 8, 9, 10], [4.0, 4.0, 4.0, 4.0])]


def test_a_fake_backed_load_run_saves_its_greedy_samples_and_two_identical_runs_agree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = LoadSpec(questions=2, concurrency=1, max_tokens=2, determinism_prompts=3, determinism_repeats=2)
    for name in ("a", "b"):
        with FakeVllm() as fake:
            outcome = run_load(LoadTarget(base_url=fake.url, label=name), spec, tmp_path / name / "load")
        assert outcome.files["greedy"] == str(tmp_path / name / "load" / "greedy.json")
    saved = read_greedy(tmp_path / "a" / "load" / "greedy.json")
    assert [p.index for p in saved.prompts] == [0, 1, 2] and saved.max_tokens == spec.determinism_max_tokens
    assert len(saved.prompts[0].tokens) == 16 and saved.prompts[0].top2_gaps[0] == pytest.approx(2.45)
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "the two runs agree on every token" in out and out.count("agree") >= 4


def test_a_divergence_at_a_small_gap_is_a_near_tie(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _run_dir(tmp_path, "bf16", REFERENCE)
    b = _run_dir(tmp_path, "fp32", [_sample(0, [1, 2, 30, 31], [3.0, 2.0, 0.3, 1.0]), REFERENCE[1]])
    assert main(["compare", str(a), str(b)]) == 0
    table = capsys.readouterr().out
    row = next(line for line in table.splitlines() if line.startswith("0 "))
    assert "50%" in row and " 2 " in row and "0.20" in row and "0.30" in row and row.endswith("near-tie")
    assert "near-ties only" in table


def test_a_divergence_at_a_large_gap_is_flagged_as_corruption(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _run_dir(tmp_path, "release", REFERENCE)
    b = _run_dir(tmp_path, "broken", [REFERENCE[0], _sample(1, [7, 99, 99, 99], [4.0, 32.0, 32.0, 32.0])])
    assert main(["compare", str(a), str(b), "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["corruption"] is True and document["labels"] == {"a": "release", "b": "broken"}
    second = document["prompts"][1]
    assert (second["divergence"], second["token_a"], second["token_b"]) == (1, "token_id:8", "token_id:99")
    assert (second["gap_a"], second["gap_b"], second["verdict"]) == (4.0, 32.0, "corruption")
    assert second["agreement"] == 0.25 and document["prompts"][0]["verdict"] == "agree"


def test_a_larger_near_tie_threshold_turns_corruption_into_a_near_tie(tmp_path: Path) -> None:
    a = read_greedy(find_greedy(_run_dir(tmp_path, "a", REFERENCE)))
    b = read_greedy(
        find_greedy(_run_dir(tmp_path, "b", [REFERENCE[0], _sample(1, [7, 99, 9, 10], [4.0, 3.0, 4.0, 4.0])]))
    )
    assert compare_runs(a, b).corrupted
    assert not compare_runs(a, b, near_tie_nats=5.0).corrupted
    assert "corruption: prompt(s) 1" in render_table(compare_runs(a, b))


def test_a_receipt_or_the_greedy_file_itself_names_the_samples(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, "run", REFERENCE)
    greedy = run / "load" / "greedy.json"
    receipt = run / "receipt.json"
    receipt.write_text(json.dumps(_receipt_naming(greedy)))
    assert find_greedy(receipt) == greedy == find_greedy(greedy) == find_greedy(run) == find_greedy(run / "load")
    elsewhere = tmp_path / "copied" / "greedy.json"  # the receipt's load artifact, not the file beside it
    elsewhere.parent.mkdir()
    elsewhere.write_text(greedy.read_text())
    receipt.write_text(json.dumps(_receipt_naming(elsewhere)))
    assert find_greedy(receipt) == elsewhere


def _receipt_naming(greedy: Path) -> dict[str, Any]:
    """A receipt as `stackproof run` writes it, whose load stage names `greedy` as its artifact."""
    from tests.unit.test_registry import _receipt

    document = _receipt()
    for stage in document["stages"]:
        if stage["stage"] == "load":
            stage["artifacts"] = {"greedy": str(greedy)}
    return document


@pytest.mark.parametrize(
    ("b_samples", "b_max_tokens", "message"),
    [
        ([REFERENCE[0]], 4, "prompts [0] differ from"),
        (REFERENCE, 8, "max_tokens 8 differs from"),
    ],
)
def test_runs_of_other_prompts_are_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], b_samples: list[Sample], b_max_tokens: int, message: str
) -> None:
    a = _run_dir(tmp_path, "a", REFERENCE)
    b = _run_dir(tmp_path, "b", b_samples, max_tokens=b_max_tokens)
    assert main(["compare", str(a), str(b)]) == 2
    assert message in capsys.readouterr().err


def test_a_run_without_samples_is_bad_input_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _run_dir(tmp_path, "a", REFERENCE)
    empty = tmp_path / "imports-only"
    empty.mkdir()
    assert main(["compare", str(a), str(empty), "--json"]) == 2
    captured = capsys.readouterr()
    assert f"{empty}: no greedy samples (greedy.json)" in captured.err
    assert json.loads(captured.out)["error"]["exit_code"] == 2
    assert main(["compare", str(a), str(tmp_path / "nope")]) == 2
    assert "no such run directory or file" in capsys.readouterr().err


def test_a_file_of_another_kind_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _run_dir(tmp_path, "a", REFERENCE)
    other = tmp_path / "greedy.json"
    other.write_text(json.dumps({"kind": "something-else"}))
    assert main(["compare", str(a), str(other)]) == 2
    assert "not a stackproof.greedy-samples file" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["-1", "nan", "lots"])
def test_a_bad_near_tie_threshold_is_a_usage_error(tmp_path: Path, value: str) -> None:
    a = _run_dir(tmp_path, "a", REFERENCE)
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", str(a), str(a), "--near-tie", value])
    assert exit_info.value.code == 2
