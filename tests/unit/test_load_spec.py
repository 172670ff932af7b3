"""`serve.load` in matrix.yaml (typed values and located problems), and the load options of the CLI."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.matrix.model import LoadSpec
from stackproof.cli import main

SOURCE_INDENT = " " * 8
CELL = """\
cells:
  - id: a
    base: img
    platform: linux/amd64
    arch: none
"""


def doc(*parts: str) -> str:
    """Join YAML snippets written inside test functions: 8 spaces of source indentation are column 0."""
    return "".join(
        line[len(SOURCE_INDENT) :] if line.startswith(SOURCE_INDENT) else line
        for part in parts
        for line in part.splitlines(keepends=True)
    )


SERVE = """\
    serve:
      model: {source: "path:/m"}
      load:
"""


def with_load(header: str, load_block: str) -> str:
    """A one-cell matrix whose serve.load is `load_block` (YAML at column 0, indented here under `load:`)."""
    return header + doc(CELL, SERVE) + "".join(f"{' ' * 8}{line}\n" for line in doc(load_block).splitlines())


def test_no_load_block_is_the_short_run_default(load: Callable[..., Any], header: str) -> None:
    matrix = load(header + doc(CELL, "    serve:\n      model: {source: 'path:/m'}\n"))
    serve = matrix.cell("a").serve
    assert serve is not None and serve.load == LoadSpec()


def test_valid_load_block_gives_the_load_spec(load: Callable[..., Any], header: str, tmp_path: Path) -> None:
    (tmp_path / "questions.jsonl").write_text('{"id": "q", "turns": ["a", "b"]}\n')
    text = with_load(
        header,
        """\
        questions: 12
        concurrency: 3
        rate: 2
        burstiness: 0.5
        max_tokens: 64
        ignore_eos: false
        duration: 30
        seed: 0
        questions_file: questions.jsonl
        ttft_timeout: 90
        chunk_timeout: 12.5
        stall_seconds: 45
        scrape_interval: 0.5
        warmup: 0
        max_errors: 3
        baseline_rate: 1/450
        determinism: {prompts: 2, repeats: 4, max_tokens: 8}
        """,
    )
    serve = load(text).cell("a").serve
    assert serve is not None
    assert serve.load == LoadSpec(
        questions=12,
        concurrency=3,
        rate=2.0,
        burstiness=0.5,
        max_tokens=64,
        ignore_eos=False,
        duration_s=30.0,
        seed=0,
        questions_file=str(tmp_path / "questions.jsonl"),  # relative to matrix.yaml, made absolute
        ttft_timeout_s=90.0,
        chunk_timeout_s=12.5,
        stall_seconds=45.0,
        scrape_interval_s=0.5,
        warmup_s=0.0,
        max_errors=3,
        determinism_prompts=2,
        determinism_repeats=4,
        determinism_max_tokens=8,
        baseline_rate=1 / 450,
    )
    assert isinstance(serve.load.duration_s, float) and isinstance(serve.load.rate, float)


def test_partial_load_block_keeps_the_other_defaults(load: Callable[..., Any], header: str) -> None:
    text = with_load(header, "duration: 30\ndeterminism: {prompts: 2}\nbaseline_rate: 0.00222\n")
    spec = load(text).cell("a").serve.load
    assert spec == LoadSpec(duration_s=30.0, determinism_prompts=2, baseline_rate=0.00222)
    assert spec.determinism_repeats == LoadSpec().determinism_repeats


def test_load_block_is_inherited_from_defaults(load: Callable[..., Any], header: str) -> None:
    text = header + doc(
        """\
        defaults:
          serve:
            model: {source: "path:/m"}
            load: {stall_seconds: 20, concurrency: 2}
        cells:
          - id: a
            base: img
            platform: linux/amd64
            arch: none
        """
    )
    spec = load(text).cell("a").serve.load
    assert (spec.stall_seconds, spec.concurrency) == (20.0, 2)


@pytest.mark.parametrize(
    ("line", "key", "message"),
    [
        ("concurrency: -2", "concurrency", "must be a positive integer, got -2"),
        ("questions: 0", "questions", "must be a positive integer, got 0"),
        ("max_tokens: 2.5", "max_tokens", "must be a positive integer, got 2.5"),
        ("max_errors: true", "max_errors", "must be a positive integer, got True"),
        ("seed: -1", "seed", "must be a non-negative integer, got -1"),
        ("ignore_eos: 1", "ignore_eos", "must be true or false, got 1"),
        ("ignore_eos: 'false'", "ignore_eos", "must be true or false, got 'false'"),
        ("duration: 0", "duration", "must be a positive number, got 0"),
        ("stall_seconds: fast", "stall_seconds", "must be a positive number, got 'fast'"),
        ("warmup: -1", "warmup", "must be a positive number, got -1"),
        ("rate: -0.5", "rate", "must be a positive number, got -0.5"),
        ("duration_s: 30", "duration_s", "unknown key, did you mean 'duration'?"),
        (
            "baseline_rate: 1/0",
            "baseline_rate",
            "'1/0' is not a probability: write a fraction (1/450) or a decimal (0.00222)",
        ),
        (
            "baseline_rate: 2",
            "baseline_rate",
            "'2' is not a probability: write a fraction (1/450) or a decimal (0.00222)",
        ),
        (
            "baseline_rate: one in 450",
            "baseline_rate",
            "'one in 450' is not a probability: write a fraction (1/450) or a decimal (0.00222)",
        ),
    ],
)
def test_bad_load_values_are_located(
    invalid: Callable[..., Any], header: str, line: str, key: str, message: str
) -> None:
    r = invalid(with_load(header, f"burstiness: 1.5\n{line}\n"))
    assert r.problems == [f"{r.at(line)}: cells[0].serve.load.{key}: {message}"]


def test_missing_questions_file_is_located(invalid: Callable[..., Any], header: str, tmp_path: Path) -> None:
    r = invalid(with_load(header, "questions_file: nope.jsonl\n"))
    assert r.problems == [
        f"{r.at('questions_file:')}: cells[0].serve.load.questions_file: no such file: {tmp_path / 'nope.jsonl'}"
    ]


def test_a_bad_determinism_value_is_located(invalid: Callable[..., Any], header: str) -> None:
    r = invalid(with_load(header, "determinism:\n  repeats: 0\n"))
    assert r.problems == [
        f"{r.at('repeats: 0')}: cells[0].serve.load.determinism.repeats: must be a positive integer, got 0"
    ]


def test_unknown_load_key_is_located_with_did_you_mean(invalid: Callable[..., Any], header: str) -> None:
    r = invalid(with_load(header, "concurency: 4\n"))
    assert r.problems == [
        f"{r.at('concurency')}: cells[0].serve.load.concurency: unknown key, did you mean 'concurrency'?"
    ]


def test_unknown_determinism_key_is_located_with_did_you_mean(invalid: Callable[..., Any], header: str) -> None:
    r = invalid(with_load(header, "determinism:\n  prompt: 2\n"))
    assert r.problems == [
        f"{r.at('prompt: 2')}: cells[0].serve.load.determinism.prompt: unknown key, did you mean 'prompts'?"
    ]


def test_matrix_validate_exits_2_on_an_unknown_load_key(
    write_matrix: Callable[..., Any], header: str, capsys: pytest.CaptureFixture[str]
) -> None:
    file = write_matrix(with_load(header, "concurency: 4\n"))
    assert main(["matrix", "validate", "--matrix", str(file)]) == 2
    assert "cells[0].serve.load.concurency: unknown key, did you mean 'concurrency'?" in capsys.readouterr().err


def test_determinism_keys_are_not_top_level_load_keys(invalid: Callable[..., Any], header: str) -> None:
    r = invalid(with_load(header, "determinism_prompts: 2\n"))
    assert len(r.problems) == 1
    assert r.problems[0].startswith(
        f"{r.at('determinism_prompts')}: cells[0].serve.load.determinism_prompts: unknown key"
    )


def test_load_must_be_a_mapping(invalid: Callable[..., Any], header: str) -> None:
    r = invalid(header + doc(CELL, SERVE) + "        - 1\n")
    assert r.problems == [f"{r.at('load:')}: cells[0].serve.load: must be a mapping, got a list"]


def test_every_bad_load_value_is_reported_at_once(invalid: Callable[..., Any], header: str) -> None:
    r = invalid(with_load(header, "concurrency: 0\nduration: -1\n"))
    assert r.problems == [
        f"{r.at('concurrency: 0')}: cells[0].serve.load.concurrency: must be a positive integer, got 0",
        f"{r.at('duration: -1')}: cells[0].serve.load.duration: must be a positive number, got -1",
    ]


# -- the CLI's load options ---------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _restore_sigterm() -> Iterator[None]:
    """main() installs a SIGTERM handler; it must not outlive a test."""
    handler = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, handler)


def test_load_refuses_a_url_off_this_machine(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["load", "--url", "http://10.0.0.1:8000", "--out", str(tmp_path / "out")]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        "stackproof: error: --url http://10.0.0.1:8000: load goes to a server on this machine only (127.0.0.1)\n"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("option", "value"), [("--questions", "0"), ("--concurrency", "-1"), ("--duration", "0")])
def test_non_positive_load_options_are_usage_errors(
    capsys: pytest.CaptureFixture[str], option: str, value: str
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["load", "--url", "http://127.0.0.1:8000", option, value])
    assert info.value.code == 2
    assert f"argument {option}: '{value}' must be positive" in capsys.readouterr().err


def test_a_bad_questions_file_is_a_usage_error_before_any_request(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    file = tmp_path / "q.jsonl"
    file.write_text('{"id": "a", "turns": ["only one"]}\n')
    # port 9 (discard): nothing must be sent there, the file is checked first
    assert main(["load", "--url", "http://127.0.0.1:9", "--questions-file", str(file)]) == 2
    assert capsys.readouterr().err == f"stackproof: error: {file}:1: turns: a question has 2-3 turns, got 1\n"


def test_a_bad_baseline_rate_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["load", "--url", "http://127.0.0.1:9", "--baseline-rate", "3/2"]) == 2
    assert "--baseline-rate '3/2': must be between 0 and 1" in capsys.readouterr().err


def test_command_line_options_override_only_what_they_set(tmp_path: Path) -> None:
    from stackproof.cli import _parser
    from stackproof.cli.common import load_spec as _load_spec

    file = tmp_path / "q.jsonl"
    file.write_text('{"id": "a", "turns": ["x", "y"]}\n')
    argv = ["load", "--url", "http://127.0.0.1:9", "--questions", "5", "--duration", "30", "--chunk-timeout", "2.5"]
    args = _parser().parse_args([*argv, "--baseline-rate", "1/100", "--questions-file", str(file)])
    cell = LoadSpec(concurrency=3, stall_seconds=20.0)
    assert _load_spec(args, cell) == LoadSpec(
        questions=5,
        concurrency=3,
        duration_s=30.0,
        stall_seconds=20.0,
        chunk_timeout_s=2.5,
        baseline_rate=0.01,
        questions_file=str(file),
    )
    assert _load_spec(_parser().parse_args(["load", "--url", "http://127.0.0.1:9"]), cell) == cell


def test_determinism_repeats_may_be_zero_but_not_negative(capsys: pytest.CaptureFixture[str]) -> None:
    from stackproof.cli import _parser
    from stackproof.cli.common import load_spec as _load_spec

    args = _parser().parse_args(["load", "--url", "http://127.0.0.1:9", "--determinism-repeats", "0"])
    assert _load_spec(args, LoadSpec()).determinism_repeats == 0
    with pytest.raises(SystemExit) as info:
        main(["load", "--url", "http://127.0.0.1:9", "--determinism-repeats", "-1"])
    assert info.value.code == 2
    assert "argument --determinism-repeats: '-1' must not be negative" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("value", "shown"),
    [("0", "0"), ("1.5", "1.5"), ("yes", "True"), ("'high'", "'high'"), ("-0.2", "-0.2")],
)
def test_a_bad_canary_floor_is_located(invalid: Callable[..., Any], header: str, value: str, shown: str) -> None:
    r = invalid(with_load(header, f"canary_floor: {value}\n"))
    assert len(r.problems) == 1
    assert r.problems[0].startswith(f"{r.at('canary_floor')}: cells[0].serve.load.canary_floor: must be a share")
    assert shown in r.problems[0]


def test_a_canary_floor_is_read_and_none_is_the_default(load: Callable[..., Any], header: str) -> None:
    matrix = load(with_load(header, "canary_floor: 0.75\n"))
    serve = matrix.cell("a").serve
    assert serve is not None and serve.load.canary_floor == 0.75
    assert LoadSpec().canary_floor is None


def test_matrix_validate_exits_2_on_a_bad_canary_floor(
    write_matrix: Callable[..., Any], header: str, capsys: pytest.CaptureFixture[str]
) -> None:
    file = write_matrix(with_load(header, "canary_floor: 2\n"))
    assert main(["matrix", "validate", "--matrix", str(file)]) == 2
    assert (
        "cells[0].serve.load.canary_floor: must be a share of answers above 0 and at most 1" in capsys.readouterr().err
    )
