"""Which servers a verification starts (verify.stages.serverplan): one per arm in the usual case."""

from __future__ import annotations

import pytest

from pipeline.matrix.model import STAGES, Matrix
from verify.stages.serverplan import plan_servers

FIXED = "sm120-vllm-0.28.0-fi-0.6.18.post1-cu130"
RELEASE = "sm120-vllm-0.28.0-release"
SPARK = "sm121-vllm-0.28.0-fi-0.6.18.post1-cu130"
# What the v0.28.0 image's config carries (no VLLM_* kernel variables; docker/Dockerfile @2cf0a691).
RELEASE_IMAGE_ENV = {"PATH": "/usr/local/sbin:/usr/bin", "NVIDIA_REQUIRE_CUDA": "cuda>=13.0", "VLLM_USAGE_SOURCE": "x"}


@pytest.mark.parametrize("cell_id", [FIXED, RELEASE, SPARK])
def test_a_gpu_cell_starts_one_server_for_every_stage(real_matrix: Matrix, cell_id: str) -> None:
    plan = plan_servers(real_matrix.cell(cell_id), None, STAGES, RELEASE_IMAGE_ENV)
    assert plan.starts == 1  # before: startup, autotune and load each started one (3)
    assert plan.startup_tunes and plan.keep_startup and not plan.autotune_own and not plan.load_fresh


@pytest.mark.parametrize("arm", ["default", "cutlass-kernel", "skip-fp8-tuning", "eager"])
def test_every_arm_of_the_fix_cell_starts_one_server(real_matrix: Matrix, arm: str) -> None:
    cell = real_matrix.cell(FIXED)
    assert plan_servers(cell, cell.arm(arm), STAGES, RELEASE_IMAGE_ENV).starts == 1


def test_an_image_that_sets_a_kernel_variable_gets_its_own_autotune_server(real_matrix: Matrix) -> None:
    cell = real_matrix.cell(FIXED)
    env = {**RELEASE_IMAGE_ENV, "VLLM_DISABLED_KERNELS": "FlashInferFP8ScaledMMLinearKernel"}
    plan = plan_servers(cell, None, STAGES, env)
    assert (plan.startup_tunes, plan.autotune_own, plan.load_fresh, plan.starts) == (False, True, True, 3)
    assert "VLLM_DISABLED_KERNELS" in plan.reason
    # ... unless the arm sets it itself: then both servers run with the arm's value
    arm = cell.arm("cutlass-kernel")
    assert plan_servers(cell, arm, STAGES, env).starts == 1


def test_an_image_that_chooses_its_cache_location_is_not_overridden_silently(real_matrix: Matrix) -> None:
    env = {"VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": "/opt/tuned"}
    plan = plan_servers(real_matrix.cell(FIXED), None, STAGES, env)
    assert plan.autotune_own and not plan.startup_tunes


def test_cpu_cell_shares_startup_with_load_and_never_tunes(real_matrix: Matrix) -> None:
    plan = plan_servers(real_matrix.cell("cpu-tiny"), None, STAGES, {})
    assert (plan.starts, plan.startup_tunes, plan.keep_startup, plan.load_fresh) == (1, False, True, False)


@pytest.mark.parametrize(
    ("stages", "starts", "keep"),
    [
        (("imports",), 0, False),
        (("startup",), 1, False),
        (("autotune",), 1, False),
        (("startup", "autotune"), 1, True),
        (("autotune", "load"), 2, False),
        (("load",), 1, False),
    ],
)
def test_partial_stage_selections(real_matrix: Matrix, stages: tuple[str, ...], starts: int, keep: bool) -> None:
    plan = plan_servers(real_matrix.cell(FIXED), None, stages, {})
    assert (plan.starts, plan.keep_startup) == (starts, keep)


def test_import_only_cell_starts_nothing(real_matrix: Matrix) -> None:
    assert plan_servers(real_matrix.cell("fi-mismatch"), None, STAGES, {}).starts == 0
