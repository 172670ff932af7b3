"""Correctness in the load stage, for real: the vLLM 0.28.0 CPU server and the generated tiny model.

Four servers, one short load each (12 questions, one greedy sample per prompt and phase), sharing
one cache directory, so that the degeneration baseline the first run records is the one the later
runs are judged against:

1. cpu-tiny as built (the image the tier already builds): no baseline yet, so it records one;
2. cpu-tiny again: judged against that baseline, it must pass; `compare` with run 1: identical;
3. a test-only build of the same cell whose weights loop " one city one city ..." (the
   `looping-model` recipe under tests/fixtures/recipes, appended to the cell's recipes: one extra
   image layer): the loop and logprob-collapse detectors must FAIL, and `compare` with run 1 must
   flag corruption (exit 1);
4. an arm serving the same weights in float32 instead of bfloat16: `compare` with run 1 must show
   a divergence (the tiny random model's top-1/top-2 gaps are hundredths of a nat: near-ties).

Runs 2-4 depend on run 1 only (its baseline, its greedy answers), not on each other: they run at
once, each its own `stackproof run` with its own server (the looping one builds its image first).
Each run is mostly a server start (~25-35 s eager) and the first logprobs request, which compiles
vLLM's sampler (Sampler.gather_logprobs: ~20 s on a cold compile-cache slot, ~8 s on a warm one); the
load itself is 1-2 s. On two idle cores (2026-12-07) the three took 131 s one after another and 102 s
at once (the module 203 s -> 175 s). That no server container is left is asserted when all three
have ended.
"""

from __future__ import annotations

import functools
import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import IMAGES, REPO, Completed, containers, stackproof, write_matrix

pytestmark = pytest.mark.integration

LIGHT_LOAD = ["--questions", "12", "--determinism-repeats", "1"]
LOOPING_RECIPE = REPO / "tests" / "fixtures" / "recipes" / "looping-model"


@pytest.fixture(scope="module")
def setup(cpu_tiny: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The shared cache, a matrix with a float32 arm, and the looping build's matrix and images."""
    root = tmp_path_factory.mktemp("correctness")
    fp32 = {"description": "the same weights served in float32", "args": ["--dtype", "float32"]}
    matrix = write_matrix(root / "matrix.yaml", edit={"cpu-tiny": {"arms": {"fp32": fp32}}}, eager=True)
    images = root / "images"
    shutil.copytree(IMAGES, images)
    shutil.copytree(LOOPING_RECIPE, images / "recipes" / "looping-model")
    looping = write_matrix(
        root / "looping.yaml",
        edit={"cpu-tiny": {"recipes": ["vllm-dist-alias", "tiny-model", "looping-model"]}},
        eager=True,
    )
    return {"root": root, "cache": root / "cache", "matrix": matrix, "looping": looping, "images": images}


def _run(
    setup: dict[str, Path], name: str, *, matrix: Path, images: Path = IMAGES, arm: str | None = None
) -> Completed:
    args = ["run", "cpu-tiny", "--stages", "load", "--matrix", str(matrix), "--images", str(images), "--json"]
    args += ["--out", str(setup["root"] / name), *LIGHT_LOAD, *(["--arm", arm] if arm else [])]
    return stackproof(args, env={"STACKPROOF_CACHE_DIR": str(setup["cache"])})


def _no_server_left() -> None:
    assert containers("io.stackproof.cell=cpu-tiny") == [], "the server container must be removed"


def _load_stage(result: Completed) -> dict[str, Any]:
    return next(s for s in result.json()["stages"] if s["stage"] == "load")  # type: ignore[union-attr]


def _checks(result: Completed) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in _load_stage(result)["checks"]}


def _compare(a: Completed, b: Completed) -> Completed:
    greedy_a, greedy_b = (Path(_load_stage(r)["artifacts"]["greedy"]) for r in (a, b))
    # A run directory, as a user passes it; compare finds load/greedy.json in it.
    return stackproof(["compare", str(greedy_a.parent.parent), str(greedy_b.parent.parent), "--json"])


