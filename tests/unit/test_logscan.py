"""Log rules and the signature catalog: every entry from realistic lines, and the real clean logs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.errors import CheckFailed, MatrixError
from pipeline.matrix.model import LogRule
from pipeline.result import Status
from stackproof.cli import main
from verify.logs import logscan
from verify.logs.catalog import Facts, load_catalog, load_rulesets, rules_for
from verify.logs.logscan import LogWatcher, judge, open_log, scan

FIXTURE_LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"  # copies of shared/fixtures/logs
CPU_LOG = FIXTURE_LOGS / "vllm-0.28.0-cpu-startup.log"
AUTOTUNE_LOG = FIXTURE_LOGS / "flashinfer-autotune-h200-info.log"
API, CORE = "(APIServer pid=1)", "(EngineCore pid=24)"

# A realistic excerpt for every catalog entry, with the prefixes vLLM puts on each process's lines.
SAMPLES = {
    "flashinfer-sm120-dynamic-workspace-oom": f"""\
{CORE} ERROR 11-30 10:00:00 [core.py:1010] EngineCore failed to start.
{CORE} ERROR 11-30 10:00:00 [core.py:1010] Traceback (most recent call last):
{CORE} ERROR 11-30 10:00:00 [core.py:1010]   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_model_runner.py", line 4120, in profile_run
{CORE} ERROR 11-30 10:00:00 [core.py:1010]   File "/usr/local/lib/python3.12/dist-packages/flashinfer/fused_moe/cute_dsl/blackwell_sm12x/moe_dispatch.py", line 1859, in allocate_sm120_dynamic_workspace
{CORE} ERROR 11-30 10:00:00 [core.py:1010]     workspace = torch.empty(elements, dtype=torch.uint8, device=device)
{CORE} ERROR 11-30 10:00:00 [core.py:1010] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB.
""",
    "cuda-illegal-memory-access": f"""\
{CORE} ERROR 11-30 10:00:00 [core.py:1010] torch.AcceleratorError: CUDA error: an illegal memory access was encountered
""",
    "mla-fp8-kv-decode-shared-memory": f"""\
{CORE} ERROR 11-30 10:00:00 [core.py:1010] triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 102400, Hardware limit: 101376. Reducing block sizes or `num_stages` may help.
""",
    "flashinfer-topk-ragged-transform": f"""\
{CORE} ERROR 11-30 10:00:00 [core.py:1010] RuntimeError: TopKRaggedTransform failed with error code operation not supported
""",
    "sglang-lm-head-weight-scale": """\
