"""The preflight rules (pipeline/host/preflight_rules.yaml) both ways on recorded host facts, their
loader's located errors, the probe's new host facts on a fake /proc, and `doctor --cell` on the
recorded GB10 facts. The H200's limits are measured there (and match NVIDIA's Hopper guide); GB10's and
RTX PRO 6000's from the seed text (tests/fixtures/host-limits/README.md)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline.errors import MatrixError
from pipeline.host.geometry import HostFingerprint, flatten_limits
from pipeline.host.rules import CellFacts, HostLimits, cell_facts, judge_rules, load_rules
from pipeline.result import Status
from stackproof.cli import main

REPO = Path(__file__).resolve().parents[2]
LIMITS = REPO / "tests" / "fixtures" / "host-limits"
GIB = 1024**3
sys.path.insert(0, str(REPO / "verify" / "probes"))
import doctor_probe  # noqa: E402  (the stdlib-only script, imported as the doctor runs it)


def recorded(name: str) -> HostLimits:
    return HostLimits.from_doctor(json.loads((LIMITS / f"{name}.json").read_text()), name)


def cell(**changes: Any) -> CellFacts:
    base = CellFacts(id="c", runtime="host", arch="sm121", architecture="LlamaForCausalLM", args=(), env=())
    return dataclasses.replace(base, **changes)


def verdict(rule_id: str, facts: CellFacts, host: HostLimits) -> Any:
    (rule,) = [r for r in load_rules() if r.id == rule_id]
    return judge_rules([rule], facts, host)[0]


# -- the catalog ------------------------------------------------------------------------------------


def test_the_five_incidents_are_the_first_rules_each_citing_its_incident() -> None:
    rules = {r.id: r for r in load_rules()}
    assert {r.incident for r in rules.values()} == {
        "vllm-project/vllm#55872",
        "vllm-project/vllm#53748",
        "vllm-project/vllm#49476",
        "vllm-project/vllm#53960",
        "flashinfer-ai/flashinfer#4549",
    }
    assert all(r.upstream for r in rules.values())
    assert rules["mla-fp8-kv-decode-shared-memory"].fixed_by == "vllm-project/vllm#54013"
    assert rules["cutlass-fp4-per-call-workspace"].severity == "warn"  # WARN only: churn, not a crash


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("    severity: warn\n", "    severity: loud\n", ":25: rules[0].severity: must be one of warn, fail"),
        ("vllm-project/vllm#55872\n", "vllm#55872\n", ":26: rules[0].incident: must be owner/repo#N"),
        ("shared_memory_per_sm: {lt", "shared_memory_per_sn: {lt", ":51: rules[0].host.shared_memory_per_sn: unknown"),
        ("{lt: 131072}", "{below: 131072}", ":51: rules[0].host.shared_memory_per_sm: must be one test"),
        ("    what: >-\n      A graph", "    wat: >-\n      A graph", ":30: rules[0].wat: unknown key"),
    ],
)
def test_a_broken_rule_is_a_located_error(tmp_path: Path, old: str, new: str, message: str) -> None:
    text = (REPO / "pipeline" / "host" / "preflight_rules.yaml").read_text()
    assert old in text
    file = tmp_path / "preflight_rules.yaml"
    file.write_text(text.replace(old, new, 1))
    with pytest.raises(MatrixError) as info:
        load_rules(file)
    assert f"{file}{message}" in str(info.value)


# -- each rule both ways ------------------------------------------------------------------------------


def test_gb10_graph_safe_topk_warns_on_gb10_and_passes_on_the_h200() -> None:
    topk = cell(args=("--dsa-topk-backend", "flashinfer"))
    bad = verdict("gb10-graph-safe-topk-shared-memory", topk, recorded("gb10"))
    assert bad.status == Status.WARN
    assert "vllm-project/vllm#55872" in bad.message and "Drop --dsa-topk-backend flashinfer" in bad.message
    assert bad.evidence["facts"] == {"shared_memory_per_sm": 102400}
    assert verdict("gb10-graph-safe-topk-shared-memory", topk, recorded("h200")).status == Status.PASS
    # A cell that asks for no TopK is not the incident's, on GB10 too.
    assert verdict("gb10-graph-safe-topk-shared-memory", cell(), recorded("gb10")).status == Status.SKIP


@pytest.mark.parametrize(
    "facts",
    [
        # The FlashInfer sampler samples with flashinfer.sampling.*, not FilteredTopK (the rule's old guess).
        {"env": (("VLLM_USE_FLASHINFER_SAMPLER", "1"),)},
        # vLLM 0.34.0's sparse-indexer FlashInfer backend: no dsa_graph_safe, no tie-break, so it falls back.
        {"args": ("--sparse-indexer-topk-backend", "flashinfer")},
        # A DeepSeek V3.2 model on the default DSA TopK backend (vLLM's own kernels).
        {"architecture": "DeepseekV32ForCausalLM", "model_type": "deepseek_v32"},
        {"args": ("--dsa-topk-backend", "sgl-kernel")},
    ],
)
def test_what_does_not_ask_for_filtered_topk_is_not_the_gb10_incident(facts: dict[str, Any]) -> None:
    assert verdict("gb10-graph-safe-topk-shared-memory", cell(**facts), recorded("gb10")).status == Status.SKIP


def test_mla_fp8_kv_fails_on_sm12x_opt_in_and_passes_on_the_h200() -> None:
    mla = cell(architecture="DeepseekV3ForCausalLM", model_type="deepseek_v3", args=("--kv-cache-dtype", "fp8"))
    for host in ("rtx-pro-6000", "gb10"):
        bad = verdict("mla-fp8-kv-decode-shared-memory", mla, recorded(host))
        assert bad.status == Status.FAIL, host
        assert "vllm-project/vllm#53748" in bad.message and "vllm-project/vllm#54013" in bad.message
    assert verdict("mla-fp8-kv-decode-shared-memory", mla, recorded("h200")).status == Status.PASS
    bf16 = dataclasses.replace(mla, args=("--kv-cache-dtype", "auto"))
    assert verdict("mla-fp8-kv-decode-shared-memory", bf16, recorded("rtx-pro-6000")).status == Status.SKIP


@pytest.mark.parametrize(
    ("architecture", "model_type", "status"),
    [
        # MLA by vLLM's model_type list, whatever the class is called (Kimi K2 ships DeepseekV3's class).
        ("DeepseekV3ForCausalLM", "kimi_k2", Status.FAIL),
        ("Glm4MoeLiteForCausalLM", "glm4_moe_lite", Status.FAIL),
        ("GlmMoeDsaForCausalLM", "glm_moe_dsa", Status.FAIL),
        # Not MLA in vLLM: the old rule's MiniCPM3 guess, and a plain GQA model.
        ("MiniCPM3ForCausalLM", "minicpm3", Status.SKIP),
        ("LlamaForCausalLM", "llama", Status.SKIP),
    ],
)
def test_mla_rule_keys_on_vllms_mla_model_types(architecture: str, model_type: str, status: Status) -> None:
    facts = cell(architecture=architecture, model_type=model_type, args=("--kv-cache-dtype", "fp8_e4m3"))
    assert verdict("mla-fp8-kv-decode-shared-memory", facts, recorded("gb10")).status == status


def test_mla_rule_with_an_unknown_model_type_warns_unknown_never_passes_silently() -> None:
    unknown = cell(architecture=None, args=("--kv-cache-dtype=fp8",))
    item = verdict("mla-fp8-kv-decode-shared-memory", unknown, recorded("rtx-pro-6000"))
    assert item.status == Status.WARN and item.message.startswith("unknown:")
    assert item.evidence["unknown"] == ["model_type"]


def test_b12x_reservation_fails_on_a_32_gib_card_and_passes_on_the_h200() -> None:
    b12x = cell(args=("--moe-backend", "b12x"))
    card = dataclasses.replace(recorded("rtx-pro-6000"), total_memory=32 * GIB)  # a 32 GiB card (constructed)
    bad = verdict("b12x-moe-reservation-exceeds-card", b12x, card)
    assert bad.status == Status.FAIL and "vllm-project/vllm#49476" in bad.message and "marlin" in bad.message
    assert verdict("b12x-moe-reservation-exceeds-card", b12x, recorded("h200")).status == Status.PASS
    # GB10's memory is not in the seed text: unknown, a WARN.
    assert verdict("b12x-moe-reservation-exceeds-card", b12x, recorded("gb10")).status == Status.WARN


def test_ple_offload_at_tp1_needs_ptrace_both_ways() -> None:
    ple = cell(env=(("VLLM_PLE_CPU_OFFLOAD", "1"),))
    free = dataclasses.replace(recorded("h200"), ptrace_scope=0, yama=True, in_container=False)
    yama1 = dataclasses.replace(free, ptrace_scope=1)
    bad = verdict("ple-offload-tp1-needs-ptrace", ple, yama1)
    assert bad.status == Status.FAIL and "ptrace_scope=0" in bad.message and "vllm-project/vllm#53960" in bad.message
    assert verdict("ple-offload-tp1-needs-ptrace", ple, free).status == Status.PASS
    no_yama = dataclasses.replace(free, ptrace_scope=None, yama=False)  # absent file: no Yama
    assert verdict("ple-offload-tp1-needs-ptrace", ple, no_yama).status == Status.PASS
    # A docker cell: its server gets docker's default capabilities, no SYS_PTRACE.
    docker = dataclasses.replace(ple, runtime="docker")
    bad = verdict("ple-offload-tp1-needs-ptrace", docker, free)
    assert bad.status == Status.FAIL and "--cap-add=SYS_PTRACE" in bad.message
    inside = dataclasses.replace(free, in_container=True, capabilities=("CHOWN", "SYS_PTRACE"))
    assert verdict("ple-offload-tp1-needs-ptrace", docker, inside).status == Status.PASS
    # TP=2 is not the incident's, in either spelling; TP=1 spelt short is.
    tp2 = dataclasses.replace(ple, args=("--tensor-parallel-size", "2"))
    assert verdict("ple-offload-tp1-needs-ptrace", tp2, yama1).status == Status.SKIP
    tp2_short = dataclasses.replace(ple, args=("-tp", "2"))
    assert verdict("ple-offload-tp1-needs-ptrace", tp2_short, yama1).status == Status.SKIP
    tp1_short = dataclasses.replace(ple, args=("-tp", "1"))
    assert verdict("ple-offload-tp1-needs-ptrace", tp1_short, yama1).status == Status.FAIL
    # Without the variable (or with it off) there is no offload worker to attach to.
    for env in ((), (("VLLM_PLE_CPU_OFFLOAD", "0"),)):
        off = dataclasses.replace(ple, env=env)
        assert verdict("ple-offload-tp1-needs-ptrace", off, yama1).status == Status.SKIP


def test_cutlass_fp4_workspace_warns_on_sm120_and_passes_on_the_h200() -> None:
    fp4 = cell(arch="sm120", args=("--quantization", "modelopt_fp4"))
    bad = verdict("cutlass-fp4-per-call-workspace", fp4, recorded("rtx-pro-6000"))
    assert bad.status == Status.WARN and "flashinfer-ai/flashinfer#4549" in bad.message
    assert verdict("cutlass-fp4-per-call-workspace", fp4, recorded("h200")).status == Status.PASS
    assert verdict("cutlass-fp4-per-call-workspace", cell(arch="sm90"), recorded("h200")).status == Status.SKIP


def test_fixed_in_rules_a_rule_out(tmp_path: Path) -> None:
    text = (REPO / "pipeline" / "host" / "preflight_rules.yaml").read_text()
    file = tmp_path / "rules.yaml"
    file.write_text(text.replace("    fixed_by: vllm-project/vllm#54013\n", "    fixed_in: {vllm: 0.30.0}\n"))
    (rule,) = [r for r in load_rules(file) if r.id == "mla-fp8-kv-decode-shared-memory"]
    mla = cell(architecture="DeepseekV3ForCausalLM", model_type="deepseek_v3", args=("--kv-cache-dtype", "fp8"))
    assert judge_rules([rule], mla, recorded("gb10"))[0].status == Status.FAIL
    fixed = dataclasses.replace(mla, versions=(("vllm", "0.30.1"),))
    assert judge_rules([rule], fixed, recorded("gb10"))[0].status == Status.SKIP


# -- the cell's facts -----------------------------------------------------------------------------------


def test_cell_facts_read_the_architecture_from_a_local_models_config(tmp_path: Path) -> None:
    from pipeline.matrix.read import load_matrix

    model = tmp_path / "model"
    model.mkdir()
    config = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "kv_lora_rank": 512}
    (model / "config.json").write_text(json.dumps(config))
    matrix_file = tmp_path / "matrix.yaml"
    matrix_file.write_text(gb10_matrix(f"path:{model}"))
    facts = cell_facts(load_matrix(matrix_file).cell("sm121-topk"))
    assert facts.architecture == "DeepseekV3ForCausalLM" and facts.model_type == "kimi_k2"
    assert facts.value("env:VLLM_USE_FLASHINFER_SAMPLER") == "1"
    assert facts.value("arg:--kv-cache-dtype") == "fp8"


# -- the probe's new facts ---------------------------------------------------------------------------------


def test_probe_security_facts_decode_capeff_and_seccomp(tmp_path: Path) -> None:
    (tmp_path / "self").mkdir()
    # docker's default set: no SYS_PTRACE (bit 19), seccomp filter
    (tmp_path / "self" / "status").write_text("Name:\tpython3\nCapEff:\t00000000a80425fb\nSeccomp:\t2\n")
    facts = doctor_probe.security_facts(tmp_path)
    assert facts["ptrace_scope"] is None and facts["yama"] is False  # no Yama file
    assert "SYS_PTRACE" not in facts["capabilities"] and "NET_BIND_SERVICE" in facts["capabilities"]
    assert facts["seccomp"] == "filter"
    (tmp_path / "sys" / "kernel" / "yama").mkdir(parents=True)
    (tmp_path / "sys" / "kernel" / "yama" / "ptrace_scope").write_text("1\n")
    assert doctor_probe.security_facts(tmp_path)["ptrace_scope"] == 1
    assert "SYS_PTRACE" in doctor_probe.decode_capabilities(f"{1 << 19:x}")


def test_probe_without_a_driver_says_why() -> None:
    facts = doctor_probe.cuda_device_facts("libcuda-not-here.so.1")
    assert facts["devices"] == [] and facts["error"].startswith("no libcuda")


def test_limits_go_into_the_receipts_host_and_back() -> None:
    import jsonschema

    flat = flatten_limits(json.loads((LIMITS / "gb10.json").read_text()))
    assert flat["shared_memory_per_sm"] == 102400 and flat["integrated"] is True
    host = HostFingerprint(arch="aarch64", kernel="", os="", docker="none", gpus=(), driver="none",
                           cuda_driver="none", limits=flat)  # fmt: skip
    again = HostFingerprint.parse(json.loads(json.dumps(host.to_json())))
    assert again.limits == flat and again.key == host.key  # the key is unchanged by the limits
    schema = json.loads((REPO / "docs" / "receipt.schema.json").read_text())
    jsonschema.validate(host.to_json(), schema["properties"]["host"])
    assert HostLimits.from_record(flat).shared_memory_per_block_optin == 101376


# -- doctor --cell on the recorded GB10 facts -------------------------------------------------------------


def gb10_matrix(model: str) -> str:
    return f"""schema_version: 1
