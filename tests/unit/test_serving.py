"""The serving-engine seam: the driver table, version-keyed facts, launch argv, `serve.engine` in the
matrix, and the load run through a toy third engine's dialect (a fake server: not an integration test).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.matrix.model import SERVING_ENGINES, LoadSpec, Matrix
from pipeline.result import Status
from verify.load.outcome import LoadTarget
from verify.load.progress import parse_metrics
from verify.load.run import run_load
from verify.load.summary import judge_load, summarise
from verify.logs.catalog import Facts, rules_for
from verify.serving import DRIVERS, Since, at_version, driver_for
from verify.stages.autotune import judge_fresh_cache
from verify.stages.server import serve_argv
from verify.stages.serverplan import CACHE_MOUNT

from .conftest import Invalid
from .fake_openai import FakeServer
from .toy_engine import TOY

REPO = Path(__file__).resolve().parents[2]
VLLM, SGLANG = DRIVERS["vllm"], DRIVERS["sglang"]
SHORT = LoadSpec(questions=4, concurrency=2, max_tokens=8, determinism_prompts=2, determinism_repeats=1)


def test_the_matrix_knows_exactly_the_engines_that_have_drivers() -> None:
    assert set(SERVING_ENGINES) == set(DRIVERS)
    for name, driver in DRIVERS.items():
        assert driver.name == name
        assert SERVING_ENGINES[name] == driver.imports, "the loader's default imports are the driver's"


@pytest.mark.parametrize("driver", list(DRIVERS.values()), ids=list(DRIVERS))
def test_every_driver_states_its_facts(driver: object) -> None:
    from verify.serving import ServingDriver

    assert isinstance(driver, ServingDriver)
    assert driver.distributions and driver.process_titles and driver.dead_markers and driver.metrics
    re.compile(driver.ready_line)
    names = driver.metric_names(None)
    assert names.generated.endswith("_total") and names.prompt.endswith("_total")
    assert all(n.startswith(f"{driver.name}:") for n in names.all()), "metric names carry the engine's prefix"


def test_facts_are_taken_at_the_version_in_force() -> None:
    facts = (Since(version="0.26.0", value="old", source="a"), Since(version="0.33.0", value="new", source="b"))
    assert [at_version(facts, v).value for v in ("0.26.0", "0.28.0+cpu", "0.32.9", "0.33.0", "0.33.0rc1", "1.0")] == [
        "old",
        "old",
        "old",
        "new",
        "new",
        "new",
    ]
    assert at_version(facts, "0.25.1") is None, "older than every entry: nothing is known"
    assert at_version(facts, None).value == "new" and at_version(facts, "not-a-version").value == "new"


def test_vllm_autotune_announcement_moved_in_0_33() -> None:
    """0.28 names the file; 0.33 appends a sentence (the old `\\S+` kept the dot), or names the managed root."""
    old, new = VLLM.autotune_at("0.28.0"), VLLM.autotune_at("0.33.0")
    assert old is not None and new is not None
    line_028 = "INFO Using FlashInfer autotune cache file: /c/abc/autotune_configs.json"
    line_033 = (
        "INFO Using FlashInfer autotune cache file: /c/autotune_configs_dp0_rank0.json. "
        "Pass --disable-flashinfer-autotune to skip autotuning."
    )
    managed = "INFO Using FlashInfer managed autotune cache (root=/c). Pass --disable-flashinfer-autotune ..."
    assert re.search(old.announcements[0], line_028).group("path") == "/c/abc/autotune_configs.json"
    assert re.search(new.announcements[0], line_033).group("path") == "/c/autotune_configs_dp0_rank0.json"
    assert re.search(new.announcements[1], managed).group("path") == "/c"
    assert re.search(new.announcements[0], line_028).group("path") == "/c/abc/autotune_configs.json"


def test_a_vllm_0_33_legacy_cache_is_found_where_0_28s_reading_missed_it(real_matrix: Matrix, tmp_path: Path) -> None:
    cell = real_matrix.cell("sm120-vllm-0.28.0-fi-0.6.18.post1-cu130")
    fixture = REPO / "tests" / "fixtures" / "autotune"
    source = next(fixture.rglob("*.json"))
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "autotune_configs_dp0_rank0.json").write_text(source.read_text())
    log = (
        f"INFO Using FlashInfer autotune cache file: {CACHE_MOUNT}/autotune_configs_dp0_rank0.json. "
        "Pass --disable-flashinfer-autotune to skip autotuning.\n"
    )

    def judged(version: str) -> Status:
        facts = Facts(serve=True, arch=cell.arch, engine_version=version)
        checks = judge_fresh_cache(cell, log, cache, tmp_path / version, facts=facts, env={})
        return next(c for c in checks if c.name == "autotune-cache").status

    (tmp_path / "0.33.0").mkdir()
    (tmp_path / "0.28.0").mkdir()
    assert judged("0.33.0") is not Status.INCONCLUSIVE, "0.33's facts find the per-rank file"
    assert judged("0.28.0") is Status.INCONCLUSIVE, "0.28's facts cannot (so the facts are what decides)"


def test_vllm_launch_is_what_it_always_was(real_matrix: Matrix) -> None:
    cell = real_matrix.cell("cpu-tiny")
    assert cell.serve is not None and cell.serve.engine == "vllm" and driver_for(cell.serve) is VLLM
    argv = serve_argv(cell.serve, None, 8123)
    assert argv[:6] == ["vllm", "serve", cell.serve.model.location, "--host", "127.0.0.1", "--port"]
    assert argv[6] == "8123" and argv[7:] == list(cell.serve.args)


def test_sglang_launch_names_the_model_path_and_turns_metrics_on_once(load: Callable[..., Matrix], header: str) -> None:
    matrix = load(
        header
        + """\
