"""The allocator-churn probe (flashinfer-ai/flashinfer#4549): the pure judge both ways on the
constructed documents (tests/fixtures/churn/README.md says why they are constructed), the
measuring code's counter arithmetic on a fake allocator, the plan's plain "not available on sm90",
the H200 script's exits (3 without CUDA, 2 on bad input), and the kernel probe's checks."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.result import Status
from stackproof.kernels import churn_checks
from verify.kernels.churn import ChurnInputError, judge_churn, render_table, summary
from verify.probes import churn_probe

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "churn"
SCRIPT = REPO / "benchmarks" / "h200_host" / "churn.py"
MiB = 1024 * 1024


def document(name: str) -> dict[str, Any]:
    return dict(json.loads((FIXTURES / f"{name}-constructed.json").read_text()))


def by_key(verdicts: Any) -> dict[tuple[str, str, int | None], Any]:
    return {(v.gemm, v.backend, v.m): v for v in verdicts}


# -- the judge ---------------------------------------------------------------------------------------


def test_cutlass_fp4_churns_for_m_up_to_256_and_not_above() -> None:
    verdicts = by_key(judge_churn(document("sm120-cutlass-fp4")))
    for m in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        v = verdicts[("flashinfer.mm_fp4", "cutlass", m)]
        assert (v.verdict, v.transient_bytes, v.transient_allocations) == ("churn", 34 * MiB, 1), m
    for m in (384, 512):
        assert verdicts[("flashinfer.mm_fp4", "cutlass", m)].verdict == "clean"
    # torch.mm beside it allocates only its output: never transient.
    assert {v.verdict for k, v in verdicts.items() if k[0] == "torch.mm"} == {"clean"}
    churn_m = summary(tuple(verdicts.values()))["flashinfer.mm_fp4 (cutlass)"]["churn_m"]
    assert churn_m == [1, 2, 4, 8, 16, 32, 64, 128, 256]


def test_the_h200_shape_is_clean_and_says_mm_fp4_is_not_available_on_sm90() -> None:
    verdicts = judge_churn(document("sm90-clean"))
    assert {v.verdict for v in verdicts if v.gemm != "flashinfer.mm_fp4"} == {"clean"}
    (fp4,) = [v for v in verdicts if v.gemm == "flashinfer.mm_fp4"]
    assert fp4.verdict == "unavailable" and fp4.reason.startswith("mm_fp4: not available on sm90")
    table = render_table(verdicts)
    assert "mm_fp4: not available on sm90" in table and "flashinfer-ai/flashinfer#4549" in table


def test_the_h200_s_measured_run_is_clean_where_it_ran_and_says_why_where_it_could_not() -> None:
    """The real run on the H200 (benchmarks/h200_host/churn.py, FlashInfer 0.6.14, torch 2.11.0+cu130):
    torch.mm and bmm_fp8 (cublas, auto) allocate nothing transient for M 1..8192; bmm_fp8's cutlass
    backend refuses capability 90 (an error sample each M, kept); mm_fp4 is unavailable on sm90."""
    measured = json.loads((FIXTURES / "h200-sm90-measured.json").read_text())
    assert measured["gpu"] == "NVIDIA H200" and measured["arch"] == "sm90"
    verdicts = judge_churn(measured)
    ran = {(v.gemm, v.backend) for v in verdicts if v.verdict == "clean"}
    assert ran == {("torch.mm", "bf16"), ("flashinfer.bmm_fp8", "cublas"), ("flashinfer.bmm_fp8", "auto")}
    assert all(v.transient_bytes == 0 for v in verdicts if v.verdict == "clean")
    cutlass = [v for v in verdicts if (v.gemm, v.backend) == ("flashinfer.bmm_fp8", "cutlass")]
    assert cutlass and {v.verdict for v in cutlass} == {"error"}
    assert all("capability 90" in v.reason for v in cutlass)
    fp4 = [v for v in verdicts if v.gemm == "flashinfer.mm_fp4"]
    assert fp4 and {v.verdict for v in fp4} == {"unavailable"}
    # the same measured counters with a planted 34 MiB transient in torch.mm at M=1 must churn
    planted = json.loads(json.dumps(measured))
    mm = next(g for g in planted["gemms"] if g["gemm"] == "torch.mm")
    sample = next(s for s in mm["samples"] if s["m"] == 1)
    for call in sample["calls"]:  # allocated and freed inside the call: transient
        call["allocated_bytes.all.allocated"] += 34 * MiB
        call["allocation.all.allocated"] += 1
    assert by_key(judge_churn(planted))[("torch.mm", "bf16", 1)].verdict == "churn"


def test_a_threshold_above_the_workspace_turns_churn_into_clean() -> None:
    verdicts = by_key(judge_churn(document("sm120-cutlass-fp4"), threshold=64 * MiB))
    assert verdicts[("flashinfer.mm_fp4", "cutlass", 1)].verdict == "clean"


def test_some_calls_allocating_is_sporadic_and_an_error_is_kept() -> None:
    doc = document("sm120-cutlass-fp4")
    sample = doc["gemms"][1]["samples"][0]
    for call in sample["calls"][1:]:  # only the first call allocates the workspace
        call["allocated_bytes.all.allocated"] = call["allocated_bytes.all.current"]
    doc["gemms"][1]["samples"][1] = {"m": 2, "error": "RuntimeError: no kernel for this shape", "calls": []}
    verdicts = by_key(judge_churn(doc))
    first = verdicts[("flashinfer.mm_fp4", "cutlass", 1)]
    assert (first.verdict, first.churn_calls, first.calls) == ("sporadic", 1, 4)
    assert verdicts[("flashinfer.mm_fp4", "cutlass", 2)].verdict == "error"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(churn_schema=2), "churn_schema: 2, expected 1"),
        (lambda d: d.update(gemms={}), "gemms: must be a list"),
        (lambda d: d["gemms"][0]["samples"][0].pop("calls"), "gemms[0]: missing or malformed field 'calls'"),
    ],
)
def test_a_malformed_document_names_its_field(edit: Any, message: str) -> None:
    doc = document("sm90-clean")
    edit(doc)
    with pytest.raises(ChurnInputError, match=message.replace("[", r"\[").replace("]", r"\]")):
        judge_churn(doc)


# -- the measuring code, on a fake caching allocator -------------------------------------------------


class FakeAllocator:
    """torch.cuda's counters, kept by hand: a call allocates its output and, optionally, a transient."""

    def __init__(self) -> None:
        self.stats = dict.fromkeys(churn_probe.STAT_KEYS, 0)
        self.peak = 0

    def alloc(self, size: int) -> None:
        self.stats["allocation.all.allocated"] += 1
        self.stats["allocation.all.current"] += 1
        self.stats["allocated_bytes.all.allocated"] += size
        self.stats["allocated_bytes.all.current"] += size
        self.peak = max(self.peak, self.stats["allocated_bytes.all.current"])

    def free(self, size: int) -> None:
        self.stats["allocation.all.current"] -= 1
        self.stats["allocated_bytes.all.current"] -= size

    def torch(self) -> Any:
        cuda = SimpleNamespace(
            synchronize=lambda: None,
            memory_stats=lambda: dict(self.stats),
            reset_peak_memory_stats=lambda: setattr(self, "peak", self.stats["allocated_bytes.all.current"]),
            memory_allocated=lambda: self.stats["allocated_bytes.all.current"],
            max_memory_allocated=lambda: self.peak,
        )
        return SimpleNamespace(cuda=cuda)

    def gemm(self, out_bytes: int, workspace: int) -> Any:
        def call() -> Any:
            self.alloc(out_bytes)
            if workspace:
                self.alloc(workspace)
                self.free(workspace)
            return SimpleNamespace(numel=lambda: out_bytes // 2, element_size=lambda: 2)

        return lambda m, n, k: call


@pytest.mark.parametrize(("workspace", "verdict"), [(34 * MiB, "churn"), (0, "clean")])
def test_the_counters_the_probe_records_judge_both_ways(workspace: int, verdict: str) -> None:
    fake = FakeAllocator()
    sample = churn_probe._sample(fake.torch(), fake.gemm(4096, workspace), 1, 2048, 5120, calls=3, warmup=1)
    assert sample["error"] is None and len(sample["calls"]) == 3
    assert sample["calls"][0]["allocated_bytes.all.allocated"] == 4096 + workspace
    assert sample["calls"][0]["peak_over_start"] == 4096 + workspace
    doc = {"churn_schema": 1, "gemms": [{"gemm": "g", "backend": "b", "available": True, "samples": [sample]}]}
    (v,) = judge_churn(doc)
    assert (v.verdict, v.transient_bytes) == (verdict, workspace)


def test_a_call_that_raises_is_an_error_sample_not_a_crash() -> None:
    fake = FakeAllocator()

    def refuse(m: int, n: int, k: int) -> Any:
        raise RuntimeError("cutlass: unsupported shape")

    sample = churn_probe._sample(fake.torch(), refuse, 7, 1, 1, calls=2, warmup=0)
    assert sample == {"m": 7, "error": "RuntimeError: cutlass: unsupported shape", "calls": []}


def test_the_plan_says_plainly_where_fp4_and_flashinfer_are_missing() -> None:
    torch = SimpleNamespace()
    sm90 = {(g, b): make for g, b, make in churn_probe.gemm_plan(torch, SimpleNamespace(), None, (9, 0))}
    assert sm90[("flashinfer.mm_fp4", "cutlass")] == "mm_fp4: not available on sm90 (FP4 needs SM100 or SM120)"
    assert callable(sm90[("flashinfer.bmm_fp8", "cublas")]) and callable(sm90[("torch.mm", "bf16")])
    sm120 = {(g, b): make for g, b, make in churn_probe.gemm_plan(torch, SimpleNamespace(), None, (12, 0))}
    assert callable(sm120[("flashinfer.mm_fp4", "cutlass")])
    no_fi = {(g, b): make for g, b, make in churn_probe.gemm_plan(torch, None, "ImportError: x", (12, 0))}
    assert no_fi[("flashinfer.mm_fp4", "cutlass")] == "mm_fp4: FlashInfer does not import here (ImportError: x)"


# -- the H200 script -----------------------------------------------------------------------------------


def run_script(*args: str, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", **({"PYTHONPATH": str(pythonpath)} if pythonpath else {})}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60)


def test_the_script_exits_3_without_a_cuda_device(tmp_path: Path) -> None:
    # A torch that imports but sees no device (as a CPU build does); the real CPU wheel says the same.
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(
        "__version__ = '2.13.0+cpu'\n"
        "class version:\n    cuda = None\n"
        "class cuda:\n    @staticmethod\n    def is_available():\n        return False\n"
    )
    result = run_script("--out", str(tmp_path / "out"), pythonpath=tmp_path)
    assert result.returncode == 3, result.stderr
    assert "no CUDA device (torch 2.13.0+cpu" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_the_script_judges_a_recorded_run_and_rejects_a_bad_one(tmp_path: Path) -> None:
    result = run_script("--judge", str(FIXTURES / "sm120-cutlass-fp4-constructed.json"))
    assert result.returncode == 0, result.stderr
    assert re.search(r"^flashinfer\.mm_fp4 +cutlass +1 +1 +35,651,584 .* churn$", result.stdout, re.MULTILINE)
    assert re.search(r"^flashinfer\.mm_fp4 +cutlass +384 .* clean$", result.stdout, re.MULTILINE)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"churn_schema": 9}))
    result = run_script("--judge", str(bad))
    assert result.returncode == 2 and "churn_schema: 9" in result.stderr
    assert run_script().returncode == 2


# -- next to the winners: the kernel probe's checks ----------------------------------------------------------


def test_kernel_probe_churn_checks_warn_skip_and_pass() -> None:
    sm120 = {"shape": "gate_up_proj", **document("sm120-cutlass-fp4")}
    checks = {c.name: c for c in churn_checks([sm120, {"shape": "o_proj", **document("sm90-clean")}])}
    warn = checks["allocator-churn:gate_up_proj:flashinfer.mm_fp4:cutlass"]
    assert warn.status == Status.WARN and "flashinfer-ai/flashinfer#4549" in warn.message
    assert "M=1,2,4,8,16,32,64,128,256 " in warn.message
    assert checks["allocator-churn:gate_up_proj:torch.mm:bf16"].status == Status.PASS
    skip = checks["allocator-churn:o_proj:flashinfer.mm_fp4:cutlass"]
    assert skip.status == Status.SKIP and skip.message.startswith("mm_fp4: not available on sm90")
    assert churn_checks(None) == []
