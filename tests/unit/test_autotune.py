"""Stage `autotune`: the cache inspector over real H200 files and SM120 files derived from them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from pipeline.receipt import Receipt
from pipeline.receiptrender import write_all
from pipeline.result import Status
from stackproof.cli import main
from stackproof.kernels import arch_of, judge_probe
from tests.unit.test_receipt import CPU, _report
from verify.kernels.autotune import (
    hybrid_buckets,
    judge_cache,
    load_policies,
    map_to_hybrid_bucket,
    parse_key,
    read_cache,
    winners,
)
from verify.logs.catalog import Facts
from verify.stages.autotune import CACHE_MOUNT, diff_winners, judge_fresh_cache, winners_table
from verify.stages.receipt import build_receipt

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TWO_SHAPES = FIXTURES / "autotune" / "h200-fi0.6.18.post1-cudnn9.19-two-shapes.json"
ASCENDING = FIXTURES / "autotune" / "h200-fi0.6.18.post1-cudnn9.19-ascending.json"
MINISTRAL = FIXTURES / "autotune" / "h200-ministral14b-fi0.6.18.post1-cudnn9.19.json"
PROBE_REPORT = FIXTURES / "kernels" / "h200-kernel-probe.json"
RTX_PRO_6000 = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"


def _runners(path: Path, n: int, k: int) -> dict[int, str]:
    return {e.m_bucket: e.runner for e in winners(read_cache(path))[("fp8_gemm", n, k)]}


def sm120_release(tmp_path: Path) -> Path:
    """vLLM 0.28.0 as shipped on SM120: FlashInfer 0.6.16.post3 (no _generation), cuDNN 9.20, and
    cuDNN winning fp8_gemm at the M=512 bucket (the stack of vllm-project/vllm#55571)."""
    doc = json.loads(TWO_SHAPES.read_text())
    doc["_metadata"].update(flashinfer_version="0.6.16.post3", cudnn_version="92000", gpu=RTX_PRO_6000)
    del doc["_generation"]
    out: dict[str, Any] = {"_metadata": doc.pop("_metadata")}
    for key, value in doc.items():
        if "(1, 512, 5120), (1, 5120, 5120)" in key:
            key = key.replace("CublasFp8GemmRunner", "CudnnFp8GemmRunner")
            value = ["CudnnFp8GemmRunner", [3, [[12, 16]]]]
        out[key] = value
    path = tmp_path / "sm120-release.json"
    path.write_text(json.dumps(out, indent=2))
    return path


def sm120_gated(tmp_path: Path) -> Path:
    """FlashInfer 0.6.18.post1 on SM120: cuDNN gated out, so only CUTLASS (tactic -1) and cuBLAS win."""
    doc = json.loads(TWO_SHAPES.read_text())
    doc["_metadata"].update(cudnn_version="92000", gpu=RTX_PRO_6000)
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if "CudnnFp8GemmRunner" in key:
            key = key.replace("CudnnFp8GemmRunner", "CutlassFp8GemmRunner")
            key = key[: key.rindex(", (torch.")] + ", ())"
            value = ["CutlassFp8GemmRunner", -1]
        out[key] = value
    path = tmp_path / "sm120-gated.json"
    path.write_text(json.dumps(out, indent=2))
    return path


# -- parsing and tables ----------------------------------------------------------------------------


def test_keys_are_parsed_without_evaluating_anything() -> None:
    key = (
        "('fp8_gemm', 'CudnnFp8GemmRunner', ((1, 512, 5120), (1, 5120, 5120), (), (), (1, -1, 5120), (-1,)), "
        "(torch.float8_e4m3fn, torch.float8_e4m3fn, torch.bfloat16))"
    )
    op, runner, profile, extras = parse_key(key)
    assert (op, runner) == ("fp8_gemm", "CudnnFp8GemmRunner")
    assert profile[0] == (1, 512, 5120) and profile[4] == (1, -1, 5120) and profile[5] == (-1,)
    assert extras == ("torch.float8_e4m3fn", "torch.float8_e4m3fn", "torch.bfloat16")
    for hostile in ("__import__('os').system('true')", "('a', open('x'))", "[1, 2]", "('a', 1 + 2)"):
        with pytest.raises(ValueError):
            parse_key(hostile)


def test_real_h200_tables_agree_with_the_recorded_run() -> None:
    cache = read_cache(TWO_SHAPES)
    assert cache.format == "0.6.18+" and cache.metadata["cudnn_version"] == "91900" and len(cache.entries) == 42
    square = _runners(TWO_SHAPES, 5120, 5120)
    assert len(square) == 21
    assert {m for m, r in square.items() if r == "CudnnFp8GemmRunner"} == {1, 2, 4, 8, 16, 32}  # cuDNN wins 1-32
    assert all(square[m] == "CublasFp8GemmRunner" for m in square if m >= 64)  # cuBLAS 64-8192
    wide = _runners(TWO_SHAPES, 14336, 5120)
    assert {m for m, r in wide.items() if r == "CudnnFp8GemmRunner"} == {1, 2, 4, 8, 16}  # cuDNN wins 1-16
    first = winners(cache)[("fp8_gemm", 14336, 5120)][0]
    assert first.tactic == [7, [[12, 32]]]  # a cuDNN (engine, knobs) tactic
    assert read_cache(ASCENDING).entries  # the ascending run parses too


def test_bucket_mapping_matches_flashinfer() -> None:
    assert [map_to_hybrid_bucket(x) for x in (405, 482, 257, 512, 513, 769, 2049, 4097, 129, 3, 0)] == [
        512,
        512,
        512,
        512,
        768,
        1024,
        2560,
        8192,
        256,
        4,
        1,
    ]
    assert hybrid_buckets(8192) == (
        1,
        2,
        4,
        8,
        16,
        32,
        64,
        128,
        256,
        512,
        768,
        1024,
        1280,
        1536,
        1792,
        2048,
        2560,
        3072,
        3584,
        4096,
        8192,
    )
    assert set(hybrid_buckets(8192)) == set(_runners(TWO_SHAPES, 5120, 5120))


# -- policies --------------------------------------------------------------------------------------


def test_sm120_release_cache_fails_with_the_m512_bucket_first(tmp_path: Path) -> None:
    cache = read_cache(sm120_release(tmp_path))
    assert cache.format == "0.6.16"
    checks = judge_cache(cache, arch="sm120", policies=load_policies())
    (policy,) = [c for c in checks if c.name == "policy"]
    assert policy.status is Status.FAIL
    assert policy.message.startswith("CudnnFp8GemmRunner wins fp8_gemm at M bucket 512 (N=5120,K=5120)")
    assert policy.evidence["offending"][0]["m_bucket"] == 512
    assert {o["policy"] for o in policy.evidence["offending"]} == {"sm12x-no-cudnn-fp8-below-9.23.1"}


def test_sm120_gated_cache_passes(tmp_path: Path) -> None:
    cache = read_cache(sm120_gated(tmp_path))
    assert {e.runner for e in cache.entries} == {"CutlassFp8GemmRunner", "CublasFp8GemmRunner"}
    assert all(e.tactic == -1 and e.extras == () for e in cache.entries if e.runner == "CutlassFp8GemmRunner")
    (policy,) = [c for c in judge_cache(cache, arch="sm121", policies=load_policies()) if c.name == "policy"]
    assert policy.status is Status.PASS


def _versions(path: Path, flashinfer: str, cudnn: str) -> Path:
    doc = json.loads(path.read_text())
    doc["_metadata"].update(flashinfer_version=flashinfer, cudnn_version=cudnn)
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize(
    ("flashinfer", "cudnn", "status", "policy"),
    [
        # the seed's own stack with a new cuDNN: no gate at all, the fault path
        ("0.6.16.post3", "92301", Status.FAIL, "sm12x-no-cudnn-fp8-before-the-gate"),
        # the gate installed but cuDNN below 9.23.1: a win means the gate did not hold
        ("0.6.18.post1", "92000", Status.FAIL, "sm12x-no-cudnn-fp8-below-9.23.1"),
        # torch 2.14's cuDNN 9.24 with the workspace fix: the gate is off, nobody knows yet
        ("0.7.2.post1", "92400", Status.WARN, "sm12x-cudnn-fp8-unproven"),
        ("0.6.18.post1", "92400", Status.WARN, "sm12x-cudnn-fp8-unproven-without-workspace-fix"),
    ],
)
def test_cudnn_winning_on_sm12x_by_cudnn_and_flashinfer(
    tmp_path: Path, flashinfer: str, cudnn: str, status: Status, policy: str
) -> None:
    cache = read_cache(_versions(sm120_release(tmp_path), flashinfer, cudnn))
    (check,) = [c for c in judge_cache(cache, arch="sm120", policies=load_policies()) if c.name == "policy"]
    assert check.status is status
    assert check.evidence["offending"][0]["policy"] == policy
    if status is Status.WARN:
        assert check.message.startswith("cuDNN selected, unproven on this cuDNN (92400")
        assert "--arms cudnn-candidate,cutlass-kernel" in check.evidence["soak"]


def test_policy_does_not_apply_to_another_arch_and_a_gated_cache_passes_on_any_cudnn(tmp_path: Path) -> None:
    gated = read_cache(_versions(sm120_gated(tmp_path), "0.7.2.post1", "92400"))
    (check,) = [c for c in judge_cache(gated, arch="sm120", policies=load_policies()) if c.name == "policy"]
    assert check.status is Status.PASS
    assert [c.status for c in judge_cache(read_cache(TWO_SHAPES), arch="sm90", policies=load_policies())] == [
        Status.SKIP
    ]
    assert [c.status for c in judge_cache(read_cache(TWO_SHAPES), arch="sm90", policies=load_policies())] == [
        Status.SKIP
    ]


def test_a_cache_from_another_environment_proves_nothing(tmp_path: Path) -> None:
    cache = read_cache(sm120_gated(tmp_path))
    checks = judge_cache(
        cache,
        arch="sm120",
        policies=load_policies(),
        expected={"flashinfer_version": "0.6.18.post1", "cudnn_version": "92100"},
    )
    env = checks[0]
    assert env.name == "cache-environment" and env.status is Status.INCONCLUSIVE
    assert env.evidence == {"cudnn_version": {"cache": "92000", "image": "92100"}}


def test_cells_add_forbid_and_allow(tmp_path: Path) -> None:
    release = read_cache(sm120_release(tmp_path))
    allowed = judge_cache(release, arch="sm120", policies=load_policies(), allow=(("fp8_gemm", "CudnnFp8GemmRunner"),))
    assert next(c for c in allowed if c.name == "policy").status is Status.SKIP
    extra = judge_cache(
        read_cache(TWO_SHAPES),
        arch="sm90",
        policies=load_policies(),
        extra_forbid=(("fp8_gemm", "CudnnFp8GemmRunner"),),
    )
    assert next(c for c in extra if c.name == "policy").status is Status.FAIL


# -- the stage's judgement of a fresh cache ---------------------------------------------------------


def _fixed_cell(real_matrix):
    return real_matrix.cell("sm120-vllm-0.28.0-fi-0.6.18.post1-cu130")


def test_fresh_cache_named_in_the_log_is_judged_and_kept(real_matrix, tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache" / "0.6.16.post3" / "120f" / "abc"
    cache_dir.mkdir(parents=True)
    (cache_dir / "autotune_configs.json").write_text(sm120_release(tmp_path).read_text())
    log = (
        "(EngineCore pid=24) INFO [kernel_warmup.py:258] Using FlashInfer autotune cache file: "
        f"{CACHE_MOUNT}/0.6.16.post3/120f/abc/autotune_configs.json\n"
    )
    facts = Facts(serve=True, arch="sm120", flashinfer="0.6.16.post3", cudnn=92000)
    checks = {
        c.name: c
        for c in judge_fresh_cache(
            _fixed_cell(real_matrix),
            log,
            tmp_path / "cache",
            tmp_path,
            facts=facts,
            env={"VLLM_DISABLED_KERNELS": None},
        )
    }
    assert checks["autotune-cache"].status is Status.PASS
    assert checks["cache-environment"].status is Status.PASS
    assert checks["policy"].status is Status.FAIL and "M bucket 512" in checks["policy"].message
    assert (tmp_path / "autotune_configs.json").is_file()
    assert checks["autotune-cache"].evidence["env"] == {"VLLM_DISABLED_KERNELS": None}


def test_no_cache_is_inconclusive_with_the_reason(real_matrix, tmp_path: Path) -> None:
    (tmp_path / "cache").mkdir()
    log = "(EngineCore pid=24) INFO [kernel_warmup.py:170] Skipping FlashInfer autotune because it is disabled.\n"
    (check,) = judge_fresh_cache(
        _fixed_cell(real_matrix), log, tmp_path / "cache", tmp_path, facts=Facts(serve=True, arch="sm120"), env={}
    )
    assert check.status is Status.INCONCLUSIVE
    assert "Skipping FlashInfer autotune because it is disabled." in check.message


def test_an_empty_cache_is_inconclusive(real_matrix, tmp_path: Path) -> None:
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "autotune_configs.json").write_text(json.dumps({"_metadata": {"gpu": RTX_PRO_6000}}))
    (check,) = judge_fresh_cache(
        _fixed_cell(real_matrix), "", tmp_path / "cache", tmp_path, facts=Facts(serve=True, arch="sm120"), env={}
    )
    assert check.status is Status.INCONCLUSIVE and "no entries" in check.message


def previous_receipt(directory: Path, winners: list[dict[str, Any]]) -> Receipt:
    """An earlier run's receipt carrying `winners`, written and read back as `--previous` reads it."""
    made = build_receipt(_report(Status.PASS), matrix_digest="sha256:m", host=CPU, started_at=0, finished_at=1)
    return Receipt.read(write_all(dataclasses.replace(made, autotune=tuple(winners)), directory)["receipt"])


def test_winners_are_diffed_against_a_previous_receipt(tmp_path: Path) -> None:
    old = winners_table(read_cache(sm120_release(tmp_path)))
    previous = previous_receipt(tmp_path / "earlier", old)
    check = diff_winners(winners_table(read_cache(sm120_gated(tmp_path))), previous)
    changed = {(c["n"], c["m_bucket"]): (c["before"], c["now"]) for c in check.evidence["changed"]}
    assert changed[(5120, 512)] == ("CudnnFp8GemmRunner", "CublasFp8GemmRunner")
    assert changed[(5120, 1)] == ("CudnnFp8GemmRunner", "CutlassFp8GemmRunner")
    assert len(changed) == 1 + 6 + 5  # the 512 bucket, and every bucket cuDNN won on the H200
    assert "since the previous receipt (cpu-tiny, " in check.message
    same = diff_winners(old, previous)
    assert same.status is Status.PASS and same.evidence["changed"] == [] and same.message.startswith("same winners")
    none = diff_winners(old, previous_receipt(tmp_path / "cpu", []))
    assert none.status is Status.SKIP and "has no autotune winners" in none.message


def test_previous_takes_a_receipt_and_names_an_old_report_json(real_matrix, tmp_path: Path, capsys) -> None:
    """`--previous` reads a receipt through the model before anything runs (exit 2 naming the file);
    a report.json of an older stackproof is told to pass the receipt.json beside it."""
    report = tmp_path / "run-1" / "report.json"
    report.parent.mkdir()
    report.write_text(json.dumps({"schema_version": 1, "cell": "cpu-tiny", "stages": [], "outcome": {}}))
    assert main(["verify", "cpu-tiny", "--matrix", str(real_matrix.file), "--previous", str(report)]) == 2
    err = capsys.readouterr().err
    assert str(report) in err and "pass an earlier run's receipt.json" in err and "no longer writes report.json" in err
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"kind": "something else"}))
    assert main(["verify", "cpu-tiny", "--matrix", str(real_matrix.file), "--previous", str(other)]) == 2
    err = capsys.readouterr().err
    assert str(other) in err and "not a stackproof receipt" in err and "no longer writes" not in err