cells:
  - id: sg
    base: img
    platform: linux/amd64
    arch: sm120
    serve:
      engine: sglang
      model: {source: "hf:org/model", revision: "0123456789abcdef0123456789abcdef01234567"}
      args: [--tp, "1"]
  - id: sg-metrics-on
    extends: sg
    serve:
      engine: sglang
      model: {source: "hf:org/model", revision: "0123456789abcdef0123456789abcdef01234567"}
      args: [--enable-metrics]
"""
    )
    argv = serve_argv(matrix.cell("sg").serve, None, 30000)
    assert argv[:5] == ["python3", "-m", "sglang.launch_server", "--model-path", "org/model"]
    assert argv[argv.index("--revision") + 1] == "0123456789abcdef0123456789abcdef01234567"
    assert argv.count("--enable-metrics") == 1 and argv[-2:] == ["--tp", "1"]
    assert serve_argv(matrix.cell("sg-metrics-on").serve, None, 1).count("--enable-metrics") == 1
    assert matrix.cell("sg").imports == SGLANG.imports


def test_an_unknown_engine_is_a_located_error_with_a_did_you_mean(invalid: Callable[..., Invalid], header: str) -> None:
    bad = invalid(
        header
        + """\
cells:
  - id: sg
    base: img
    platform: linux/amd64
    arch: sm120
    serve:
      engine: sglan
      model: {source: "path:/m"}
"""
    )
    assert bad.problems == [
        f"{bad.at('engine: sglan')}: cells[0].serve.engine: unknown serving engine 'sglan', "
        "did you mean 'sglang'? (known: vllm, sglang)"
    ]


def test_the_vllm_rule_set_applies_to_vllm_cells_only(real_matrix: Matrix) -> None:
    cell = real_matrix.cell("cpu-tiny")
    vllm_rules = {r.id for r in rules_for(cell, None, Facts(serve=True, arch="none", engine="vllm"))}
    sglang_rules = {r.id for r in rules_for(cell, None, Facts(serve=True, arch="none", engine="sglang"))}
    assert "startup-complete" in vllm_rules and "startup-complete" not in sglang_rules
    assert "sglang-ready" in sglang_rules and "sglang-ready" not in vllm_rules


def test_the_real_vllm_metrics_through_the_driver() -> None:
    text = (REPO / "tests" / "fixtures" / "metrics" / "vllm-0.28.0-cpu-after-20-requests.txt").read_text()
    vllm = parse_metrics(text, VLLM.metric_names("0.28.0"))
    assert (vllm.steps, vllm.generated) == (166.0, 640.0)
    toy = parse_metrics(text, TOY.metric_names(None))
    assert (toy.steps, toy.generated) == (0.0, 0.0), "another engine's names read nothing from vLLM's text"


# -- a new engine is one file: the load through the toy engine's dialect --------------------------


def test_the_load_runs_through_a_third_engine_it_was_never_taught(tmp_path: Path) -> None:
    with FakeServer(driver=TOY) as fake:
        outcome = run_load(LoadTarget(base_url=fake.url, label="toy", driver=TOY), SHORT, tmp_path)
        assert fake.chat_requests and fake.completion_requests
    checks = {c.name: c for c in judge_load(outcome, summarise(outcome, SHORT), batch_invariant=False)}
    assert checks["questions"].status is Status.PASS
    assert checks["token-accounting"].status is Status.PASS, checks["token-accounting"].message
    assert "toy:out_tokens_total" in checks["token-accounting"].message
    assert checks["engine-progress"].status is Status.PASS


def test_the_same_load_with_the_wrong_dialect_fails(tmp_path: Path) -> None:
    """The toy server answers nothing on vLLM's paths: a vLLM-speaking load cannot pass against it."""
    from pipeline.errors import CheckFailed

    with FakeServer(driver=TOY) as fake, pytest.raises(CheckFailed, match="did not name a model"):
        run_load(LoadTarget(base_url=fake.url, label="toy", driver=VLLM), SHORT, tmp_path)


