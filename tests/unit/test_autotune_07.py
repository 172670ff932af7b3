"""FlashInfer 0.7 and vLLM 0.26-0.33 caches: every layout on files FlashInfer's own writers produced.

The fixtures (tests/fixtures/autotune/flashinfer-0.7.4/, see its README and make_fixtures.py) hold
the real H200 run's winners, rewritten by FlashInfer 0.7.4's and 0.7.2.post1's writers on a CPU:
so every layout must read back into the same winners table as the 0.6.18.post1 H200 file.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from pipeline.errors import InputError
from pipeline.result import Status
from stackproof.cli import main
from verify.kernels.autotune import read_cache, winners
from verify.logs.catalog import Facts
from verify.serving import driver_named
from verify.stages.autotune import CACHE_MOUNT, judge_fresh_cache, winners_table

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "autotune"
H200 = FIXTURES / "h200-fi0.6.18.post1-cudnn9.19-two-shapes.json"
FI074 = FIXTURES / "flashinfer-0.7.4"
HASH = "080b066f6e3235829e2ddbb4987fa27aaaff89d989674fa5d9c91cd266f4c935"
ENV_HASH = "5e72a371957680a5"
LEGACY_074 = FI074 / "legacy-0.7.4" / HASH / "autotune_configs.json"
LEGACY_072 = FI074 / "legacy-0.7.2.post1" / HASH / "autotune_configs.json"
RANK0 = FI074 / "per-rank" / HASH / "autotune_configs_dp0_rank0.json"
RANK1 = FI074 / "per-rank" / HASH / "autotune_configs_dp0_rank1.json"
STORE = FI074 / "managed" / "v2" / ENV_HASH
POLICY = "sm12x-no-cudnn-fp8-below-9.23.1"

LAYOUTS = {
    "legacy 0.7.4 (hash folder)": (LEGACY_074, "0.7.4+"),
    "legacy 0.7.2.post1": (LEGACY_072, "0.7.2+"),
    "per-rank 0": (RANK0, "0.7.4+"),
    "per-rank 1": (RANK1, "0.7.4+"),
    "managed store directory": (STORE, "managed-v2"),
    "managed store manifest": (STORE / "manifest.json", "managed-v2"),
    "managed store root": (FI074 / "managed", "managed-v2"),
}


def _table(path: Path) -> dict[tuple[str, int, int, int], tuple[str, object]]:
    return {(e.op, e.n, e.k, e.m_bucket): (e.runner, e.tactic) for e in read_cache(path).entries}


# -- each layout read -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_each_layout_reads_the_h200_winners(name: str) -> None:
    path, fmt = LAYOUTS[name]
    cache = read_cache(path)
    assert cache.format == fmt
    assert _table(path) == _table(H200), "same runner and tactic in every bucket as the real H200 file"
    assert winners_table(cache) == winners_table(read_cache(H200))
    square = {e.m_bucket: e.runner for e in winners(cache)[("fp8_gemm", 5120, 5120)]}
    assert {m for m, r in square.items() if r == "CudnnFp8GemmRunner"} == {1, 2, 4, 8, 16, 32}
    assert cache.metadata["cudnn_version"] == "91900" and cache.metadata["gpu"] == "NVIDIA H200"
    assert cache.metadata["flashinfer_version"] == ("0.7.2.post1" if "0.7.2" in name else "0.7.4")


def test_provenance_of_each_value_shape_is_kept() -> None:
    hot = ("cuda_graph_profile_replays", None, "l2_cache_policy", "hot")  # AutoTuner._profiling_policy
    legacy, older, store = read_cache(LEGACY_074), read_cache(LEGACY_072), read_cache(STORE)
    assert all(e.policy == hot and e.selection and e.selection["candidates"] == 3 for e in legacy.entries)
    assert all(e.policy == hot and e.selection is None for e in older.entries)
    assert all(e.policy == hot and e.selection is None and e.source for e in store.entries)
    assert store.layout == "managed-v2" and store.store == STORE and store.metadata["cache_schema"] == "v2"
    assert legacy.generation and store.generation is None


def test_a_mixed_file_of_2_3_and_4_element_values_reads(tmp_path: Path) -> None:
    """0.7.4 saves back a loaded entry with the length it was loaded with (autotuner.py:4653-4660)."""
    doc = json.loads(LEGACY_074.read_text())
    keys = [k for k in doc if not k.startswith("_")]
    doc[keys[0]] = doc[keys[0]][:2]
    doc[keys[1]] = doc[keys[1]][:3]
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps(doc))
    cache = read_cache(path)
    assert cache.format == "0.7.4+" and _table(path) == _table(H200)
    assert sum(e.policy is None for e in cache.entries) == 1
    assert sum(e.selection is None for e in cache.entries) == 2


# -- inspect autotune on each layout -------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_inspect_autotune_exits_0_with_a_table_and_1_on_the_sm120_policy(name: str, capsys) -> None:
    path, fmt = LAYOUTS[name]
    assert main(["inspect", "autotune", str(path), "--arch", "sm90", "--m", "405"]) == 0
    out = capsys.readouterr().out
    assert f"format {fmt}" in out and "fp8_gemm N=5120 K=5120:" in out
    assert "M=405 -> bucket 512" in out
    # cuDNN 9.19 < 9.23.1 and cuDNN wins M<=32: the policy of vllm-project/vllm#55571 on SM120
    assert main(["inspect", "autotune", str(path), "--arch", "sm120", "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    (policy,) = [c for c in document["checks"] if c["name"] == "policy"]
    assert policy["status"] == "FAIL" and POLICY in policy["message"]
    assert document["format"] == fmt and document["format_source"]["source"]


def _store_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "v2" / ENV_HASH
    shutil.copytree(STORE, copy)
    return copy


def _entry_file(store: Path, runner: str) -> Path:
    return next(p for p in sorted((store / "entries").glob("*.json")) if json.loads(p.read_text())["runner"] == runner)


def test_a_malformed_store_entry_exits_2_naming_file_and_field(tmp_path: Path, capsys) -> None:
    store = _store_copy(tmp_path)
    entry = _entry_file(store, "CublasFp8GemmRunner")
    document = json.loads(entry.read_text())
    entry.write_text(json.dumps({k: v for k, v in document.items() if k != "runner"}))
    assert main(["inspect", "autotune", str(store)]) == 2
    assert f"{entry}: runner: missing" in capsys.readouterr().err
    entry.write_text(json.dumps({**document, "profiling_policy": "hot"}))
    assert main(["inspect", "autotune", str(store / "manifest.json")]) == 2
    assert f"{entry}: profiling_policy: must be a list" in capsys.readouterr().err
    entry.write_text(json.dumps({**document, "runner": "CudnnFp8GemmRunner"}))
    assert main(["inspect", "autotune", str(store)]) == 2
    assert f"{entry}: runner: key names CublasFp8GemmRunner, field names CudnnFp8GemmRunner" in capsys.readouterr().err
    entry.write_text(json.dumps(document))
    entry.rename(entry.with_name("0" * 24 + ".json"))  # FlashInfer looks an entry up by sha256(key)[:24]
    assert main(["inspect", "autotune", str(store)]) == 2
    assert "key: hashes to " in capsys.readouterr().err
    (store / "manifest.json").write_text(json.dumps({"gpu": "NVIDIA H200"}))
    with pytest.raises(InputError, match=r"manifest.json: cache_schema: None, expected 'v2'"):
        read_cache(store)


def test_a_malformed_legacy_value_exits_2_naming_file_key_and_field(tmp_path: Path, capsys) -> None:
    doc = json.loads(LEGACY_074.read_text())
    key = next(k for k in doc if not k.startswith("_"))
    for value, field in (
        ([*doc[key], "extra"], "value: not [runner, tactic, policy?, selection?]"),
        ([doc[key][0], doc[key][1], "hot"], "value[2] (profiling policy): must be a list"),
        ([*doc[key][:3], [1]], "value[3] (selection): must be an object"),
        ([7, *doc[key][1:]], "value[0] (runner): must be a runner class name"),
    ):
        path = tmp_path / "bad.json"
        path.write_text(json.dumps({**doc, key: value}))
        assert main(["inspect", "autotune", str(path)]) == 2
        err = capsys.readouterr().err
        assert f"{path}: entry {key[:80]!r}: {field}" in err, err


# -- the autotune stage on a vLLM 0.33 log and what FlashInfer wrote ---------------------------------


def _cell(real_matrix):
    return real_matrix.cell("sm120-vllm-0.28.0-fi-0.6.18.post1-cu130")


def _facts(version: str = "0.33.0", flashinfer: str = "0.7.4") -> Facts:
    return Facts(serve=True, arch="sm120", engine_version=version, flashinfer=flashinfer, cudnn=91900)


def _judged(real_matrix, log: str, cache_dir: Path, out: Path, facts: Facts) -> dict[str, object]:
    out.mkdir(parents=True, exist_ok=True)
    return {c.name: c for c in judge_fresh_cache(_cell(real_matrix), log, cache_dir, out, facts=facts, env={})}


def test_the_stage_judges_a_vllm_0_33_managed_store_by_policy(real_matrix, tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    _store_copy(cache_dir)
    log = (FI074 / "vllm-0.33.0-managed.log").read_text()
    assert f"(root={CACHE_MOUNT})" in log
    checks = _judged(real_matrix, log, cache_dir, tmp_path / "fail", _facts())
    cache = checks["autotune-cache"]
    assert cache.status is Status.PASS and "managed store" in cache.message and "managed-v2" in cache.message
    assert cache.evidence["logged_path"] == CACHE_MOUNT
    kept = Path(cache.evidence["file"])
    assert kept == tmp_path / "fail" / "autotune-store" / ENV_HASH / "manifest.json" and read_cache(kept).entries
    assert checks["cache-environment"].status is Status.PASS
    policy = checks["policy"]
    assert policy.status is Status.FAIL and policy.message.startswith("CudnnFp8GemmRunner wins fp8_gemm")

    # The same store without the entries cuDNN won: what FlashInfer keeps when cuDNN is no candidate.
    for entry in sorted((cache_dir / "v2" / ENV_HASH / "entries").glob("*.json")):
        if json.loads(entry.read_text())["runner"] == "CudnnFp8GemmRunner":
            entry.unlink()
    checks = _judged(real_matrix, log, cache_dir, tmp_path / "pass", _facts())
    assert checks["autotune-cache"].status is Status.PASS and checks["autotune-cache"].evidence["entries"] == 31
    assert checks["policy"].status is Status.PASS


def test_the_stage_judges_a_vllm_0_33_per_rank_file(real_matrix, tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    shutil.copytree(FI074 / "per-rank", cache_dir)
    log = (FI074 / "vllm-0.33.0-per-rank.log").read_text()
    checks = _judged(real_matrix, log, cache_dir, tmp_path / "out", _facts())
    cache = checks["autotune-cache"]
    assert cache.status is Status.PASS and cache.evidence["logged_path"].endswith("autotune_configs_dp0_rank0.json")
    assert checks["policy"].status is Status.FAIL
    # 0.28's facts would not see a dp/rank file: the version's facts decide, not the reader
    old = _judged(real_matrix, log, cache_dir, tmp_path / "old", _facts("0.28.0", "0.6.16.post3"))
    assert old["autotune-cache"].status is Status.INCONCLUSIVE


def test_the_stage_reads_a_vllm_0_26_hash_folder_written_by_flashinfer_0_7_4(real_matrix, tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    shutil.copytree(FI074 / "legacy-0.7.4", cache_dir)
    log = (
        f"INFO [kernel_warmup.py:260] Using FlashInfer autotune cache file: {CACHE_MOUNT}/{HASH}/autotune_configs.json"
    )
    checks = _judged(real_matrix, log, cache_dir, tmp_path / "out", _facts("0.26.0"))
    assert checks["autotune-cache"].status is Status.PASS and checks["policy"].status is Status.FAIL
    assert "0.7.4+" in checks["autotune-cache"].message


def test_a_managed_root_with_no_store_is_inconclusive_with_the_root_named(real_matrix, tmp_path: Path) -> None:
    (tmp_path / "cache").mkdir()
    log = (FI074 / "vllm-0.33.0-managed.log").read_text()
    (check,) = judge_fresh_cache(_cell(real_matrix), log, tmp_path / "cache", tmp_path, facts=_facts(), env={})
    assert check.status is Status.INCONCLUSIVE and f"named {CACHE_MOUNT}" in check.message


def test_the_0_33_facts_read_the_synthetic_log_lines() -> None:
    facts = driver_named("vllm").autotune_at("0.33.0")
    assert facts is not None
    managed = (FI074 / "vllm-0.33.0-managed.log").read_text()
    legacy = (FI074 / "vllm-0.33.0-per-rank.log").read_text()
    assert re.search(facts.announcements[1], managed).group("path") == CACHE_MOUNT  # type: ignore[union-attr]
    found = re.search(facts.announcements[0], legacy, re.MULTILINE).group("path")  # type: ignore[union-attr]
    assert found == f"{CACHE_MOUNT}/{HASH}/autotune_configs_dp0_rank0.json"


# -- inspect autotune on the directory a user names ------------------------------------------------


@pytest.mark.parametrize(
    ("named", "read"),
    [
        (FI074 / "legacy-0.7.4", LEGACY_074),  # vLLM 0.26-0.32: the cache root, one hash folder below
        (FI074 / "legacy-0.7.4" / HASH, LEGACY_074),  # the hash folder itself
        (FI074 / "managed" / "v2", STORE),  # the store's v2 folder
    ],
)
def test_inspect_autotune_reads_the_one_cache_of_a_directory(named: Path, read: Path, capsys) -> None:
    assert main(["inspect", "autotune", str(named), "--arch", "sm90", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["read"] == str(read) and document["file"] == str(named)
    assert main(["inspect", "autotune", str(named), "--arch", "sm120"]) == 1
    assert f"read: {read}" in capsys.readouterr().out


def test_inspect_autotune_on_a_directory_of_several_or_no_caches_exits_2_naming_them(tmp_path: Path, capsys) -> None:
    assert main(["inspect", "autotune", str(FI074 / "per-rank" / HASH)]) == 2
    err = capsys.readouterr().err
    assert "2 autotune caches (autotune_configs_dp0_rank0.json, autotune_configs_dp0_rank1.json): name one" in err
    assert main(["inspect", "autotune", str(FI074 / "per-rank" / HASH / RANK1.name)]) == 0
    capsys.readouterr()
    # Deeper than vLLM's one hash folder is not looked at: a mistaken `/` is not walked.
    deep = tmp_path / "a" / "b" / HASH
    deep.mkdir(parents=True)
    shutil.copyfile(LEGACY_074, deep / "autotune_configs.json")
    assert main(["inspect", "autotune", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path}: no FlashInfer autotune cache here (looked for v2/*/manifest.json, autotune_configs.json" in err


def test_a_malformed_manifest_exits_2_with_its_line(tmp_path: Path, capsys) -> None:
    store = _store_copy(tmp_path)
    (store / "manifest.json").write_text('{"cache_schema": "v2",\n')
    assert main(["inspect", "autotune", str(tmp_path)]) == 2
    assert f"{store / 'manifest.json'}:2: the managed autotune store manifest is not JSON" in capsys.readouterr().err


# -- vLLM 0.26.0's real line on an H200 ------------------------------------------------------------

# The server log of the first H200 receipt (tests/fixtures/h200-vllm-0.26.0/receipts, a real run).
SERVER_0_26 = FIXTURES.parent / "h200-vllm-0.26.0" / "receipts" / "pass-bf16" / "server.log"


def test_the_0_26_facts_read_the_real_h200_line_and_the_stage_judges_its_hash_folder(
    real_matrix, tmp_path: Path
) -> None:
    """vLLM 0.26.0 on the H200 logged `[kernel_warmup.py:227] Using FlashInfer autotune cache file:
    <dir>/<64-hex>/autotune_configs.json`; a real H200 cache at that place is judged, not INCONCLUSIVE."""
    log = SERVER_0_26.read_text()
    facts = driver_named("vllm").autotune_at("0.26.0")
    assert facts is not None
    match = re.search(facts.announcements[0], log, re.MULTILINE)
    assert match is not None
    named = match.group("path")
    assert re.fullmatch(r"/\S+/[0-9a-f]{64}/autotune_configs\.json", named), named
    mount, folder = named.rsplit("/", 2)[0], named.rsplit("/", 2)[1]
    cache_dir = tmp_path / "cache" / folder
    cache_dir.mkdir(parents=True)
    shutil.copyfile(H200, cache_dir / "autotune_configs.json")
    out = tmp_path / "out"
    out.mkdir()
    facts_0_26 = _facts("0.26.0", "0.6.18.post1")
    judged = judge_fresh_cache(_cell(real_matrix), log, tmp_path / "cache", out, facts=facts_0_26, env={}, mount=mount)
    checks = {c.name: c for c in judged}
    assert checks["autotune-cache"].status is Status.PASS and checks["autotune-cache"].evidence["logged_path"] == named
    assert checks["policy"].status is Status.FAIL  # cuDNN 9.19 wins small M: the SM120 policy
    # The 0.33 line's sentence is not taken into the path, by the 0.33 facts.
    new = driver_named("vllm").autotune_at("0.33.0")
    assert new is not None
    line = f"Using FlashInfer autotune cache file: {named}. Pass --disable-flashinfer-autotune to skip autotuning."
    assert re.search(new.announcements[0], line).group("path") == named  # type: ignore[union-attr]


def test_a_0_26_server_that_never_reached_tuning_names_the_gate(real_matrix, tmp_path: Path) -> None:
    """The real H200 0.26.0 log tuned and wrote nothing: the `autotune: {entries: none}` GPU docker cell
    passes on it. The same log with the warmup's autotune lines gone (what a container without nvcc on
    PATH logs: has_flashinfer() is False and kernel_warmup.py:118-121 skips tuning silently) is
    INCONCLUSIVE and names that gate, not only "no file"."""
    cell = real_matrix.cell("gpu-docker-vllm-0.26.0-tiny")
    facts = Facts(serve=True, arch="sm90", engine_version="0.26.0", flashinfer="0.6.14")
    tuned = SERVER_0_26.read_text()
    (tmp_path / "cache").mkdir()
    (check,) = judge_fresh_cache(cell, tuned, tmp_path / "cache", tmp_path, facts=facts, env={})
    assert check.status is Status.PASS, check.message
    untuned = "\n".join(line for line in tuned.splitlines() if "autotune" not in line.lower())
    assert "Using FlashInfer for top-p & top-k sampling." in untuned  # FlashInfer itself was there
    (check,) = judge_fresh_cache(cell, untuned, tmp_path / "cache", tmp_path, facts=facts, env={})
    assert check.status is Status.INCONCLUSIVE
    assert "never reached tuning" in check.message and "nvcc on the server's PATH" in check.message