indexes:
  pypi: {{url: "https://pypi.org/simple"}}
bases:
  vllm-openai-0.28.0:
    image: "vllm/vllm-openai:v0.28.0"
    python: python3
    platforms: [linux/arm64]
cells:
  - id: sm121-topk
    base: vllm-openai-0.28.0
    platform: linux/arm64
    arch: sm121
    runner: [self-hosted, linux, arm64, gpu, sm121]
    serve:
      model: {{source: "{model}"}}
      args: [--kv-cache-dtype, fp8, --dsa-topk-backend, flashinfer]
      env: {{VLLM_USE_FLASHINFER_SAMPLER: "1"}}
      gpus: all
"""


def test_doctor_cell_on_recorded_gb10_facts_warns_naming_the_incident(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    matrix_file = tmp_path / "matrix.yaml"
    matrix_file.write_text(gb10_matrix("path:/models/not-here"))
    args = ["doctor", "--input", str(LIMITS / "gb10.json"), "--cell", "sm121-topk", "--matrix", str(matrix_file)]
    assert main([*args, "--json"]) == 0
    items = {i["name"]: i for i in json.loads(capsys.readouterr().out)["doctor"]["preflight"]["items"]}
    topk = items["rule:gb10-graph-safe-topk-shared-memory"]
    assert topk["status"] == "WARN" and "vllm-project/vllm#55872" in topk["message"]
    assert "--dsa-topk-backend flashinfer" in topk["message"]
    # The MLA rule cannot know the architecture (no config.json here): a WARN saying so.
    assert items["rule:mla-fp8-kv-decode-shared-memory"]["status"] == "WARN"
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "preflight WARN  rule:gb10-graph-safe-topk-shared-memory" in text


def test_ple_rule_on_the_h200s_measured_container_facts_passes() -> None:
    # Measured there: no Yama file, SYS_PTRACE in CapEff, in a container.
    h200 = recorded("h200")
    assert h200.yama is False and h200.capabilities is not None and "SYS_PTRACE" in h200.capabilities
    ple = cell(runtime="docker", env=(("VLLM_PLE_CPU_OFFLOAD", "1"),))
    assert verdict("ple-offload-tp1-needs-ptrace", ple, h200).status == Status.PASS


def test_the_pre_run_preflight_judges_the_rules_where_limits_were_gathered(tmp_path: Path) -> None:
    from pipeline.host.facts import PreflightFacts
    from pipeline.host.preflight import judge_host_preflight, judge_preflight
    from pipeline.matrix.read import load_matrix

    matrix_file = tmp_path / "matrix.yaml"
    matrix_file.write_text(gb10_matrix("path:/models/not-here"))
    the_cell = load_matrix(matrix_file).cell("sm121-topk")
    recorded_facts = json.loads((REPO / "tests" / "fixtures" / "preflight" / "doctor-sm120-json.stdout").read_text())
    facts = PreflightFacts.parse(recorded_facts["doctor"]["preflight"]["facts"])
    assert not [i for i in judge_preflight(the_cell, facts) if i.name.startswith("rule:")]  # not gathered: none
    gb10 = flatten_limits(json.loads((LIMITS / "gb10.json").read_text()))
    with_limits = PreflightFacts.parse({**facts.to_json(), "host_limits": gb10, "model_architecture": None})
    for items in (judge_preflight(the_cell, with_limits), judge_host_preflight(the_cell, with_limits)):
        rules = {i.name: i.status for i in items if i.name.startswith("rule:")}
        assert rules["rule:gb10-graph-safe-topk-shared-memory"] == Status.WARN
        assert len(rules) == 5


def test_doctor_prints_the_limits_and_receipts_compare_them(capsys: pytest.CaptureFixture[str]) -> None:
    from pipeline.host.geometry import differences

    assert main(["doctor", "--input", str(LIMITS / "h200.json"), "--matrix", str(REPO / "matrix.yaml")]) == 0
    text = capsys.readouterr().out
    assert "limits: shared memory 233472 B/SM, opt-in 232448 B/block, 132 SMs" in text
    assert "no Yama, SYS_PTRACE, seccomp disabled" in text
    h200 = HostFingerprint.parse({"limits": flatten_limits(json.loads((LIMITS / "h200.json").read_text()))})
    gb10 = HostFingerprint.parse({"limits": flatten_limits(json.loads((LIMITS / "gb10.json").read_text()))})
    assert "shared memory per sm 233472 vs 102400" in differences(h200, gb10)
    assert differences(h200, HostFingerprint.parse({})) == []  # a receipt without limits compares as before


def test_the_probe_script_run_on_the_h200_gives_the_recorded_limits() -> None:
    """`python3 verify/probes/doctor_probe.py` itself, run on the H200 (h200-doctor-probe.json), against the
    values recorded there through the same driver calls inline (h200.json): equal, and so every
    rule judges both the same."""
    probed = json.loads((LIMITS / "h200-doctor-probe.json").read_text())
    inline = json.loads((LIMITS / "h200.json").read_text())
    assert probed["cuda_devices"]["source"] == "cuda-driver"
    assert probed["cuda_devices"]["devices"] == inline["cuda_devices"]["devices"]
    [device] = probed["cuda_devices"]["devices"]
    assert (device["shared_memory_per_sm"], device["shared_memory_per_block_optin"], device["sm_count"]) == (
        233472,
        232448,
        132,
    )
    assert probed["cuda_devices"]["torch"]["devices"][0]["shared_memory_per_sm"] == 233472  # torch agrees
    assert probed["security"]["yama"] is False and probed["security"]["seccomp"] == "disabled"
    a, b = recorded("h200-doctor-probe"), recorded("h200")
    for rule in load_rules():
        for facts in (cell(arch="sm90"), cell(arch="sm90", args=("--kv-cache-dtype", "fp8"))):
            assert verdict(rule.id, facts, a).status == verdict(rule.id, facts, b).status, rule.id


def test_preflight_facts_keep_the_model_type_for_the_mla_rule(tmp_path: Path) -> None:
    from pipeline.host.facts import PreflightFacts
    from pipeline.host.preflight import judge_preflight
    from pipeline.matrix.read import load_matrix

    matrix_file = tmp_path / "matrix.yaml"
    matrix_file.write_text(gb10_matrix("path:/models/not-here"))
    sm121 = load_matrix(matrix_file).cell("sm121-topk")
    limits = flatten_limits(json.loads((LIMITS / "gb10.json").read_text()))
    base = {"machine": "aarch64", "host_limits": limits, "model_architecture": "DeepseekV3ForCausalLM"}
    for model_type, status in (("deepseek_v3", Status.FAIL), (None, Status.WARN), ("llama", Status.SKIP)):
        facts = PreflightFacts.parse(json.loads(json.dumps({**base, "model_type": model_type})))
        assert facts.model_type == model_type
        items = {i.name: i for i in judge_preflight(sm121, facts, docker_required=False)}
        assert items["rule:mla-fp8-kv-decode-shared-memory"].status == status, model_type