def test_a_dead_toy_engine_is_named_dead_by_its_own_marker(tmp_path: Path) -> None:
    with FakeServer(driver=TOY) as fake:
        fake.dead = True
        outcome = run_load(LoadTarget(base_url=fake.url, label="toy", driver=TOY), SHORT, tmp_path)
    assert any(e.type == "ENGINE_DEAD" for e in outcome.events)


# -- nothing outside the drivers names an engine's internals ----------------------------------------

# vLLM metric names, its variables, its process titles and its module paths (the list).
VLLM_FACTS = re.compile(r"vllm:[a-z]|VLLM_[A-Z]|VLLM::|EngineCore|vllm\.(entrypoints|v1|model_executor|envs)")
# Where vLLM's facts may be named: its driver; the stdlib probes run inside images, which cannot
# import the driver and record the variables they see; the log readers, which parse any vLLM log
# a user pastes (repro, diagnosis, the log-text prefixes); and the audit, which reads vLLM wheels.
ALLOWED = (
    "verify/serving/vllm.py",
    "verify/probes/inimage_probe.py",
    "verify/probes/doctor_probe.py",
    "verify/logs/logtext.py",
    "verify/logs/diagnosis.py",
    "verify/audit/",
    "stackproof/cli/repro.py",
)


def test_no_check_names_a_vllm_internal_outside_the_driver() -> None:
    offenders = [
        f"{name}:{number}: {line.strip()}"
        for name in _sources("verify", "stackproof")
        if not name.startswith(ALLOWED)
        for number, line in enumerate((REPO / name).read_text().splitlines(), start=1)
        if VLLM_FACTS.search(line)
    ]
    assert offenders == []


def test_only_the_client_module_imports_httpx() -> None:
    """One client talks to the server (openai.py); lanes.py is its connection pools, which only it uses."""
    importing = [
        name
        for name in _sources("verify")
        if re.search(r"^(import httpx|from httpx)", (REPO / name).read_text(), re.MULTILINE)
    ]
    assert importing == ["verify/serving/lanes.py", "verify/serving/openai.py"]
    users = [name for name in _sources("verify") if "verify.serving.lanes" in (REPO / name).read_text()]
    assert users == ["verify/serving/openai.py"]


def _sources(*roots: str) -> list[str]:
    return sorted(str(p.relative_to(REPO)) for root in roots for p in (REPO / root).rglob("*.py"))


def test_a_health_path_that_runs_the_engine_reads_a_stall_as_a_stall() -> None:
    """SGLang's /health generates a token: with the scheduler stopped it times out (or says 503) while
    /v1/models and /metrics answer. vLLM's /health does not touch the engine: a timeout there is the API's."""
    from verify.load.progress import Probe, StallVerdict, verdict_of

    wedged = Probe(health=None, models=200, metrics=200)
    assert verdict_of(wedged, health_runs_engine=SGLANG.health_runs_engine) is StallVerdict.ENGINE_STALL_API_ALIVE
    assert verdict_of(Probe(health=503, models=200, metrics=200), health_runs_engine=True) is (
        StallVerdict.ENGINE_STALL_API_ALIVE
    )
    assert verdict_of(wedged, health_runs_engine=VLLM.health_runs_engine) is StallVerdict.API_UNRESPONSIVE
    assert verdict_of(Probe(health=0, models=0, metrics=0), health_runs_engine=True) is StallVerdict.ENGINE_DEAD
    assert verdict_of(Probe(health=None, models=None, metrics=200), health_runs_engine=True) is (
        StallVerdict.API_UNRESPONSIVE
    )


