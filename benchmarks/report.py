"""How fast `stackproof report` renders a big matrix: 50 cells x 5 hosts of generated receipts.

Goal (issue 19): the site of 50 cells x 5 hosts renders in under 10 s on this machine.
The receipts are GENERATED FOR THIS BENCHMARK ONLY (derived from the real cpu-tiny fixture receipt,
with made-up hosts, statuses, numbers and autotune winners); they are never kept or published.
They stand alone, as receipts read from a registry do (the CI case): no run directories, so no raw
latency series; `--with-raw` adds requests.jsonl/scrapes.jsonl beside every receipt as well.
Prints the measured number next to the goal; asserts nothing. Needs no docker.
Measured on this project's 2-core CPU machine kind (shared): 5.3-5.7 s receipts alone (goal met);
47 s with raw series beside all 250 (500 more plots, ~0.09 s each: over the goal, said so).
Usage: python benchmarks/report.py [--cells 50] [--hosts 5] [--with-raw]
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GOAL_S = 10.0
FIXTURE = REPO / "tests/fixtures/receipts/cpu-tiny-pass/cpu-tiny/run-20261201T181931"
AUTOTUNE = REPO / "tests/fixtures/autotune/h200-ministral14b-fi0.6.18.post1-cudnn9.19.json"
HOSTS = [
    ("NVIDIA H200", "9.0", "580.159.04"),
    ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "12.0", "590.48.01"),
    ("NVIDIA GB10", "12.1", "580.95.05"),
    ("NVIDIA B200", "10.0", "580.159.04"),
    ("NVIDIA RTX 5090", "12.0", "590.48.01"),
    ("NVIDIA L40S", "8.9", "580.159.04"),
]
STATUSES = ["PASS"] * 6 + ["FAIL", "INCONCLUSIVE", "NOT_REPRODUCED"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=50)
    parser.add_argument("--hosts", type=int, default=5)
    parser.add_argument("--with-raw", action="store_true", help="a run directory's raw load series beside each")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from stackproof.cli import main as stackproof
    from verify.kernels.autotune import read_cache
    from verify.stages.autotune import winners_table

    winners = winners_table(read_cache(AUTOTUNE))
    base = json.loads((FIXTURE / "receipt.json").read_text())
    work = Path(tempfile.mkdtemp(prefix="stackproof-report-bench-"))
    try:
        count = generate(work / "receipts", base, winners, args.cells, args.hosts, with_raw=args.with_raw)
        started = time.perf_counter()
        code = stackproof(
            ["report", "--receipts", str(work / "receipts"), "--out", str(work / "site"), "--cells"]
            + [f"bench-cell-{i:02d}" for i in range(args.cells)]
        )
        seconds = time.perf_counter() - started
        files = sum(1 for p in (work / "site").rglob("*") if p.is_file())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    kind = "with raw load series" if args.with_raw else "receipts alone, as from a registry"
    print(f"{args.cells} cells x {args.hosts} hosts = {count} generated receipts ({kind}): exit {code}, {files} files")
    print(f"rendered in {seconds:.2f} s   (goal: < {GOAL_S:.0f} s)   {'MET' if seconds < GOAL_S else 'NOT MET'}")
    return 0


def generate(root: Path, base: dict, winners: list, cells: int, hosts: int, *, with_raw: bool) -> int:
    rng = random.Random(19)
    count = 0
    for h in range(hosts):
        name, cc, driver = HOSTS[h % len(HOSTS)]
        host = {
            **base["host"],
            "gpus": [{"name": name, "compute_capability": cc, "memory": "97887 MiB"}],
            # The site's column is the fingerprint the model derives (arch, GPUs, driver), not the
            # stored key: a driver per host past the table keeps every generated host its own column.
            "driver": driver if h < len(HOSTS) else f"{driver}.{h}",
            "cuda_driver": "13.0",
            "key": f"bench{h:011d}",
            "summary": f"1x {name} (cc {cc}), driver {driver} on x86_64 [benchmark]",
        }
        for c in range(cells):
            receipt = copy.deepcopy(base)
            status = rng.choice(STATUSES)
            receipt.update(
                {
                    "cell": f"bench-cell-{c:02d}",
                    "status": status,
                    "status_reason": f"generated for benchmarks/report.py ({status})",
                    "host": host,
                    "started_at": f"2026-11-{1 + (c + h) % 28:02d}T03:17:00Z",
                    "claims": "GENERATED FOR THE BENCHMARK ONLY: verifies nothing",
                }
            )
            receipt["runtime"]["distributions"] = {
                "vllm": "0.28.0",
                "torch": "2.10.0+cu130",
                "flashinfer-python": rng.choice(["0.6.16.post3", "0.6.18.post1"]),
            }
            receipt["load"]["throughput"]["output_tok_s"] = round(rng.uniform(800, 9000), 1)
            receipt["load"]["latency_ms"]["ttft"]["p50"] = round(rng.uniform(20, 400), 1)
            # Winners differ by host and by model group (10 groups): distinct heatmaps, as on real GPUs.
            table = copy.deepcopy(winners)
            swap = (h * 10 + c % 10) % 21
            for t in table:
                for i, row in enumerate(t["rows"]):
                    if i == swap:
                        row["runner"] = "CutlassFp8GemmRunner"
            receipt["autotune"] = table
            run = root / receipt["cell"] / f"run-{h}"
            run.mkdir(parents=True)
            (run / "receipt.json").write_text(json.dumps(receipt))
            if with_raw:
                shutil.copytree(FIXTURE / "load", run / "load")
                for stage in receipt["stages"]:
                    if stage["stage"] == "load":
                        stage["artifacts"] = {
                            k: f"/x/{run.name}/load/{Path(v).name}" for k, v in stage["artifacts"].items()
                        }
                (run / "receipt.json").write_text(json.dumps(receipt))
            count += 1
    return count


if __name__ == "__main__":
    raise SystemExit(main())
