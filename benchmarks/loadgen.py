"""Our load client beside `vllm bench serve`, against the same running `cpu-tiny` server, in one run.

Goal (issue: stage load): throughput and TTFT p50 within 10% of vllm bench's, and our client CPU
seconds per request no more than its. Same server, same request count, concurrency and output
length (`ignore_eos`); vllm bench's random prompts are sized to our measured mean prompt length.
Both clients run as whole processes inside the server's container (vllm bench lives there; our
client is bind-mounted read-only, with a scipy wheel the image lacks), so both share the server's
CPUs the same way, and their CPU time (user + system, start-up included) is read from the kernel's
accounting of the finished process. Our client is also run from the host, as a third column: on a
2-core box the placement alone moves the numbers. Prints all of it side by side; asserts nothing.
Needs a docker daemon and PyPI (the scipy wheel); builds cpu-tiny first when its image is missing.

Usage: python benchmarks/loadgen.py [--questions 60] [--concurrency 6] [--max-tokens 32] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MODEL = "/models/tiny-llama"
# Runs a command and prints the CPU seconds its process tree used, from the kernel's rusage.
CPU_WRAPPER = (
    "import resource, subprocess, sys; rc = subprocess.call(sys.argv[1:]); "
    "r = resource.getrusage(resource.RUSAGE_CHILDREN); print('CPU_SECONDS', r.ru_utime + r.ru_stime); sys.exit(rc)"
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=60)
    parser.add_argument("--concurrency", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2, help="alternate the two clients this many times")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from pipeline.docker.client import Docker
    from pipeline.matrix.read import load_matrix
    from verify.stages.server import Server

    out = Path(os.environ.get("TMPDIR", "/tmp")) / "stackproof-bench-loadgen"
    build = subprocess.run(
        [sys.executable, "-m", "pipeline", "build", "cpu-tiny", "--json", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    image = json.loads(build.stdout)["tag"]
    docker = Docker.connect()
    cell = load_matrix(REPO / "matrix.yaml", images_dir=REPO / "images").cell("cpu-tiny")
    ours: list[dict[str, Any]] = []
    theirs: list[dict[str, Any]] = []
    site = _container_site(out / "container-site")
    volumes = {REPO: "/stackproof:ro", site: "/opt/stackproof-site:ro"}
    host: list[dict[str, Any]] = []
    with Server(docker, cell, image, out_dir=out / "server", volumes=volumes) as server:
        server.wait_ready()
        load = _load_argv(server.base_url, questions=6, concurrency=args.concurrency, tokens=args.max_tokens)
        warm = _ours_in(docker, server.name, load)
        print(f"warm-up: {warm['requests']} requests", file=sys.stderr)
        template_tokens = 0.0
        for round_no in range(args.rounds):
            load = _load_argv(
                server.base_url, questions=args.questions, concurrency=args.concurrency, tokens=args.max_tokens
            )
            mine = _ours_in(docker, server.name, load)
            ours.append(mine)
            host.append(_ours_host([*load, "--out", str(out / f"ours-host-{round_no}")]))
            theirs.append(
                _vllm_bench(
                    docker,
                    server.name,
                    server.base_url,
                    requests=mine["requests"],
                    concurrency=args.concurrency,
                    tokens=args.max_tokens,
                    input_len=max(1, round(mine["mean_prompt_tokens"] - template_tokens)),
                )
            )
            # The chat template adds tokens around vllm bench's random prompt: measure and subtract them.
            template_tokens = theirs[-1]["mean_prompt_tokens"] - theirs[-1]["input_len"]
    _print(ours, theirs, host, args)
    return 0


def _container_site(target: Path) -> Path:
    """scipy for the image's Python 3.11 (the image has numpy, httpx, prometheus-client, jinja2, yaml)."""
    if not (target / "scipy").is_dir():
        import scipy

        subprocess.run(
            [
                *(sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--only-binary", ":all:"),
                *("--python-version", "3.11", "--platform", "manylinux_2_28_x86_64", "--target", str(target)),
                f"scipy=={scipy.__version__}",
            ],
            check=True,
        )
    return target


def _load_argv(url: str, *, questions: int, concurrency: int, tokens: int) -> list[str]:
    return [
        "load",
        "--url",
        url,
        "--questions",
        str(questions),
        "--concurrency",
        str(concurrency),
        "--max-tokens",
        str(tokens),
        "--determinism-repeats",
        "0",
        "--json",
    ]


def _ours_in(docker: Any, container: str, load: list[str]) -> dict[str, Any]:
    """`stackproof load` inside the server's container, from the read-only bind mount."""
    started = time.monotonic()
    run = docker.docker(
        "exec",
        "--env",
        "PYTHONPATH=/stackproof:/opt/stackproof-site",
        "--env",
        "PYTHONDONTWRITEBYTECODE=1",
        "--workdir",
        "/stackproof",
        container,
        "python3",
        "-c",
        CPU_WRAPPER,
        "python3",
        "-m",
        "pipeline",
        *load,
        "--out",
        f"/tmp/ours-{time.monotonic_ns()}",
        timeout=900,
        check=False,
        quiet=True,
    )
    wall = time.monotonic() - started
    if run.returncode != 0:
        raise SystemExit(f"stackproof load (in the container) failed ({run.returncode}):\n{run.stderr[-3000:]}")
    document, _, cpu_line = run.stdout.rpartition("CPU_SECONDS")
    return _row(json.loads(document), float(cpu_line.split()[0]), wall)


def _ours_host(load: list[str]) -> dict[str, Any]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pipeline", *load], cwd=REPO, capture_output=True, text=True)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"stackproof load failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return _row(json.loads(proc.stdout), cpu, wall)


def _row(summary: dict[str, Any], cpu: float, wall: float) -> dict[str, Any]:
    requests = summary["requests"]["ok"]
    return {
        "requests": requests,
        "output_tok_s": summary["throughput"]["output_tok_s"],
        "requests_s": summary["throughput"]["requests_s"],
        "ttft_p50_ms": summary["latency_ms"]["ttft"]["p50"],
        "tpot_p50_ms": summary["latency_ms"]["tpot"]["p50"],
        "cpu_s": cpu,
        "cpu_s_per_request": cpu / requests,
        "wall_s": wall,
        "mean_prompt_tokens": summary["tokens"]["prompt"] / requests,
    }


def _vllm_bench(
    docker: Any, container: str, url: str, *, requests: int, concurrency: int, tokens: int, input_len: int
) -> dict[str, Any]:
    result_file = f"bench-{time.monotonic_ns()}.json"
    argv = [
        "vllm",
        "bench",
        "serve",
        "--backend",
        "openai-chat",
        "--endpoint",
        "/v1/chat/completions",
        "--base-url",
        url,
        "--model",
        MODEL,
        "--tokenizer",
        MODEL,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(input_len),
        "--random-output-len",
        str(tokens),
        "--ignore-eos",
        "--num-prompts",
        str(requests),
        "--max-concurrency",
        str(concurrency),
        "--save-result",
        "--result-dir",
        "/tmp",
        "--result-filename",
        result_file,
    ]
    started = time.monotonic()
    run = docker.docker("exec", container, "python3", "-c", CPU_WRAPPER, *argv, timeout=900, check=False)
    wall = time.monotonic() - started
    if run.returncode != 0:
        raise SystemExit(f"vllm bench serve failed ({run.returncode}):\n{run.stdout[-2000:]}\n{run.stderr[-3000:]}")
    cpu = float(next(line.split()[1] for line in run.stdout.splitlines() if line.startswith("CPU_SECONDS")))
    data = json.loads(docker.docker("exec", container, "cat", f"/tmp/{result_file}", quiet=True).stdout)
    return {
        "requests": data["completed"],
        "output_tok_s": data["output_throughput"],
        "requests_s": data["request_throughput"],
        "ttft_p50_ms": data["median_ttft_ms"],
        "tpot_p50_ms": data["median_tpot_ms"],
        "cpu_s": cpu,
        "cpu_s_per_request": cpu / max(data["completed"], 1),
        "wall_s": wall,
        "mean_prompt_tokens": data["total_input_tokens"] / max(data["completed"], 1),
        "input_len": input_len,
    }


def _print(
    ours: list[dict[str, Any]], theirs: list[dict[str, Any]], host: list[dict[str, Any]], args: argparse.Namespace
) -> None:
    def med(rows: list[dict[str, Any]], key: str) -> float:
        return float(statistics.median(r[key] for r in rows))

    print(
        f"\nstackproof load vs vllm bench serve: cpu-tiny, {ours[0]['requests']} requests, concurrency "
        f"{args.concurrency}, {args.max_tokens} output tokens, median of {len(ours)} rounds\n"
    )
    print(f"{'metric':<34}{'stackproof load':>18}{'vllm bench serve':>18}{'ratio':>9}{'ours, host':>12}  goal")
    rows = [
        ("output throughput (tok/s)", "output_tok_s", "within 10%"),
        ("request throughput (req/s)", "requests_s", "within 10%"),
        ("TTFT p50 (ms)", "ttft_p50_ms", "within 10%"),
        ("TPOT p50 (ms)", "tpot_p50_ms", ""),
        ("mean prompt tokens", "mean_prompt_tokens", "matched"),
        ("client CPU seconds (whole process)", "cpu_s", ""),
        ("client CPU s per request", "cpu_s_per_request", "ours <= theirs"),
        ("client wall seconds", "wall_s", ""),
    ]
    for label, key, goal in rows:
        a, b, c = med(ours, key), med(theirs, key), med(host, key)
        print(f"{label:<34}{a:>18.3f}{b:>18.3f}{(a / b if b else float('nan')):>9.2f}{c:>12.3f}  {goal}")
    print("\nper round:", json.dumps({"ours": ours, "vllm_bench": theirs, "ours_host": host}, indent=1))


if __name__ == "__main__":
    raise SystemExit(main())
