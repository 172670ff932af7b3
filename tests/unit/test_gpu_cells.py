"""The GPU cells as the audit of the real wheels corrected them (issue 12, item 1 and 2).

No GPU runs here: each test pins one correction to the upstream text it rests on (vLLM 0.28.0,
FlashInfer 0.6.18.post1 wheels; quoted in the cells' comments), both ways where a check can fail.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pipeline.host.geometry import HostFingerprint
from pipeline.matrix.model import Expectation, Matrix
from pipeline.receiptrender import render_junit, render_markdown
from pipeline.result import CheckResult, StageResult, Status, VerifyReport, evaluate
from tests.unit.test_autotune import previous_receipt
from verify.kernels.autotune import read_cache, winners
from verify.logs.catalog import Facts, catalog_for, rules_for
from verify.logs.logscan import judge, scan
from verify.stages.autotune import diff_winners, winners_table
from verify.stages.receipt import build_receipt, receipt_status

RELEASE = "sm120-vllm-0.28.0-release"
FIXED = "sm120-vllm-0.28.0-fi-0.6.18.post1-cu130"
SPARK = "sm121-vllm-0.28.0-fi-0.6.18.post1-cu130"
CORE = "(EngineCore pid=311)"


def _arg(args: tuple[str, ...], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


# -- serve specs --------------------------------------------------------------------------------------


@pytest.mark.parametrize("cell_id", [RELEASE, FIXED])
def test_ministral_cells_fit_a_32_or_48_gb_card(real_matrix: Matrix, cell_id: str) -> None:
    serve = real_matrix.cell(cell_id).serve
    assert serve is not None
    assert _arg(serve.args, "--kv-cache-dtype") == "fp8"  # as the #55571 reporter ran it
    assert _arg(serve.args, "--max-model-len") == "32768"  # not the model's 262,144 default


def test_gb10_stays_at_or_below_085_memory_utilisation(real_matrix: Matrix) -> None:
    serve = real_matrix.cell(SPARK).serve
    assert serve is not None
    value = _arg(serve.args, "--gpu-memory-utilization")
    assert value is not None and float(value) <= 0.85


# -- the sm121 cutlass arm and the NVFP4 log line ----------------------------------------------------

NVFP4_CUTLASS = f"{CORE} INFO 11-30 10:00:00 [__init__.py:1100] Using CutlassNvFp4LinearKernel for NVFP4 GEMM\n"
NVFP4_B12X = f"{CORE} INFO 11-30 10:00:00 [__init__.py:1100] Using FlashInferB12xNvFp4LinearKernel for NVFP4 GEMM\n"
STARTED = "(APIServer pid=1) INFO 11-30 10:00:05 [on.py:62] Application startup complete.\n"


def _judge_arm(real_matrix: Matrix, log: str) -> dict[str, Status]:
    cell = real_matrix.cell(SPARK)
    arm = cell.arm("cutlass-kernel")
    rules = rules_for(cell, arm, Facts(serve=True, arch="sm121", flashinfer="0.6.18.post1", engine_version="0.28.0"))
    return {c.name: c.status for c in judge(scan(log.encode(), rules, ()), rules)}


def test_sm121_cutlass_arm_passes_on_the_line_vllm_prints(real_matrix: Matrix) -> None:
    verdicts = _judge_arm(real_matrix, NVFP4_CUTLASS + STARTED)
    assert verdicts["expect:cutlass-nvfp4-selected"] is Status.PASS
    assert verdicts["forbid:no-flashinfer-nvfp4"] is Status.PASS


def test_sm121_cutlass_arm_fails_when_a_flashinfer_nvfp4_kernel_is_used(real_matrix: Matrix) -> None:
    verdicts = _judge_arm(real_matrix, NVFP4_B12X + STARTED)
    assert verdicts["expect:cutlass-nvfp4-selected"] is Status.FAIL
    assert verdicts["forbid:no-flashinfer-nvfp4"] is Status.FAIL


def test_nvfp4_kernel_is_captured_as_evidence_by_the_vllm_rule_set() -> None:
    rules = rules_for(None, None, Facts(serve=True, arch="sm121"))
    matches = scan((NVFP4_B12X + STARTED).encode(), rules, ())
    assert [m.groups for m in matches if m.id == "nvfp4-kernel"] == [{"kernel": "FlashInferB12xNvFp4LinearKernel"}]


# -- the cuDNN gate rule set: from 0.6.18 on -----------------------------------------------------------


@pytest.mark.parametrize(
    ("flashinfer", "applies"),
    [("0.6.18", True), ("0.6.18.post1", True), ("0.6.19", True), ("0.6.16.post3", False), ("0.6.17", False)],
)
def test_cudnn_gate_rule_applies_from_flashinfer_0_6_18(flashinfer: str, applies: bool) -> None:
    rules = rules_for(None, None, Facts(serve=True, arch="sm120", flashinfer=flashinfer, cudnn=92000))
    assert ("cudnn-gated-out-on-sm12x" in {r.id for r in rules}) is applies


# -- signatures that say which releases they concern --------------------------------------------------


@pytest.mark.parametrize(
    ("vllm", "applies"),
    [("0.28.0", False), ("0.27.1", False), ("0.33.0", False), ("0.34.0", False), ("0.35.0", True), (None, True)],
)
def test_ple_signature_is_inert_where_the_variable_does_not_exist(vllm: str | None, applies: bool) -> None:
    ids = {s.id for s in catalog_for(Facts(serve=True, arch="sm120", engine_version=vllm))}
    assert ("ple-offload-engine-init" in ids) is applies


def test_catalog_for_unknown_facts_keeps_everything() -> None:
    assert {s.id for s in catalog_for(None)} >= {"ple-offload-engine-init", "cuda-illegal-memory-access"}


def test_other_environment_save_message_is_caught_and_only_for_0_6_18() -> None:
    line = (
        f"{CORE} WARNING 11-30 10:00:00 [autotuner.py:2571] [Autotuner]: Not saving configs to "
        "/stackproof/autotune-cache/abc/autotune_configs.json: the file was created in a different environment "
        "(gpu: saved=NVIDIA H200 vs current=NVIDIA RTX PRO 5000). Use a different cache path.\n"
    )
    new = catalog_for(Facts(serve=True, arch="sm120", flashinfer="0.6.18.post1"))
    (hit,) = [m for m in scan(line.encode(), (), new) if m.id == "flashinfer-autotune-not-saved-other-environment"]
    assert hit.groups["mismatch"] == "gpu: saved=NVIDIA H200 vs current=NVIDIA RTX PRO 5000"
    old = catalog_for(Facts(serve=True, arch="sm120", flashinfer="0.6.16.post3"))
    assert not [m for m in scan(line.encode(), (), old) if m.id.startswith("flashinfer-autotune-not-saved")]


# -- autotune cache keys of other ops ------------------------------------------------------------------


def _fp4_key(m: int, n: int, k: int, runner: str = "CutlassFp4GemmRunner") -> str:
    # mm_fp4's inputs (FlashInfer 0.6.18.post1 gemm_base.py L7214-7225): a (M, K/2), b = b_fp4.T (K/2, N),
    # scales, alpha, out_dtype (a non-tensor: (0,)), out (M, N), block_size, use_nvfp4, workspace.
    profile = (
        f"(({m}, {k // 2}), ({k // 2}, {n}), ({m}, {k // 16}), ({k // 16}, {n}), (1,), (0,), ({m}, {n}), "
        "(0,), (0,), (33554432,))"
    )
    return f"('fp4_gemm', '{runner}', {profile}, ())"


def _moe_key(tokens: int) -> str:
    return f"('trtllm::fused_moe::gemm1', 'MoERunner', (({tokens}, 2048), (128, 1536, 1024), (0,)), (8,))"


def _cache(tmp_path: Path, entries: dict[str, list[object]]) -> Path:
    document = {"_metadata": {"flashinfer_version": "0.6.18.post1", "gpu": "NVIDIA GB10"}, **entries}
    path = tmp_path / "autotune_configs.json"
    path.write_text(json.dumps(document))
    return path


def test_fp4_gemm_profiles_are_read_as_2d_packed_gemms(tmp_path: Path) -> None:
    path = _cache(
        tmp_path,
        {
            _fp4_key(512, 4096, 2048): ["CutlassFp4GemmRunner", 3],
            _fp4_key(1024, 4096, 2048, "CudnnFp4GemmRunner"): ["CudnnFp4GemmRunner", [1, []]],
            _fp4_key(512, 2048, 4096): ["CutlassFp4GemmRunner", 5],
        },
    )
    table = winners(read_cache(path))
    assert sorted(table) == [("fp4_gemm", 2048, 4096), ("fp4_gemm", 4096, 2048)]
    assert [(e.m_bucket, e.runner) for e in table[("fp4_gemm", 4096, 2048)]] == [
        (512, "CutlassFp4GemmRunner"),
        (1024, "CudnnFp4GemmRunner"),
    ]


def test_ops_not_read_as_gemms_keep_their_raw_profile_and_never_collide(tmp_path: Path) -> None:
    path = _cache(tmp_path, {_moe_key(256): ["MoERunner", 1], _moe_key(512): ["MoERunner", 2]})
    cache = read_cache(path)
    assert len({e.profile for e in cache.entries}) == 2 and all(e.profile for e in cache.entries)
    table = winners_table(cache)
    assert [len(t["rows"]) for t in table] == [2]
    assert {r["profile"] for r in table[0]["rows"]} == {e.profile for e in cache.entries}
    # a change in one of them is seen as that one's change
    changed_rows = [dict(r, runner="OtherRunner") if r["tactic"] == 1 else r for r in table[0]["rows"]]
    old = [dict(table[0], rows=changed_rows)]
    diff = diff_winners(table, previous_receipt(tmp_path / "earlier", old))
    assert [(c["before"], c["now"]) for c in diff.evidence["changed"]] == [("OtherRunner", "MoERunner")]


# -- an expected failure that depends on the card ------------------------------------------------------

TIMING = Expectation(
    stage="autotune",
    reason="cuDNN wins at least one fp8_gemm bucket",
    match="CudnnFp8GemmRunner.*fp8_gemm",
    may_not_reproduce="autotuning picks the fastest runner on this card",
)


def _stage(stage: str, status: Status, message: str = "") -> StageResult:
    return StageResult.of(stage, [CheckResult(name="x", status=status, message=message)], 1.0)


def _ran(autotune: Status, message: str = "") -> list[StageResult]:
    return [_stage("imports", Status.PASS), _stage("startup", Status.PASS), _stage("autotune", autotune, message)]


def test_release_cell_declares_that_its_failure_depends_on_the_card(real_matrix: Matrix) -> None:
    expect = real_matrix.cell(RELEASE).expect
    assert expect is not None and expect.may_not_reproduce
    assert "accepts any bucket" in expect.reason  # the reason says what the match checks
    assert real_matrix.cell(FIXED).expect is None


def test_a_timing_failure_that_does_not_happen_is_not_reproduced() -> None:
    outcome = evaluate(TIMING, _ran(Status.PASS))
    assert outcome.passed is True and outcome.not_reproduced is True
    assert outcome.summary.startswith("NOT_REPRODUCED") and "CudnnFp8GemmRunner" in outcome.summary


def test_a_timing_failure_that_happens_is_the_expected_failure() -> None:
    outcome = evaluate(TIMING, _ran(Status.FAIL, "CudnnFp8GemmRunner wins fp8_gemm at M bucket 512"))
    assert outcome.passed is True and outcome.not_reproduced is False
    assert outcome.expected_failure is not None and outcome.expected_failure["matched"] is True


def test_an_inconclusive_stage_is_not_taken_for_not_reproduced() -> None:
    outcome = evaluate(TIMING, _ran(Status.INCONCLUSIVE))
    assert outcome.passed is False and not outcome.not_reproduced


def test_without_may_not_reproduce_a_passing_stage_still_fails_the_pipeline() -> None:
    strict = Expectation(stage="autotune", reason="r", match="x")
    outcome = evaluate(strict, _ran(Status.PASS))
    assert outcome.passed is False and not outcome.not_reproduced


def test_not_reproduced_reaches_receipt_junit_and_summary() -> None:
    stages = _ran(Status.PASS)
    report = VerifyReport(
        cell=RELEASE,
        arm=None,
        image="stackproof/x:1",
        image_id="sha256:" + "1" * 64,
        stages=(*stages, _stage("load", Status.PASS)),
        outcome=evaluate(TIMING, stages),
    )
    assert receipt_status(report)[0] == "NOT_REPRODUCED"
    host = HostFingerprint(
        arch="x86_64", kernel="6.1", os="Debian 12", docker="26.1", gpus=(), driver="none", cuda_driver="none"
    )
    receipt = build_receipt(report, matrix_digest="sha256:" + "2" * 64, host=host, started_at=0.0, finished_at=1.0)
    assert receipt.status == "NOT_REPRODUCED"
    junit = ET.fromstring(render_junit(receipt))
    skipped = [s for s in junit.iter("skipped") if s.get("type") == "NOT_REPRODUCED"]
    assert len(skipped) == 1 and "NOT_REPRODUCED" in (skipped[0].get("message") or "")
    assert junit.get("failures") == "0"
    assert "NOT_REPRODUCED" in render_markdown(receipt).splitlines()[0]
