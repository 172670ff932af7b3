"""The inheritance rule of matrix.yaml, table-tested, and what a valid matrix text loads to: values
kept as written, names canonicalised, a base on another cell, null that removes, a host cell."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.errors import MatrixError
from pipeline.matrix.model import CellBase
from pipeline.matrix.read import load_matrix
from tests.unit.matrix_texts import ANYWHERE, CELL, doc

# -- the inheritance rule, table-tested -------------------------------------------------------------
# defaults -> extends chain (root first) -> cell; mappings merge by key recursively,
# lists and scalars replace, null removes.

MODEL = {"model": {"source": "path:/m"}}


def _layered(defaults: dict[str, Any], root: dict[str, Any], leaf: dict[str, Any]) -> dict[str, Any]:
    """A matrix with `defaults` (platform and arch by default), a root cell and a leaf extending it."""
    return {
        "schema_version": 1,
        "indexes": {"pypi": {"url": "https://pypi.org/simple"}},
        "bases": {"img": {"image": "example/img:1.0"}},
        "defaults": {"platform": "linux/amd64", "arch": "none", **defaults},
        "cells": [{"id": "root", "base": "img", **root}, {"id": "leaf", "extends": "root", **leaf}],
    }


def _env(cell: Any) -> dict[str, str]:
    return dict(cell.env)


INHERITANCE = [
    pytest.param(
        {},
        {},
        {},
        lambda c: (c.platform, c.arch, c.base.name),
        ("linux/amd64", "none", "img"),
        id="defaults-and-ancestor-fill-what-the-cell-omits",
    ),
    pytest.param(
        {"arch": "sm90"}, {"arch": "sm100"}, {}, lambda c: c.arch, "sm100", id="ancestor-scalar-beats-defaults"
    ),
    pytest.param({}, {"arch": "sm90"}, {"arch": "sm120"}, lambda c: c.arch, "sm120", id="cell-scalar-beats-ancestor"),
    pytest.param(
        {"env": {"A": "d"}}, {"env": {"A": "r"}}, {}, _env, {"A": "r"}, id="ancestor-beats-defaults-for-inherited-key"
    ),
    pytest.param(
        {"env": {"A": "1", "B": "2"}},
        {},
        {"env": {"B": "3", "C": "4"}},
        _env,
        {"A": "1", "B": "3", "C": "4"},
        id="mappings-merge-by-key",
    ),
    pytest.param(
        {"env": {"A": "1"}},
        {"env": {"B": "2"}},
        {"env": {"C": "3"}},
        _env,
        {"A": "1", "B": "2", "C": "3"},
        id="mappings-merge-across-the-whole-chain",
    ),
    pytest.param(
        {"env": {"A": "1", "B": "2"}}, {}, {"env": {"A": None}}, _env, {"B": "2"}, id="null-removes-a-mapping-key"
    ),
    pytest.param({"runner": ["x", "y"]}, {}, {"runner": ["z"]}, lambda c: c.runner, ("z",), id="lists-replace"),
    pytest.param({}, {"runner": ["x"]}, {"runner": None}, lambda c: c.runner, (), id="null-removes-a-list"),
    pytest.param(
        {"serve": {**MODEL, "readiness_timeout": 100, "shm_size": "2g"}},
        {"serve": {"shm_size": "4g"}},
        {},
        lambda c: (c.serve.readiness_timeout_s, c.serve.shm_size),
        (100.0, "4g"),
        id="nested-mappings-merge-recursively",
    ),
    pytest.param(
        {"serve": {**MODEL, "args": ["--a", "1"]}},
        {},
        {"serve": {"args": ["--b"]}},
        lambda c: c.serve.args,
        ("--b",),
        id="nested-lists-replace",
    ),
    pytest.param(
        {"serve": {**MODEL, "gpus": "all"}},
        {},
        {"serve": {"gpus": None}},
        lambda c: c.serve.gpus,
        None,
        id="null-removes-a-nested-key",
    ),
    pytest.param(
        {"serve": MODEL},
        {"serve": {"env": {"X": "1"}}},
        {"serve": None},
        lambda c: c.serve,
        None,
        id="null-removes-a-whole-mapping",
    ),
    pytest.param(
        {},
        {"arms": {"a": {"env": {"K": "1"}}, "b": {"args": ["--x"]}}},
        {"arms": {"a": {"env": {"K": "2"}}, "b": None}},
        lambda c: [(a.name, a.env) for a in c.arms],
        [("a", (("K", "2"),))],
        id="arms-merge-replace-and-remove",
    ),
    pytest.param(
        {},
        {"overrides": {"six": {"version": "1.0", "index": "pypi"}}},
        {"overrides": {"six": {"version": "2.0"}}},
        lambda c: [(o.name, o.version, o.index) for o in c.overrides],
        [("six", "2.0", "pypi")],
        id="override-version-changes-and-index-is-inherited",
    ),
]


@pytest.mark.parametrize(("defaults", "root", "leaf", "get", "expected"), INHERITANCE)
def test_inheritance_rule(tmp_path: Path, images_dir: Path, defaults, root, leaf, get, expected) -> None:
    file = tmp_path / "matrix.yaml"
    file.write_text(yaml.safe_dump(_layered(defaults, root, leaf), sort_keys=False))
    matrix = load_matrix(file, images_dir=images_dir)
    assert get(matrix.cell("leaf")) == expected


def test_inheritance_does_not_leak_between_cells(tmp_path: Path, images_dir: Path) -> None:
    """Merging a leaf must not change its ancestor or defaults (no shared, mutated mappings)."""
    data = _layered({"env": {"A": "d"}}, {"env": {"B": "r"}}, {"env": {"A": "leaf", "C": "l"}})
    data["cells"].append({"id": "sibling", "extends": "root"})
    file = tmp_path / "matrix.yaml"
    file.write_text(yaml.safe_dump(data, sort_keys=False))
    matrix = load_matrix(file, images_dir=images_dir)
    assert dict(matrix.cell("root").env) == {"A": "d", "B": "r"}
    assert dict(matrix.cell("leaf").env) == {"A": "leaf", "B": "r", "C": "l"}
    assert dict(matrix.cell("sibling").env) == {"A": "d", "B": "r"}


def test_three_level_chain_applies_root_first(tmp_path: Path, images_dir: Path) -> None:
    data = _layered(
        {"env": {"X": "defaults", "Y": "defaults", "Z": "defaults"}},
        {"env": {"X": "root", "Y": "root"}},
        {"extends": "mid"},
    )
    data["cells"].insert(1, {"id": "mid", "extends": "root", "env": {"X": "mid"}})
    file = tmp_path / "matrix.yaml"
    file.write_text(yaml.safe_dump(data, sort_keys=False))
    leaf = load_matrix(file, images_dir=images_dir).cell("leaf")
    assert dict(leaf.env) == {"X": "mid", "Y": "root", "Z": "defaults"}


def test_null_in_a_cell_removes_a_required_default(tmp_path: Path, images_dir: Path) -> None:
    file = tmp_path / "matrix.yaml"
    file.write_text(yaml.safe_dump(_layered({}, {}, {"arch": None}), sort_keys=False))
    with pytest.raises(MatrixError) as info:
        load_matrix(file, images_dir=images_dir)
    leaf_line = file.read_text().splitlines().index("- id: leaf") + 1
    assert info.value.problems == [f"{file}:{leaf_line}: cells[1]: missing required key 'arch' {ANYWHERE}"]


def test_unquoted_version_keeps_its_text(load, header: str) -> None:
    matrix = load(
        header
        + doc(
            CELL,
            """\
            overrides:
              six: {version: 0.10, index: pypi}
              seven: {version: 1, index: pypi}
    """,
        )
    )
    versions = {o.name: o.version for o in matrix.cell("a").overrides}
    assert versions == {"six": "0.10", "seven": "1"}
    assert all(isinstance(v, str) for v in versions.values())


def test_unquoted_version_inherited_from_defaults_keeps_its_text(load, header: str) -> None:
    matrix = load(
        header
        + doc(
            """\
        defaults:
          overrides:
            six: {version: 1.20, index: pypi}
    """,
            CELL,
        )
    )
    assert [o.pin for o in matrix.cell("a").overrides] == ["six==1.20"]


def test_package_names_are_canonicalised(load, header: str) -> None:
    matrix = load(
        header
        + doc(
            CELL,
            """\
            overrides:
              FlashInfer_Python: {version: "0.6.18.post1", index: pypi}
            uninstall: [Torch_Vision]
    """,
        )
    )
    cell = matrix.cell("a")
    assert [o.pin for o in cell.overrides] == ["flashinfer-python==0.6.18.post1"]
    assert cell.uninstall == ("torch-vision",)


def test_cell_base_resolves_to_another_cell(load, header: str) -> None:
    matrix = load(
        header
        + doc(
            """\
          on-a: {cell: a}
    """,
            CELL,
            """\
          - id: b
            base: on-a
            platform: linux/amd64
            arch: none
    """,
        )
    )
    assert matrix.cell("b").base == CellBase(name="on-a", cell="a")


def test_known_recipe_in_images_dir_loads(load, header: str, tmp_path: Path) -> None:
    images = tmp_path / "imgs"
    (images / "recipes" / "mine").mkdir(parents=True)
    (images / "recipes" / "mine" / "steps.j2").write_text("RUN true\n")
    matrix = load(header + doc(CELL, "    recipes: [mine]\n"), images=images)
    assert matrix.cell("a").recipes == ("mine",)


def test_null_removes_even_when_nothing_was_inherited(load, header: str) -> None:
    matrix = load(
        header
        + CELL
        + """\
    env: {A: null, B: "1"}
    arms: {x: null, y: {args: [--enforce-eager]}}
"""
    )
    cell = matrix.cell("a")
    assert cell.env == (("B", "1"),)
    assert [arm.name for arm in cell.arms] == ["y"]


def test_a_host_cell_given_its_environment(write_matrix, header: str, images_dir: Path) -> None:
    text = header + doc("""\
        cells:
          - id: h
            runtime: host
            platform: linux/amd64
            arch: sm90
            given:
              vllm: {version: "0.26.0", index: pypi}
              Flashinfer_Python: {version: "0.6.14", index: pypi}
    """)
    cell = load_matrix(write_matrix(text), images_dir=images_dir).cell("h")
    assert cell.on_host and cell.install is None
    assert [(r.name, r.version, r.index) for r in cell.given] == [
        ("flashinfer-python", "0.6.14", "pypi"),
        ("vllm", "0.26.0", "pypi"),
    ]