@pytest.fixture(scope="module")
def first(setup: dict[str, Path]) -> Completed:
    result = _run(setup, "first", matrix=setup["matrix"])
    _no_server_left()
    assert result.returncode in (0, 1), result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def later(setup: dict[str, Path], first: Completed) -> dict[str, Completed]:
    """Runs 2-4 at once, after the first (whose baseline they are judged against)."""
    runs = {
        "again": functools.partial(_run, setup, "again", matrix=setup["matrix"]),
        "looping": functools.partial(_run, setup, "looping", matrix=setup["looping"], images=setup["images"]),
        "fp32": functools.partial(_run, setup, "fp32", matrix=setup["matrix"], arm="fp32"),
    }
    with ThreadPoolExecutor(max_workers=len(runs)) as pool:
        futures = {name: pool.submit(run) for name, run in runs.items()}
        results = {name: future.result() for name, future in futures.items()}
    _no_server_left()
    return results


def test_the_first_clean_run_records_the_cells_baseline(first: Completed) -> None:
    checks = _checks(first)
    assert _load_stage(first)["status"] == "PASS", {n: c["message"] for n, c in checks.items()}
    loop = checks["degeneration-loop"]
    assert loop["status"] == "PASS" and "first clean run is recorded as its baseline" in loop["message"]
    assert checks["degeneration-length"]["status"] == "SKIP"  # the load sets ignore_eos
    assert checks["canary"]["status"] == "SKIP"  # the tiny model declares no floor
    summary = json.loads(Path(_load_stage(first)["artifacts"]["summary"]).read_text())
    section = summary["correctness"]
    assert section["baseline"]["recorded_now"] is True and Path(section["baseline"]["path"]).is_file()
    print(f"cpu-tiny's own rates: { ({k: v for k, v in section['rates'].items() if k != 'examples'}) }")


def test_cpu_tiny_again_passes_against_its_baseline_and_agrees_with_the_first_run(
    later: dict[str, Completed], first: Completed
) -> None:
    again = later["again"]
    checks = _checks(again)
    assert again.returncode in (0, 1), again.stderr[-3000:]
    for name in ("degeneration-loop", "degeneration-empty", "degeneration-collapse"):
        assert checks[name]["status"] == "PASS", checks[name]
        assert checks[name]["evidence"]["baseline"] is not None, "judged against the first run's baseline"
    compared = _compare(first, again)
    assert compared.returncode == 0, compared.stdout
    document = compared.json()
    assert document["agreement"] == 1.0 and all(p["verdict"] == "agree" for p in document["prompts"])  # type: ignore[union-attr]


def test_a_looping_build_of_the_cell_fails_and_compare_flags_corruption(
    later: dict[str, Completed], first: Completed
) -> None:
    looping = later["looping"]
    assert looping.returncode == 1, looping.stderr[-3000:]
    checks = _checks(looping)
    loop, collapse = checks["degeneration-loop"], checks["degeneration-collapse"]
    assert loop["status"] == "FAIL" and loop["evidence"]["rate"] == 1.0, loop
    assert loop["evidence"]["examples"][0].startswith(" one city one city")
    assert collapse["status"] == "FAIL" and collapse["evidence"]["rate"] == 1.0, collapse
    assert checks["questions"]["status"] == "PASS", "every request was answered: only the answers are wrong"
    compared = _compare(first, looping)
    assert compared.returncode == 1, compared.stdout
    document = compared.json()
    assert document["corruption"] is True
    assert all(p["verdict"] == "corruption" and p["gap_b"] > 30 for p in document["prompts"])  # type: ignore[union-attr]


def test_a_float32_arm_diverges_from_the_bfloat16_cell(later: dict[str, Completed], first: Completed) -> None:
    fp32 = later["fp32"]
    assert fp32.returncode in (0, 1), fp32.stderr[-3000:]
    compared = _compare(first, fp32)
    assert compared.returncode in (0, 1), compared.stderr[-2000:]
    document = compared.json()
    diverged = [p for p in document["prompts"] if p["divergence"] is not None]  # type: ignore[union-attr]
    assert diverged, f"float32 gave the same greedy tokens as bfloat16 on every prompt: {document}"
    print(f"bf16 vs fp32: {[(p['divergence'], p['gap_a'], p['gap_b'], p['verdict']) for p in diverged]}")