# -- the SGLang driver against what a real SGLang 0.5.18 server printed and exported ---------------

SGLANG_RUNS = REPO / "tests" / "fixtures" / "logs" / "sglang-0.5.18-cpu"


def test_the_real_sglang_metrics_through_the_driver() -> None:
    """Five client requests between the scrapes: the usage blocks summed to prompt 57, completion 29;
    the forward passes are summed over cuda_graph_passes_total's modes (prefill 3->8, decode 10->39)."""
    fixtures = REPO / "tests" / "fixtures" / "metrics"
    names = SGLANG.metric_names("0.5.18")
    before = parse_metrics((fixtures / "sglang-0.5.18-cpu-before.txt").read_text(), names)
    after = parse_metrics((fixtures / "sglang-0.5.18-cpu-after-5-requests.txt").read_text(), names)
    assert (before.prompt, before.generated, before.steps) == (7.0, 8.0, 13.0), "the warm-up request counts"
    assert (after.prompt - before.prompt, after.generated - before.generated) == (57.0, 29.0)
    assert after.steps - before.steps == (8 - 3) + (39 - 10)
    assert after.tokens == 0.0 and names.step_tokens is None, "SGLang has no tokens-per-step counter"
    assert after.moved_since(before)
    vllm = parse_metrics((fixtures / "sglang-0.5.18-cpu-after-5-requests.txt").read_text(), VLLM.metric_names(None))
    assert (vllm.steps, vllm.generated, vllm.prompt) == (0.0, 0.0, 0.0), "vLLM's names read nothing from SGLang's text"


def test_sglang_facts_are_known_from_0_5_17_and_cited_per_release() -> None:
    assert "@0.5.17" in SGLANG.metric_names("0.5.17").source
    assert "@0.5.18" in SGLANG.metric_names("0.5.18").source
    assert "@0.5.18" in SGLANG.metric_names("0.5.19").source, "a later release keeps the newest facts"
    with pytest.raises(LookupError, match=r"SGLang 0\.5\.16"):
        SGLANG.metric_names("0.5.16")
    assert SGLANG.autotune_at("0.5.16") is None


def test_sglang_ready_line_and_dead_markers_on_real_logs() -> None:
    ready = re.compile(SGLANG.ready_line)

    def markers(name: str) -> list[str]:
        text = (SGLANG_RUNS / name).read_text()
        return [m for m in SGLANG.dead_markers if m in text]

    for name in ("scheduler-sigkill.log", "scheduler-exception.log", "scheduler-hung.log"):
        assert ready.search((SGLANG_RUNS / name).read_text()), f"{name}: the server was ready first"
    assert "crashed with exit code" in markers("scheduler-sigkill.log")
    assert "Scheduler hit an exception" in markers("scheduler-exception.log")
    assert markers("scheduler-hung.log") == [], "a hung scheduler is a stall, not a dead engine"
    assert not ready.search("The server is fired up")  # the whole line, not a prefix