# -- the kernel probe on the H200 --------------------------------------------------------------------


def test_h200_kernel_probe_table_agrees_with_flashinfers_cache() -> None:
    report = json.loads(PROBE_REPORT.read_text())
    result = judge_probe(report, MINISTRAL, arch=None, seconds=263.0)
    assert result.arch == "sm90" and arch_of("12.1") == "sm121"
    assert {(t["n"], t["k"]) for t in result.table} == {(6144, 5120), (5120, 4096), (32768, 5120), (5120, 16384)}
    assert all(len(t["rows"]) == 21 for t in result.table)
    checks = {c.name: c for c in result.checks}
    assert checks["cache-covers-probe"].status is Status.PASS
    assert checks["cache-environment"].status is Status.PASS  # the probe's own FlashInfer and cuDNN
    assert checks["workspace"].status is Status.PASS and report["workspace"]["grew"] is False
    assert report["cudnn"] == 91900 and report["gpu"] == "NVIDIA H200"
    assert sum(s["tune_seconds"] for s in report["shapes"].values()) <= report["wall_seconds"] + 1


def test_a_grown_workspace_is_a_warning() -> None:
    report = json.loads(PROBE_REPORT.read_text())
    report["workspace"] = {**report["workspace"], "bytes": 33554688, "grew": True}
    (check,) = [c for c in judge_probe(report, MINISTRAL, arch="sm90", seconds=1.0).checks if c.name == "workspace"]
    assert check.status is Status.WARN and "33,554,688" in check.message


