"""What a GPU verification cost, from its receipts: the run's wall time, the server's start (readiness),
each stage and the load's GPU-seconds, cold against warm compile cache, printed beside the host-runtime
baselines measured before docker ran on a GPU (a vLLM 0.26.0 host start: H200 164 s, H100 123 s).

    python benchmarks/gpu_docker/cost.py RUN_DIR_OR_RECEIPT...
    python benchmarks/gpu_docker/cost.py --quick      # the recorded receipts (tests/fixtures), for the unit tier
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.guard.jsonfile import read_json

REPO = Path(__file__).resolve().parents[2]
RECORDED = (REPO / "tests/fixtures/gpu-docker-vllm-0.26.0", REPO / "tests/fixtures/h200-vllm-0.26.0/receipts")
# Seconds to a ready vLLM 0.26.0 tiny-Llama server started as a host process, no compile cache:
# the H200 receipt (tests/fixtures/h200-vllm-0.26.0/receipts/pass-bf16) and the H100 run of issue 40's
# first session (server start 112 s of 123 s, about 81 s of it JIT).
HOST_BASELINE_S = {"NVIDIA H200": 164.2, "NVIDIA H100 80GB HBM3": 123.0}


@dataclass(frozen=True)
class Cost:
    label: str
    gpu: str
    runtime: str
    cache: str
    seconds: float
    ready_s: float | None
    stages: dict[str, float]
    load_gpu_s: float | None
    verifying_gpu_s: float | None
    status: str


def _value(section: dict[str, Any] | None, key: str) -> float | None:
    item = (section or {}).get(key) or {}
    value = item.get("value") if isinstance(item, dict) else None
    return float(value) if isinstance(value, (int, float)) else None


def _ready_seconds(receipt: dict[str, Any]) -> float | None:
    for stage in receipt.get("stages", []):
        for check in stage.get("checks", []) if stage.get("stage") == "startup" else []:
            if check.get("name") == "readiness" and isinstance(check.get("evidence"), dict):
                seconds = check["evidence"].get("seconds")
                return float(seconds) if isinstance(seconds, (int, float)) else None
    return None


def cost_of(receipt: dict[str, Any], label: str) -> Cost:
    # torch's view when the imports stage ran; the host's NVML view otherwise (a run of startup and load only)
    gpus = (receipt.get("runtime") or {}).get("gpus_seen_by_torch") or (receipt.get("host") or {}).get("gpus") or [{}]
    cache = receipt.get("compile_cache") or {}
    cache_state = ("warm" if cache.get("warm") else "cold") if cache.get("used") else "none"
    return Cost(
        label=label,
        gpu=str(gpus[0].get("name", "?")),
        runtime=str((receipt.get("image") or {}).get("runtime", "docker")),
        cache=cache_state,
        seconds=float(receipt.get("seconds") or 0.0),
        ready_s=_ready_seconds(receipt),
        stages={s["stage"]: float(s.get("seconds") or 0.0) for s in receipt.get("stages", [])},
        load_gpu_s=_value(receipt.get("cost"), "gpu_seconds"),
        verifying_gpu_s=_value(receipt.get("cost"), "gpu_seconds_verifying"),
        status=str(receipt.get("status")),
    )


def receipts_under(paths: list[Path]) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in paths:
        files = [path] if path.is_file() else sorted(path.rglob("receipt.json"))
        for file in files:
            # a run directory given itself is named by its own folder, not "."
            inner = file.parent.relative_to(path) if path.is_dir() else Path(file.parent.name)
            label = str(inner) if str(inner) != "." else path.name
            found.append((label, read_json(file, "receipt")))
    return found


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


COLUMNS = (("run", 34), ("gpu", 22), ("runtime", 7), ("cache", 5), ("status", 12))
NUMBERS = (("wall s", 7), ("ready s", 8), ("host ready s", 12), ("load GPU-s", 10), ("verify GPU-s", 12))


def table(costs: list[Cost]) -> str:
    rows = [" ".join(f"{n:{w}}" for n, w in COLUMNS) + " " + " ".join(f"{n:>{w}}" for n, w in NUMBERS)]
    for c in costs:
        texts = (c.label, c.gpu, c.runtime, c.cache, c.status)
        numbers = (c.seconds, c.ready_s, HOST_BASELINE_S.get(c.gpu), c.load_gpu_s, c.verifying_gpu_s)
        left = " ".join(f"{t[:w]:{w}}" for t, (_, w) in zip(texts, COLUMNS, strict=True))
        right = " ".join(f"{_fmt(v):>{w}}" for v, (_, w) in zip(numbers, NUMBERS, strict=True))
        rows.append(f"{left} {right}")
        rows.append("    stages: " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in c.stages.items()))
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, help="run directories or receipt.json files")
    parser.add_argument("--quick", action="store_true", help="the recorded receipts under tests/fixtures")
    args = parser.parse_args(argv)
    # --quick: whichever recorded receipts this checkout holds (the GPU docker ones come with a GPU session).
    paths = [p for p in RECORDED if p.exists()] if args.quick else args.paths
    missing = [p for p in paths if not p.exists()]
    if missing or not paths:
        print(f"cost.py: no receipts at {', '.join(map(str, missing)) or '(no path given)'}", file=sys.stderr)
        return 2
    costs = [cost_of(receipt, label) for label, receipt in receipts_under(paths)]
    print(table(costs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