def test_the_sglang_rule_set_on_real_logs(real_matrix: Matrix) -> None:
    from verify.logs.catalog import load_catalog
    from verify.logs.logscan import judge, scan

    cell = real_matrix.cell("sglang-cpu-tiny")
    rules = rules_for(cell, None, Facts(serve=True, arch="none", engine="sglang"))
    ids = {r.id for r in rules}
    assert {"sglang-ready", "no-traceback", "weights-loaded", "kv-cache", "startup-timings", "cpu-engine"} <= ids
    assert "startup-complete" not in ids, "vLLM's rules do not apply"

    def verdicts(name: str) -> dict[str, object]:
        data = (SGLANG_RUNS / name).read_bytes()
        checks = judge(scan(data, rules, load_catalog()), rules)
        return {c.name: c for c in checks}

    clean = verdicts("scheduler-sigkill.log")  # a clean start; the kill came after
    assert clean["expect:sglang-ready"].status is Status.PASS
    assert clean["expect:cpu-engine"].status is Status.PASS
    assert clean["forbid:no-traceback"].status is Status.PASS
    assert clean["forbid:no-kernel-stand-in-called"].status is Status.PASS
    captured = clean["evidence"].evidence
    assert captured["weights-loaded"][0]["architecture"] == "LlamaForCausalLM"
    assert captured["kv-cache"][0] == {"dtype": "torch.bfloat16", "tokens": "4096"}
    assert captured["startup-timings"][0]["tokenizer_e2e"] == "10.55"
    assert verdicts("scheduler-exception.log")["forbid:no-traceback"].status is Status.FAIL
    # On a busy host the memory measured around the load can grow: SGLang then prints a negative usage.
    freed = b"[t] Load weight end. elapsed=0.06 s, type=LlamaForCausalLM, avail mem=19.57 GB, mem usage=-0.00 GB.\n"
    captured_freed = {c.name: c for c in judge(scan(freed, rules, ()), rules)}["evidence"].evidence
    expected = {"seconds": "0.06", "architecture": "LlamaForCausalLM", "mem_gb": "-0.00"}
    assert captured_freed["weights-loaded"] == [expected]
    stand_in_used = b"[x] sgl_kernel stand-in: copy_all_layer_kv_cache_cpu called; this image has no kernel package\n"
    checks = {c.name: c for c in judge(scan(stand_in_used, rules, ()), rules)}
    assert checks["forbid:no-kernel-stand-in-called"].status is Status.FAIL
    assert checks["expect:sglang-ready"].status is Status.FAIL


def test_sglang_autotune_cache_is_found_where_sglang_writes_it(
    load: Callable[..., Matrix], header: str, tmp_path: Path
) -> None:
    """Read from the source only (no GPU run of SGLang here): the announcement names a file under
    $SGLANG_CACHE_DIR/flashinfer/autotune/<fi>/<arch>/<key>/; the stage finds it, and only there."""
    matrix = load(
        header
        + """\
cells:
  - id: sg
    base: img
    platform: linux/amd64
    arch: sm120
    serve:
      engine: sglang
      model: {source: "path:/m"}
"""
    )
    cell = matrix.cell("sg")
    facts_at = SGLANG.autotune_at("0.5.18")
    assert facts_at is not None and facts_at.cache_env == "SGLANG_CACHE_DIR"
    source = next((REPO / "tests" / "fixtures" / "autotune").rglob("*.json"))
    relative = "flashinfer/autotune/0.6.17/sm120/0123456789abcdef/rank_tp0_pp0_dp0.json"
    log = f"[2026-12-02 00:00:00] Running FlashInfer autotune with cache: {CACHE_MOUNT}/{relative}\n"
    assert re.search(facts_at.announcements[0], log).group("path") == f"{CACHE_MOUNT}/{relative}"
    fresh = "...(cache reuse DISABLED via SGLANG_FLASHINFER_AUTOTUNE_CACHE=0); writing fresh result to: /c/x.json"
    assert re.search(facts_at.announcements[1], fresh).group("path") == "/c/x.json"

    runs = iter(range(10))

    def judged(layout: str, text: str) -> Status:
        cache = tmp_path / str(next(runs)) / "cache"
        (cache / layout).parent.mkdir(parents=True)
        (cache / layout).write_text(source.read_text())
        facts = Facts(serve=True, arch=cell.arch, engine="sglang", engine_version="0.5.18")
        checks = judge_fresh_cache(cell, text, cache, cache.parent, facts=facts, env={})
        return next(c for c in checks if c.name == "autotune-cache").status

    assert judged(relative, log) is not Status.INCONCLUSIVE
    assert judged(relative, "") is not Status.INCONCLUSIVE, "the layout alone finds it"
    assert judged("autotune_configs.json", "") is Status.INCONCLUSIVE, "vLLM's layout is not SGLang's"


def test_sglang_release_images_are_known_by_their_tags() -> None:
    assert SGLANG.release_of_image("lmsysorg/sglang:v0.5.18-cu130") == "0.5.18"
    assert SGLANG.release_of_image("docker.io/lmsysorg/sglang:v0.5.19@sha256:" + "0" * 64) == "0.5.19"
    assert SGLANG.release_of_image("lmsysorg/sglang:dev") is None, "a moving tag names no release"
    assert SGLANG.release_of_image("someone/sglang:v0.5.18-cu130") is None
    assert VLLM.release_of_image("lmsysorg/sglang:v0.5.18-cu130") is None
    assert SGLANG.release_pins["0.5.18"]["flashinfer-python"] == "0.6.17"