[2026-11-30 10:00:00 TP0] Scheduler hit an exception: KeyError: 'Parameter lm_head.weight_scale not found in params_dict'
""",
    "flashinfer-package-mismatch": f"""\
{API} RuntimeError: flashinfer-cubin version (0.6.13) does not match flashinfer version (0.6.18.post1). Please install the same version of both packages. Set FLASHINFER_DISABLE_VERSION_CHECK=1 to bypass this check.
""",
    "ple-offload-engine-init": f"""\
{API} INFO 11-30 10:00:00 [envs.py:120] VLLM_PLE_CPU_OFFLOAD=1: per-layer embeddings are kept on the host
{CORE} ERROR 11-30 10:00:05 [core.py:1010]   File "/usr/local/lib/python3.12/dist-packages/vllm/model_executor/models/qwen3_8.py", line 926, in __init__
{CORE} ERROR 11-30 10:00:05 [core.py:1010] RuntimeError: ple_embedding table does not fit the device
{API} RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {{}}
""",
    "flashinfer-sm12x-cuda-too-old": f"""\
{CORE} ERROR 11-30 10:00:00 [core.py:1010] RuntimeError: SM 12.x requires CUDA >= 12.9
""",
    # FlashInfer 0.7.2.post1 flashinfer/compilation_context.py:107, on a GB10 with CUDA 12.8.
    "flashinfer-sm12x-cuda-too-old-0.7": f"""\
{CORE} ERROR 11-30 10:00:00 [core.py:1010] RuntimeError: SM 12.1+ requires CUDA >= 12.9
""",
    "flashinfer-autotune-cache-other-environment": f"""\
{CORE} WARNING 11-30 10:00:00 [autotuner.py:2750] [Autotuner]: Cache file /cache/autotune_configs.json was created in a different environment (cudnn_version: saved=92000 vs current=92301). Ignoring cached configs.
""",
    # FlashInfer 0.6.18.post1 autotuner.py L2564-2570, formatted as `_format_meta_mismatches` does.
    "flashinfer-autotune-not-saved-other-environment": f"""\
{CORE} WARNING 11-30 10:00:00 [autotuner.py:2571] [Autotuner]: Not saving configs to /cache/autotune_configs.json: the file was created in a different environment (cudnn_version: saved=92000 vs current=92301). Use a different cache path for the current environment, or delete the file to re-prime it.
""",
    "flashinfer-autotune-no-tuned-config": AUTOTUNE_LOG.read_text().splitlines()[19] + "\n",
    "flashinfer-cudnn-fp8-tactic-failed": f"""\
{CORE} WARNING 11-30 10:00:00 [gemm_base.py:4055] cuDNN fp8 GEMM tactic failed; falling back to default tactic=-1. (cudnnGraphNotSupportedError)
""",
    "vllm-engine-core-init-failed": f"""\
{API} RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {{}}
""",
    "cuda-out-of-memory": f"""\
{CORE} ERROR 11-30 10:00:00 [core.py:1010] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB
""",
    "nvrm-xid-13": "[ 1234.567890] NVRM: Xid (PCI:0000:01:00): 13, pid=4242, name=python3, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address\n",
    "nvrm-xid-31": "[ 1234.5] NVRM: Xid (PCI:0000:01:00): 31, pid=4242, name=python3, Ch 00000008, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f12_34560000\n",
    "nvrm-xid-43": "[ 1234.6] NVRM: Xid (PCI:0000:01:00): 43, pid=4242, name=python3, Ch 00000008\n",
    "nvrm-xid-79": "[ 1234.7] NVRM: Xid (PCI:0000:01:00): 79, pid=0, name=, GPU has fallen off the bus.\n",
}


def test_every_catalog_entry_has_a_sample() -> None:
    assert sorted(SAMPLES) == sorted(s.id for s in load_catalog())


@pytest.mark.parametrize("signature_id", sorted(SAMPLES))
def test_catalog_entry_matches_its_realistic_lines(signature_id: str) -> None:
    text = "(APIServer pid=1) INFO 11-30 09:59:59 [api_server.py:657] a quiet line before\n" + SAMPLES[signature_id]
    matches = scan(text.encode(), (), load_catalog())
    hit = next((m for m in matches if m.id == signature_id), None)
    assert hit is not None, f"{signature_id} did not match its sample"
    sig = next(s for s in load_catalog() if s.id == signature_id)
    assert hit.line_no >= 2 and hit.refs == sig.refs and hit.severity == sig.severity


def test_signature_evidence_groups_are_captured() -> None:
    matches = scan(SAMPLES["flashinfer-package-mismatch"].encode(), (), load_catalog())
    (hit,) = [m for m in matches if m.id == "flashinfer-package-mismatch"]
    assert hit.groups == {"package": "cubin", "installed": "0.6.13", "flashinfer": "0.6.18.post1"}
    assert hit.refs == ("vllm-project/vllm#49804",)
    xid = [m for m in scan(SAMPLES["nvrm-xid-13"].encode(), (), load_catalog()) if m.id == "nvrm-xid-13"]
    assert xid and xid[0].groups["pci"] == "0000:01:00"


def test_window_needs_both_lines_close_together() -> None:
    first = SAMPLES["flashinfer-sm120-dynamic-workspace-oom"].splitlines()[3]
    far = (
        first
        + "\n"
        + "\n".join(f"{CORE} INFO filler {i}" for i in range(60))
        + "\ntorch.OutOfMemoryError: CUDA out of memory\n"
    )
    ids = {m.id for m in scan(far.encode(), (), load_catalog())}
    assert "flashinfer-sm120-dynamic-workspace-oom" not in ids  # 61 lines apart, window is 40
    assert "cuda-out-of-memory" in ids


def test_xid_numbers_do_not_bleed_into_each_other() -> None:
    ids = {m.id for m in scan(b"NVRM: Xid (PCI:0000:01:00): 131, pid=1\n", (), load_catalog())}
    assert not ids & {"nvrm-xid-13", "nvrm-xid-31"}


def test_real_clean_logs_match_no_failure_signature() -> None:
    for log in (CPU_LOG, AUTOTUNE_LOG):
        failing = [m for m in scan(log.read_bytes(), (), load_catalog()) if m.severity == "fail"]
        assert failing == [], f"{log.name}: {failing}"


def test_real_autotune_log_shows_the_no_tuned_config_warning_twice() -> None:
    hits = [m for m in scan(AUTOTUNE_LOG.read_bytes(), (), load_catalog()) if m.kind == "signature"]
    assert [(m.id, m.line_no) for m in hits] == [
        ("flashinfer-autotune-no-tuned-config", 20),
        ("flashinfer-autotune-no-tuned-config", 27),
    ]
    assert hits[0].groups["op"] == "fp8_gemm" and hits[0].groups["runner"] == "CudnnFp8GemmRunner"


def test_catalog_refs_are_exact_upstream_references() -> None:
    refs = {r for s in load_catalog() for r in s.refs}
    assert {
        "vllm-project/vllm#49476",
        "vllm-project/vllm#55571",
        "vllm-project/vllm#53748",
        "vllm-project/vllm#55872",
        "sgl-project/sglang#34895",
        "vllm-project/vllm#49804",
        "vllm-project/vllm#53960",
    } <= refs


# -- rules -------------------------------------------------------------------------------------------


def test_real_cpu_startup_log_passes_cpu_tiny_rules_with_evidence(real_matrix) -> None:
    cell = real_matrix.cell("cpu-tiny")
    rules = rules_for(cell, None, Facts(serve=True, arch="none"))
    checks = {c.name: c for c in judge(scan(CPU_LOG.read_bytes(), rules, load_catalog()), rules)}
    assert all(c.status is Status.PASS for c in checks.values()), {n: c.message for n, c in checks.items()}
    assert checks["evidence"].evidence == {
        "architecture": [{"architecture": "LlamaForCausalLM"}],
        "engine-version": [{"version": "0.28.0"}],
        "server-url": [{"url": "http://127.0.0.1:8000"}],
    }
    assert checks["expect:startup-complete"].evidence["line"] == 95


def test_expect_absent_is_fail_or_inconclusive_and_forbid_fails() -> None:
    rules = (
        LogRule(id="must", kind="expect", pattern="Selected CutlassFP8ScaledMMLinearKernel for \\w+"),
        LogRule(id="maybe", kind="expect", pattern="Skipping cuDNN in bmm_fp8", if_absent="inconclusive"),
        LogRule(id="never", kind="forbid", pattern="Selected FlashInferFP8ScaledMMLinearKernel for "),
    )
    text = (
        f"{API} INFO 11-30 10:00:00 [__init__.py:722] Selected FlashInferFP8ScaledMMLinearKernel for Fp8LinearMethod\n"
    )
    checks = {c.name: c for c in judge(scan(text.encode(), rules, ()), rules)}
    assert checks["expect:must"].status is Status.FAIL
    assert checks["expect:maybe"].status is Status.INCONCLUSIVE
    assert checks["forbid:never"].status is Status.FAIL and "line 1" in checks["forbid:never"].message


def test_arm_that_disables_a_kernel_needs_log_evidence_of_another(real_matrix) -> None:
    fixed = real_matrix.cell("sm120-vllm-0.28.0-fi-0.6.18.post1-cu130")
    arm = fixed.arm("cutlass-kernel")
    rules = rules_for(fixed, arm, Facts(serve=True, arch="sm120"))
    good = f"{API} INFO 11-30 10:00:00 [__init__.py:722] Selected CutlassFP8ScaledMMLinearKernel for Fp8LinearMethod\n"
    checks = {c.name: c for c in judge(scan(good.encode(), rules, ()), rules)}
    assert checks["expect:cutlass-selected"].status is Status.PASS
    assert checks["forbid:no-flashinfer-fp8"].status is Status.PASS
    checks = {c.name: c for c in judge(scan(b"env set, nothing logged\n", rules, ()), rules)}
    assert checks["expect:cutlass-selected"].status is Status.FAIL


@pytest.mark.parametrize(
    ("facts", "gate"),
    [
        (Facts(serve=True, arch="sm120", flashinfer="0.6.18.post1", cudnn=92000), True),
        (Facts(serve=True, arch="sm121", flashinfer="0.6.18.post1", cudnn=None), True),  # unknown cuDNN
        (Facts(serve=True, arch="sm120", flashinfer="0.6.18.post1", cudnn=92301), False),  # override_shape available
        (Facts(serve=True, arch="sm120", flashinfer="0.6.16.post3", cudnn=92000), False),  # no gate in that release
        (Facts(serve=True, arch="sm90", flashinfer="0.6.18.post1", cudnn=91900), False),
        (Facts(serve=False, arch="sm120", flashinfer="0.6.18.post1", cudnn=92000), False),
    ],
)
def test_builtin_rule_sets_are_selected_by_conditions(facts: Facts, gate: bool) -> None:
    ids = {r.id for r in rules_for(None, None, facts)}
    assert ("cudnn-gated-out-on-sm12x" in ids) is gate
    assert ("startup-complete" in ids) is facts.serve
    gated = next((r for r in rules_for(None, None, facts) if r.id == "cudnn-gated-out-on-sm12x"), None)
    assert gated is None or gated.if_absent == "inconclusive"


# -- scanning engines and loading --------------------------------------------------------------------


def test_pure_python_scan_equals_hyperscan_scan(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    text = (CPU_LOG.read_text() + "".join(SAMPLES.values())) * 3
    rules = rules_for(None, None, Facts(serve=True, arch=""))
    fast = scan(text.encode(), rules, load_catalog())
    monkeypatch.setenv("STACKPROOF_NO_HYPERSCAN", "1")
    logscan._hyperscan_database.cache_clear()
    try:
        slow = scan(text.encode(), rules, load_catalog())
    finally:
        logscan._hyperscan_database.cache_clear()
    assert fast == slow and len(fast) > 3 * len(SAMPLES)
    log = tmp_path / "x.log"
    log.write_text(text)
    with open_log(log) as mapped:
        assert scan(mapped, rules, load_catalog()) == fast  # the mmap path gives the same lines


def test_catalog_errors_are_located(tmp_path: Path) -> None:
    bad = tmp_path / "signatures.yaml"
    bad.write_text(
        "schema_version: 1\nsignatures:\n  - id: x\n    title: t\n    severity: fatal\n    source: server\n"
        "    match: '('\n    what: w\n    workaround: w\n    refs: [vllm#1]\n    colour: red\n"
    )
    with pytest.raises(MatrixError) as info:
        load_catalog(bad)
    text = "\n".join(info.value.problems)
    assert f"{bad}:5: signatures[0].severity: must be fail or warn, got 'fatal'" in text
    assert f"{bad}:7: signatures[0].match: not a valid regular expression" in text
    assert f"{bad}:10: signatures[0].refs[0]: 'vllm#1' is not an upstream reference written as owner/repo#N" in text
    assert f"{bad}:11: signatures[0].colour: unknown key" in text


def test_builtin_rulesets_load() -> None:
    assert [r.id for r in load_rulesets()] == [
        "vllm-server",
        "sglang-server",
        "flashinfer-sm12x-cudnn-gate",
        "vllm-flashinfer-kernels",
    ]


# vLLM 0.33.0's two warnings, verbatim (vllm/utils/flashinfer.py:99-104 and :143-149 @0.33.0, the
# second with the values a 0.7.4 python next to a 0.6.13 cubin gives).
KERNELS_DISABLED = (
    "FlashInfer kernels are disabled: flashinfer-cubin is not installed and nvcc (CUDA_HOME, CUDA_PATH, "
    "PATH or /usr/local/cuda) or ninja (PATH) is missing. Set CUDA_HOME to a CUDA toolkit and put ninja on "
    "PATH, or run `vllm download-kernels`."
)
KERNELS_MISSING = (
    "FlashInfer's precompiled kernels are missing or do not match flashinfer-python 0.7.4 (flashinfer-cubin "
    "0.6.13, flashinfer-jit-cache not installed). FlashInfer then downloads and compiles kernels at startup, "
    "which can take several minutes, or fails to import mismatched ones. Run `vllm download-kernels` in this "
    "Python environment to install them."
)
VLLM_033 = Facts(serve=True, arch="sm120", engine="vllm", engine_version="0.33.0")


@pytest.mark.parametrize("line", [KERNELS_DISABLED, KERNELS_MISSING])
def test_vllm_033_kernel_warnings_fail_a_cell(line: str) -> None:
    rules = rules_for(None, None, VLLM_033)
    text = f"{API} WARNING 12-02 13:00:00 [flashinfer.py:100] {line}\n{API} INFO Application startup complete.\n"
    checks = {c.name: c for c in judge(scan(text.encode(), rules, ()), rules)}
    failed = [name for name, c in checks.items() if c.status is Status.FAIL]
    assert len(failed) == 1 and failed[0].startswith("forbid:flashinfer-")


def test_vllm_033_clean_start_passes_the_kernel_rules() -> None:
    rules = rules_for(None, None, VLLM_033)
    text = f"{API} INFO 12-02 13:00:00 [api_server.py:1] Application startup complete.\n"
    checks = {c.name: c for c in judge(scan(text.encode(), rules, ()), rules)}
    assert checks["forbid:flashinfer-kernels-disabled"].status is Status.PASS
    assert checks["forbid:flashinfer-precompiled-kernels-missing"].status is Status.PASS


@pytest.mark.parametrize(
    ("facts", "selected"),
    [
        (VLLM_033, True),
        (Facts(serve=True, arch="sm120", engine="vllm", engine_version="0.33.1"), True),
        (Facts(serve=True, arch="sm120", engine="vllm", engine_version=None), True),  # unknown: applies
        (Facts(serve=True, arch="sm120", engine="vllm", engine_version="0.28.0"), False),  # neither text exists
        (Facts(serve=True, arch="sm120", engine="sglang", engine_version="0.5.18"), False),
        (Facts(serve=False, arch="none", engine="vllm", engine_version="0.33.0"), False),
    ],
)
def test_vllm_kernel_rules_are_keyed_by_the_engine_version(facts: Facts, selected: bool) -> None:
    ids = {r.id for r in rules_for(None, None, facts)}
    assert ("flashinfer-kernels-disabled" in ids) is selected
    assert ("flashinfer-precompiled-kernels-missing" in ids) is selected


def test_an_engine_version_condition_must_be_a_specifier(tmp_path: Path) -> None:
    bad = tmp_path / "logrules.yaml"
    bad.write_text(
        "schema_version: 1\nrulesets:\n  - id: x\n    when: {engine_version: 'not a spec'}\n"
        "    rules:\n      - {id: y, forbid: z}\n"
    )
    with pytest.raises(MatrixError) as info:
        load_rulesets(bad)
    assert "when.engine_version: not a version specifier" in "\n".join(info.value.problems)


# -- the live watcher and the readiness wait ---------------------------------------------------------


def test_watcher_remembers_the_first_fatal_line_only() -> None:
    watcher = LogWatcher(load_catalog())
    for line in SAMPLES["flashinfer-autotune-no-tuned-config"].splitlines():  # a warning: not fatal
        watcher.feed(line)
    assert watcher.fatal is None
    for line in SAMPLES["ple-offload-engine-init"].splitlines():
        watcher.feed(line)
    assert watcher.fatal is not None and watcher.fatal.id == "ple-offload-engine-init" and watcher.fatal.line_no == 2
    watcher.feed(SAMPLES["cuda-illegal-memory-access"])
    assert watcher.fatal.id == "ple-offload-engine-init"


def test_a_fatal_signature_ends_the_readiness_wait_while_the_container_runs(real_matrix, tmp_path: Path) -> None:
    from tests.unit.fake_docker import RecordingDocker
    from verify.stages.server import Server, ServerFailed

    watcher = LogWatcher(load_catalog())
    server = Server(
        RecordingDocker(stdout="running 0"),  # the container runs forever
        real_matrix.cell("cpu-tiny"),
        "img",
        out_dir=tmp_path,  # type: ignore[arg-type]
        watcher=watcher,
        port=9,
    )
    watcher.feed(SAMPLES["cuda-illegal-memory-access"].strip())
    with pytest.raises(ServerFailed) as info:
        server.wait_ready(timeout=300)
    assert "failure signature cuda-illegal-memory-access" in info.value.reason
    assert isinstance(info.value, CheckFailed)


# -- inspect log -------------------------------------------------------------------------------------


def test_inspect_log_names_the_class_not_an_unshown_incident(tmp_path: Path, capsys) -> None:
    # An illegal memory access appended to the real CPU log: the class, its line, no SM120 incident
    # (the log shows no SM12x and no FP8 kernel), at most the conditional hint.
    log = tmp_path / "server.log"
    log.write_bytes(CPU_LOG.read_bytes() + SAMPLES["cuda-illegal-memory-access"].encode())
    assert main(["inspect", "log", str(log), "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    diagnosis = document["diagnosis"]
    assert diagnosis["class"]["id"] == "illegal-memory-access" and diagnosis["class"]["line"] == 97
    assert diagnosis["class"]["process"] == "EngineCore" and document["verdict"] == "failed"
    # Nothing of SM12x or FP8 is shown and nothing contradicts it: a candidate (issue 44), never the incident.
    assert diagnosis["incident"] is None and [c["id"] for c in diagnosis["candidates"]] == [
        "cuda-illegal-memory-access"
    ]
    assert not [m for m in document["matches"] if m["kind"] in ("signature", "incident")]


def test_inspect_log_applies_forbid_rules_with_a_cell_only(tmp_path: Path, capsys) -> None:
    assert main(["inspect", "log", str(CPU_LOG)]) == 0
    log = tmp_path / "server.log"
    log.write_bytes(CPU_LOG.read_bytes() + f"{API} Traceback (most recent call last):\n".encode())
    assert main(["inspect", "log", str(log)]) == 1  # a bare traceback: the python-exception class
    out = capsys.readouterr().out
    assert "python-exception" in out and "forbid:no-traceback" not in out
    assert main(["inspect", "log", str(log), "--cell", "cpu-tiny"]) == 1
    assert "FAIL         forbid:no-traceback" in capsys.readouterr().out


def test_inspect_log_of_a_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    assert main(["inspect", "log", str(tmp_path / "nope.log")]) == 2
