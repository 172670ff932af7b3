"""Issue 16 regressions in validation: secrets, strict patterns for rendered strings, finite bounded
numbers, ids YAML reads as numbers. Each case names the file, line and key it refuses."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipeline.guard.redact import redact, secret_arg, secret_env
from tests.unit.conftest import Invalid

CELL = """\
cells:
  - id: a
    base: img
    platform: linux/amd64
    arch: none
"""
SERVE = """\
    serve:
      model: {source: "hf:org/model", revision: "0123456789abcdef0123456789abcdef01234567"}
"""


def _one(problems: list[str], needle: str) -> str:
    hits = [p for p in problems if needle in p]
    assert hits, f"no problem mentions {needle!r}: {problems}"
    return hits[0]


# -- 2: secrets never reach env/args from the matrix ---------------------------------------------


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ("VLLM_API_KEY: sk-abcdefghijklmnopqrstuvwx", "VLLM_API_KEY: the name says it holds a credential"),
        ("HF_TOKEN: anything", "HF_TOKEN: the name says it holds a credential"),
        ("VLLM_SOMETHING: hf_abcdefghijklmnopqrstuvwx", "the value looks like an access token"),
        ("VLLM_URL: https://user:pass@mirror.example/simple", "URL carrying user:password@"),
    ],
)
def test_secret_looking_env_is_refused_naming_the_key(
    invalid: Callable[..., Invalid], header: str, env: str, needle: str
) -> None:
    text = header + CELL + f"    env:\n      {env}\n"
    r = invalid(text)
    problem = _one(r.problems, needle)
    name = env.split(":")[0]
    assert problem.startswith(f"{r.at(name)}: cells[0].env.{name}: refused:")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ('["--api-key", "abc"]', "--api-key: the flag passes a credential"),
        ('["--hf-token", "hf_abcdefghijklmnopqrstuvwx"]', "--hf-token: the flag passes a credential"),
        ('["--hf-token=xyz"]', "--hf-token: the flag passes a credential"),
        ('["--served-model-name", "sk-abcdefghijklmnopqrstuvwxyz"]', "the value looks like an access token"),
    ],
)
def test_secret_looking_args_are_refused_naming_the_key(
    invalid: Callable[..., Invalid], header: str, args: str, needle: str
) -> None:
    r = invalid(header + CELL + SERVE + f"      args: {args}\n")
    problem = _one(r.problems, needle)
    assert f"{r.at('args:')}: cells[0].serve.args[" in problem and "refused" in problem


def test_ordinary_env_and_args_are_not_secrets(load: Callable[..., Any], header: str) -> None:
    matrix = load(
        header
        + CELL
        + "    env:\n      VLLM_MAX_NUM_BATCHED_TOKENS: '8192'\n      VLLM_KEY_CACHE: café\n"
        + SERVE
        + '      args: ["--max-num-batched-tokens", "8192", "--tokenizer-mode", "auto"]\n'
    )
    cell = matrix.cell("a")
    assert dict(cell.env)["VLLM_KEY_CACHE"] == "café"
    assert cell.serve is not None and cell.serve.args[1] == "8192"


def test_redact_removes_url_credentials_and_tokens() -> None:
    text = redact("pip: https://alice:s3cret@mirror.example/simple and hf_abcdefghijklmnopqrstuvwx, fine", ("s3cret",))
    assert "s3cret" not in text and "alice" not in text and "hf_abcdefghijklmnopqrstuvwx" not in text
    assert text.endswith(", fine")
    assert secret_env("MAX_NUM_BATCHED_TOKENS", "8192") is None
    assert secret_arg("--max-num-batched-tokens", "8192") is None


# -- 10: strings that reach RUN lines and file names ---------------------------------------------


@pytest.mark.parametrize(
    ("snippet", "needle"),
    [
        ("    system_packages: ['g++ && touch /pwned']\n", "is not a valid Debian package name"),
        ("    system_packages: ['g++;id']\n", "is not a valid Debian package name"),
        ("    uninstall: ['triton; touch /pwned']\n", "is not a valid package name"),
        ("    recipes: [/etc]\n", "is not a valid recipe name"),
        ("    recipes: ['../../etc']\n", "is not a valid recipe name"),
        ('    env:\n      VLLM_X: "a\\nRUN touch /pwned"\n', "control character"),
        ('    serve:\n      model: {source: "hf:o/m"}\n      args: ["--x", "a\\nb"]\n', "control character"),
    ],
)
def test_rendered_strings_are_refused_unless_plain(
    invalid: Callable[..., Invalid], header: str, snippet: str, needle: str
) -> None:
    r = invalid(header + CELL + snippet)
    problem = _one(r.problems, needle)
    assert problem.startswith(str(r.file) + ":") and "cells[0]." in problem


@pytest.mark.parametrize(
    ("bases", "needle"),
    [
        ("  boot:\n    bootstrap: {suite: bookworm, venv: '/opt/venv && touch /pwned'}\n", "absolute path"),
        ("  boot:\n    bootstrap: {suite: bookworm, venv: /opt/../etc}\n", "no `..`"),
        ("  boot:\n    bootstrap: {suite: 'bookworm; id', venv: /opt/venv}\n", "Debian suite"),
        ("  boot:\n    bootstrap: {suite: bookworm, venv: /v, include: ['a b']}\n", "Debian package name"),
        ('  reg:\n    image: "example/img:1.0"\n    python: "python3 -c x"\n', "python command or path"),
    ],
)
def test_base_strings_are_refused_unless_plain(
    invalid: Callable[..., Invalid], header: str, bases: str, needle: str
) -> None:
    r = invalid(header + bases + CELL)
    problem = _one(r.problems, needle)
    assert ": bases." in problem


@pytest.mark.parametrize("name", ["../evil", "a\\nRUN x", "UPPER", "a/b"])
def test_index_names_are_refused_unless_plain(invalid: Callable[..., Invalid], name: str) -> None:
    text = "schema_version: 1\nindexes:\n" + f'  "{name}": {{url: "https://x.example/simple"}}\n'
    text += 'bases:\n  img: {image: "example/img:1.0"}\n' + CELL
    r = invalid(text)
    assert _one(r.problems, "is not a valid index name").startswith(str(r.file) + ":")


def test_a_long_id_is_refused(invalid: Callable[..., Invalid], header: str) -> None:
    r = invalid(header + CELL.replace("id: a", "id: " + "a" * 300))
    _one(r.problems, "is not a valid cell id")


# -- 7: an id YAML reads as a number is a cell, not a silent drop --------------------------------


def test_a_numeric_id_is_a_cell(load: Callable[..., Any], header: str) -> None:
    matrix = load(header + CELL.replace("id: a", "id: 123"))
    assert [c.id for c in matrix.cells] == ["123"]


@pytest.mark.parametrize("value", ["[a, b]", "{x: 1}"])
def test_a_list_or_mapping_id_is_located(invalid: Callable[..., Invalid], header: str, value: str) -> None:
    r = invalid(header + CELL.replace("id: a", f"id: {value}"))
    assert _one(r.problems, "cells[0].id: must be a string").startswith(r.at("id:"))


def test_extends_a_list_is_located(invalid: Callable[..., Invalid], header: str) -> None:
    r = invalid(header + CELL + "  - id: b\n    extends: [a]\n")
    assert _one(r.problems, "cells[1].extends: must be a cell id").startswith(r.at("extends"))


# -- 8 and 1: finite, positive, bounded numbers ---------------------------------------------------


@pytest.mark.parametrize(
    ("load_text", "needle"),
    [
        ("concurrency: 1000000000", "concurrency: must be at most 4,096"),
        ("questions: 1000000000000", "questions: must be at most 1,000,000"),
        ("stall_seconds: .nan", "stall_seconds: must be a finite number"),
        ("duration: .inf", "duration: must be a finite number"),
        ("chunk_timeout: 1.0e+999", "chunk_timeout: must be a finite number"),
        ("duration: 1.0e+12", "duration: must be at most 604,800"),
    ],
)
def test_load_numbers_are_finite_and_bounded(
    invalid: Callable[..., Invalid], header: str, load_text: str, needle: str
) -> None:
    r = invalid(header + CELL + SERVE + f"      load:\n        {load_text}\n")
    assert _one(r.problems, needle).startswith(r.at(load_text.split(":")[0] + ":"))


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", "1.0e+999"])
def test_readiness_timeout_is_finite(invalid: Callable[..., Invalid], header: str, value: str) -> None:
    r = invalid(header + CELL + SERVE + f"      readiness_timeout: {value}\n")
    assert _one(r.problems, "readiness_timeout: must be a positive number of seconds").startswith(
        r.at("readiness_timeout")
    )


# -- 9: linear in the number of cells, bounded in size, depth and aliases ------------------------


@pytest.mark.parametrize("count", [1_000, pytest.param(10_000, marks=pytest.mark.slow)])
def test_thousands_of_cells_validate(tmp_path: Path, header: str, images_dir: Path, count: int) -> None:
    """All of them, each its own cell (the time it takes is benchmarks/validation.py's, not a test's):
    a thousand in the quick tier, ten thousand with --run-slow (CI)."""
    from pipeline.matrix.read import load_matrix

    cells = "".join(
        f"  - id: c{i}\n    base: img\n    platform: linux/amd64\n    arch: none\n    env: {{VLLM_X: '{i}'}}\n"
        for i in range(count)
    )
    path = tmp_path / "big.yaml"
    path.write_text(header + "cells:\n" + cells)
    matrix = load_matrix(path, images_dir=images_dir)
    last = count - 1
    assert len(matrix.cells) == count and matrix.cell(f"c{last}").env == (("VLLM_X", str(last)),)


def test_many_problems_are_reported_in_linear_time(invalid: Callable[..., Invalid], header: str) -> None:
    import time

    started = time.process_time()
    r = invalid(header + "cells: [" + "1, " * 30_000 + "]\n")
    assert len(r.problems) == 30_000 and time.process_time() - started < 5  # quadratic: minutes


def test_an_alias_bomb_is_refused_before_it_is_expanded_naming_the_node_too_big(
    invalid: Callable[..., Invalid], header: str
) -> None:
    """Nine lines of billion laughs: the distinct nodes are sized once each (the walk used to expand
    a million values first). The line named is the smallest node alone over the limit."""
    import time

    levels = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
    )
    started = time.process_time()
    r = invalid(header + levels + "cells: *i\n")
    assert time.process_time() - started < 5
    (problem,) = r.problems
    line = header.count("\n") + 6  # `f:` (1.1 million values) is the first alone over 1,000,000
    assert f":{line}: more than 1,000,000 values (aliases expanded)" in problem


def test_aliases_under_the_limit_still_expand(tmp_path: Path) -> None:
    from pipeline.matrix.yamlsrc import load_yaml

    path = tmp_path / "m.yaml"
    path.write_text("a: &a [x, 1, true]\nb: [*a, *a]\n")
    assert load_yaml(path).data == {"a": ["x", 1, True], "b": [["x", 1, True], ["x", 1, True]]}


def test_the_cli_lists_the_first_hundred_problems_and_counts_the_rest(tmp_path: Path, header: str) -> None:
    import subprocess
    import sys

    path = tmp_path / "m.yaml"
    path.write_text(header + "cells: [" + "1, " * 1_000 + "]\n")
    proc = subprocess.run(
        [sys.executable, "-m", "stackproof", "matrix", "validate", "--matrix", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and sum("must be a mapping" in line for line in lines) == 100
    assert "... and 900 more problem(s) not listed (fix these first)" in lines
    assert lines[-1].startswith("stackproof: 1000 problem(s) in the matrix")


def test_env_values_keep_non_ascii_in_the_dockerfile(load: Callable[..., Any], header: str, images_dir: Path) -> None:
    from pipeline.build.plan import plan_cell
    from pipeline.matrix.site import SiteSettings

    matrix = load(header + CELL + '    env:\n      VLLM_GREETING: "café ☕"\n      VLLM_COST: "$HOME"\n')
    dockerfile = plan_cell(matrix, matrix.cell("a"), SiteSettings(), images_dir).dockerfile
    assert 'VLLM_GREETING="café ☕"' in dockerfile  # Docker reads no \u00e9 escapes
    assert 'VLLM_COST="\\$HOME"' in dockerfile  # `$` stays literal


def test_rendered_run_lines_quote_what_they_are_given(load: Callable[..., Any], header: str, images_dir: Path) -> None:
    from pipeline.build.plan import plan_cell
    from pipeline.matrix.site import SiteSettings

    matrix = load(header + CELL + "    system_packages: [g++, libpython3.11-dev, 'pkg=1:2.0~rc1']\n")
    dockerfile = plan_cell(matrix, matrix.cell("a"), SiteSettings(), images_dir).dockerfile
    assert "--no-install-recommends g++ libpython3.11-dev 'pkg=1:2.0~rc1' \\" in dockerfile


@pytest.mark.parametrize(
    ("name", "value"),
    [("VLLM_PLUGINS", "hf_transfer"), ("VLLM_ATTENTION_BACKEND", "FLASHINFER"), ("VLLM_LOGGING_LEVEL", "DEBUG")],
)
def test_ordinary_values_are_not_taken_for_tokens(name: str, value: str) -> None:
    assert secret_env(name, value) is None