def test_the_audit_reads_an_sglang_release_images_stack(real_matrix: Matrix) -> None:
    from verify.audit.versions import cell_packages, target_of

    cell = real_matrix.cell("sm120-sglang-0.5.18-qwen3.8-nvfp4")
    pins = cell_packages(real_matrix, cell, lambda version, platform: (None, "offline"))
    assert {n: p.version for n, p in pins.items() if n in ("sglang", "flashinfer-python")} == {
        "sglang": "0.5.18",
        "flashinfer-python": "0.6.17",
    }
    assert target_of(real_matrix, cell).platform == "manylinux_2_34_x86_64"
    fix = cell_packages(real_matrix, real_matrix.cell("sm120-sglang-0.5.19-qwen3.8-nvfp4"), lambda v, p: (None, ""))
    assert fix["sglang"].version == "0.5.19" and fix["flashinfer-python"].version == "0.6.18"
    vllm = real_matrix.cell("sm120-vllm-0.28.0-release")
    assert target_of(real_matrix, vllm).platform == "manylinux_2_28_x86_64", "vLLM's images are unchanged"


# -- the SGLang driver against a real SGLang 0.5.17 CUDA server on the H200 --------------------------

H200_SGLANG = REPO / "tests" / "fixtures" / "h200-sglang-0.5.17"


def test_the_h200_sglang_counters_read_through_the_driver() -> None:
    """The clean load's client usage equals the driver's counters moved over the run; the engine-step
    counter (cuda_graph_passes_total, summed over its modes) moved too."""
    import json

    names = SGLANG.metric_names("0.5.17")
    before = parse_metrics((H200_SGLANG / "metrics-before.txt").read_text(), names)
    after = parse_metrics((H200_SGLANG / "metrics-after.txt").read_text(), names)
    load = json.loads((H200_SGLANG / "load-clean.json").read_text())
    checks = {c["name"]: c for c in load["checks"]}
    assert checks["token-accounting"]["status"] == "PASS" and load["questions"]["clean"] == 64
    deltas = load["server_counter_deltas"]
    assert (deltas["generation_tokens"], deltas["prompt_tokens"]) == (5104.0, 14134.0)
    assert after.generated - before.generated >= deltas["generation_tokens"], "the scrapes frame the load"
    assert after.steps > before.steps > 0, "SGLang's forward passes are the engine's steps"
    assert parse_metrics((H200_SGLANG / "metrics-after.txt").read_text(), VLLM.metric_names(None)).generated == 0


def test_the_h200_sglang_stall_was_named_a_stall_because_health_runs_the_engine() -> None:
    import json

    stall = json.loads((H200_SGLANG / "load-stall.json").read_text())
    (event,) = stall["events"]
    assert event["type"] == "ENGINE_STALL_API_ALIVE"
    assert event["api"] == {"health": None, "models": 200, "metrics": 200}
    assert "SIGSTOP" in (H200_SGLANG / "stall-inject.txt").read_text()
    assert re.search(SGLANG.ready_line, (H200_SGLANG / "server.log").read_text())
    assert "sglang::scheduler" in (H200_SGLANG / "ps.txt").read_text()


def test_each_engine_gets_its_own_rule_set_and_no_other() -> None:
    from verify.logs.catalog import rulesets_for

    assert [rs.id for rs in rulesets_for(Facts(serve=True, arch="none", engine="sglang"))] == ["sglang-server"]
    vllm_028 = Facts(serve=True, arch="none", engine="vllm", engine_version="0.28.0")
    assert [rs.id for rs in rulesets_for(vllm_028)] == ["vllm-server"]
    # An unknown vLLM release satisfies the version condition of vLLM 0.33's kernel rules.
    vllm_unknown = Facts(serve=True, arch="none", engine="vllm")
    assert [rs.id for rs in rulesets_for(vllm_unknown)] == ["vllm-server", "vllm-flashinfer-kernels"]
    assert rulesets_for(Facts(serve=False, arch="none")) == ()