# -- inspect autotune --------------------------------------------------------------------------------


def test_inspect_autotune_exit_codes_and_bucket_answers(tmp_path: Path, capsys) -> None:
    assert main(["inspect", "autotune", str(sm120_release(tmp_path)), "--arch", "sm120"]) == 1
    assert main(["inspect", "autotune", str(sm120_gated(tmp_path)), "--arch", "sm120", "--m", "405", "--json"]) == 0
    capsys.readouterr()
    assert main(["inspect", "autotune", str(TWO_SHAPES), "--arch", "sm120", "--m", "482", "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["buckets_for"]["482"]["bucket"] == 512
    assert document["buckets_for"]["482"]["runners"]["fp8_gemm N=5120 K=5120"] == "CublasFp8GemmRunner"
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["inspect", "autotune", str(bad)]) == 2


def test_cells_autotune_lists_load_and_are_validated(tmp_path: Path) -> None:
    from pipeline.errors import MatrixError
    from pipeline.matrix.read import load_matrix

    text = """\
schema_version: 1
indexes: {pypi: {url: "https://pypi.org/simple"}}
bases: {img: {image: "example/img:1.0"}}
cells:
  - id: c
    base: img
    platform: linux/amd64
    arch: sm120
    autotune:
      forbid: [{op: fp8_gemm, runner: CublasFp8GemmRunner}]
      allow: [{op: fp8_gemm, runner: CudnnFp8GemmRunner}]
"""
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    cell = load_matrix(path, images_dir=tmp_path).cell("c")
    assert cell.autotune_forbid == (("fp8_gemm", "CublasFp8GemmRunner"),)
    assert cell.autotune_allow == (("fp8_gemm", "CudnnFp8GemmRunner"),)
    path.write_text(text.replace("runner: CublasFp8GemmRunner", "runer: CublasFp8GemmRunner"))
    with pytest.raises(MatrixError) as info:
        load_matrix(path, images_dir=tmp_path)
    assert f"{path}:10: cells[0].autotune.forbid[0].runer: unknown key, did you mean 'runner'?" in info.value.problems
