"""Every validation error of matrix.yaml, each with its location: one test per behaviour, then the
table of invalid matrices (INVALID, in matrix_texts.py) with every problem each must give."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipeline.errors import InputError, MatrixError
from pipeline.matrix.read import load_matrix
from tests.unit.matrix_texts import CELL, INVALID, doc


def test_unknown_top_level_key(invalid, header: str) -> None:
    r = invalid(header + "defualts: {}\n" + CELL)
    assert r.problems == [f"{r.at('defualts')}: defualts: unknown key, did you mean 'defaults'?"]


def test_duplicate_cell_id_names_the_first(invalid, header: str) -> None:
    r = invalid(
        header
        + CELL
        + doc("""\
          - id: b
            base: img
            platform: linux/amd64
            arch: none
          - id: a
            base: img
            platform: linux/amd64
            arch: none
    """)
    )
    first = r.at("- id: a").split(":")[-1]
    assert r.problems == [
        f"{r.at('- id: a', nth=2)}: cells[2].id: duplicate cell id 'a' (first defined at line {first})"
    ]


def test_not_yaml_is_located(invalid, header: str) -> None:
    r = invalid(
        header
        + doc(
            CELL,
            """\
            env: {A: [}
    """,
        )
    )
    assert len(r.problems) == 1
    assert r.problems[0].startswith(f"{r.at('env: {A: [}')}: not valid YAML: ")


def test_extends_unknown_cell_with_did_you_mean(invalid, header: str) -> None:
    r = invalid(
        header
        + CELL
        + doc("""\
          - id: b
            extends: aa
    """)
    )
    assert r.problems == [f"{r.at('extends: aa')}: cells[1].extends: no cell 'aa', did you mean 'a'?"]


@pytest.mark.parametrize("version", ['">=0.6"', '"0.6.*"', "latest", '"==0.6"', '"0.6, 0.7"'])
def test_versions_must_be_exact(invalid, header: str, version: str) -> None:
    r = invalid(
        header
        + doc(
            CELL,
            f"""\
            overrides:
              six:
                version: {version}
                index: pypi
    """,
        )
    )
    written = yaml.safe_load(version)
    assert r.problems == [
        f"{r.at('    version:')}: cells[0].overrides.six.version: {written!r} is not an exact version "
        "(write one version, e.g. '0.6.18.post1')"
    ]


@pytest.mark.parametrize(("written", "shown"), [("2", "2"), ('"1"', "'1'"), ("1.1", "1.1")])
def test_unsupported_schema_version(invalid, written: str, shown: str) -> None:
    r = invalid(f"schema_version: {written}\ncells: []\n")
    assert r.problems == [
        f"{r.at('schema_version')}: schema_version: unsupported schema_version {shown} (this tool reads 1)"
    ]


@pytest.mark.parametrize("digest", ["sha256:abc", "md5:" + "a" * 64, "sha256:" + "A" * 64])
def test_invalid_digest(invalid, digest: str) -> None:
    r = invalid(
        doc(
            f"""\
        schema_version: 1
        bases:
          img:
            image: "example/img:1.0"
            digest: "{digest}"
    """,
            CELL,
        )
    )
    assert r.problems == [f"{r.at('digest:')}: bases.img.digest: {digest!r} is not a valid sha256 digest"]


def test_image_without_tag_is_rejected(invalid) -> None:
    r = invalid(
        doc(
            """\
        schema_version: 1
        bases:
          img: {image: "example/img"}
    """,
            CELL,
        )
    )
    assert r.problems == [f"{r.at('img:')}: bases.img.image: 'example/img' is not a valid image repository:tag"]


def test_missing_required_keys(invalid, header: str) -> None:
    r = invalid(
        header
        + doc("""\
        cells:
          - id: a
            description: nothing else
          - base: img
            platform: linux/amd64
            arch: none
    """)
    )
    cell_a, cell_1 = r.at("- id: a"), r.at("- base: img")
    assert r.problems[:1] + r.problems[-3:] == [
        f"{cell_1}: cells[1]: missing required key 'id'",
        f"{cell_a}: cells[0]: missing required key 'base' (set it in the cell, an ancestor or defaults)",
        f"{cell_a}: cells[0]: missing required key 'platform' (set it in the cell, an ancestor or defaults)",
        f"{cell_a}: cells[0]: missing required key 'arch' (set it in the cell, an ancestor or defaults)",
    ]


def test_missing_top_level_keys(invalid) -> None:
    r = invalid("indexes: {}\n")
    assert r.problems[:2] == [
        f"{r.at('indexes')}: (top level): missing required key 'schema_version'",
        f"{r.at('indexes')}: (top level): missing required key 'cells'",
    ]


def test_missing_model_source_and_index_url(invalid) -> None:
    r = invalid(
        doc(
            """\
        schema_version: 1
        indexes:
          pypi: {}
        bases:
          img: {image: "example/img:1.0"}
    """,
            CELL,
            """\
            serve:
              model: {revision: main}
    """,
        )
    )
    assert f"{r.at('pypi:')}: indexes.pypi: missing required key 'url'" in r.problems
    assert f"{r.at('model:')}: cells[0].serve.model: missing required key 'source'" in r.problems


def test_missing_required_key_is_reported_once(invalid, header: str) -> None:
    r = invalid(
        doc("""\
        schema_version: 1
        indexes:
          pypi: {}
    """)
        + "cells: []\n"
    )
    assert r.problems == [f"{r.at('pypi:')}: indexes.pypi: missing required key 'url'"]


@pytest.mark.parametrize("arg", ["--port", "--port=8000", "--host"])
def test_tool_owned_serve_args(invalid, header: str, arg: str) -> None:
    r = invalid(
        header
        + doc(
            CELL,
            f"""\
            serve:
              model: {{source: "path:/m"}}
              args:
                - --max-model-len
                - "512"
                - {arg}
    """,
        )
    )
    assert r.problems == [
        f"{r.at(arg)}: cells[0].serve.args[2]: {arg!r}: the tool sets --host 127.0.0.1 and --port itself"
    ]


def test_unknown_recipe_with_did_you_mean(invalid, header: str, tmp_path: Path) -> None:
    images = tmp_path / "imgs"
    for name in ("tiny-model", "vllm-dist-alias"):
        (images / "recipes" / name).mkdir(parents=True)
        (images / "recipes" / name / "steps.j2").write_text("RUN true\n")
    (images / "recipes" / "no-steps").mkdir()  # a directory without steps.j2 is not a recipe
    r = invalid(
        header
        + doc(
            CELL,
            """\
            recipes: [tiny-model, tiny-modle, no-steps]
    """,
        ),
        images=images,
    )
    assert r.problems == [
        f"{r.at('recipes:')}: cells[0].recipes[1]: no recipe 'tiny-modle' in images/recipes/, "
        "did you mean 'tiny-model'?",
        f"{r.at('recipes:')}: cells[0].recipes[2]: no recipe 'no-steps' in images/recipes/",
    ]


def test_error_in_inherited_value_points_at_the_ancestor(invalid, header: str) -> None:
    r = invalid(
        header
        + doc(
            CELL,
            """\
            overrides:
              six: {version: "1.0", index: pypy}
          - id: b
            extends: a
            arch: sm90
    """,
        )
    )
    # Both cells inherit the bad index; the report names the line where it was written.
    where = f"{r.at('pypy')}: cells[0].overrides.six.index: undeclared index 'pypy', did you mean 'pypi'?"
    assert set(r.problems) == {where}


def test_matrix_error_carries_problems_and_exit_code_2() -> None:
    error = MatrixError(["m.yaml:1: a: x", "m.yaml:2: b: y"])
    assert error.exit_code == 2
    assert isinstance(error, InputError)
    assert error.problems == ["m.yaml:1: a: x", "m.yaml:2: b: y"]
    assert str(error) == "m.yaml:1: a: x\nm.yaml:2: b: y"


def test_unreadable_file_is_a_matrix_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(MatrixError) as info:
        load_matrix(missing)
    assert info.value.problems == [f"{missing}: cannot read: No such file or directory"]
    assert info.value.exit_code == 2


@pytest.mark.parametrize(("text", "expected"), INVALID)
def test_an_invalid_matrix_gives_every_problem_located(
    invalid, header: str, text: str, expected: list[tuple[str, str]]
) -> None:
    r = invalid(header + text)
    assert r.problems == [f"{r.at(marker)}: {message}" for marker, message in expected]
