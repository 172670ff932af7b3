"""Our load client beside `vllm bench serve` on the same running server, concurrency 1 to 256, the same load.

The two loads are made the same before they are compared: single-turn questions (a pool of one
turn each, no history, given to run_load in a child process) of `--input-len` words, against vllm bench's random
prompts of the same token count; both `ignore_eos` with `--max-tokens` output tokens, the same
request count and concurrency, the two clients alternating at each concurrency. Each runs as a
whole process; its CPU (user + system, from the kernel's accounting of the finished child) is
reported per 1,000 output tokens and per request, start-up included for both (vllm bench's import
is heavier: its own summary line says so, and the per-token figure of a long run shrinks it).

Per concurrency: output tok/s, TTFT p50, TPOT p50 (ours / theirs, and the ratio), CPU per 1,000
tokens and per request. Goal (issue 45): tok/s, TTFT and TPOT within 5% of vllm bench's, and our
CPU per request no more than its. Writes client-vs-bench.json under --out; asserts nothing.

Usage (on the GPU host, a server already up, e.g. benchmarks/gpu_ab/client.sh):
  python benchmarks/gpu_ab/client_vs_bench.py --url http://127.0.0.1:8000 --bench /tmp/venv/bin/vllm \\
      --model /models/tiny-llama [--concurrency 1,8,64,256] [--requests-per-slot 16] [--max-tokens 64]
  python benchmarks/gpu_ab/client_vs_bench.py --fake-server --bench VENV/bin/vllm --model TOKENIZER_DIR
      (both clients against the instant fake server: each client's own CPU per request, no GPU needed)
  python benchmarks/gpu_ab/client_vs_bench.py --quick   (the unit tier: ours only, against the instant fake server)
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet")


def prompt(i: int, words: int) -> str:
    """A prompt of `words` words (about a token each for a Llama tokenizer), different per question."""
    return " ".join(WORDS[(i + k) % len(WORDS)] for k in range(words))


def _child(argv: list[str], timeout: float) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """Run argv to its end: the result, its CPU seconds (user + system) and its wall seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return done, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def ours(url: str, *, concurrency: int, requests: int, max_tokens: int, input_len: int, out: Path) -> dict[str, Any]:
    """Our client (verify/load/run.py's run_load, as `stackproof load` runs it) in a child process."""
    argv = [sys.executable, __file__, "--child", url, "--concurrency", str(concurrency), "--requests", str(requests),
            "--max-tokens", str(max_tokens), "--input-len", str(input_len), "--out", str(out)]  # fmt: skip
    done, cpu, wall = _child(argv, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"our client failed ({done.returncode}):\n{done.stderr[-3000:]}")
    r = json.loads(done.stdout.strip().splitlines()[-1])
    return _row("stackproof load", r["ok"], r["tokens"], r["tok_s"], r["ttft"], r["tpot"], cpu, wall)


def child(url: str, *, concurrency: int, requests: int, max_tokens: int, input_len: int, out: Path) -> dict[str, Any]:
    """In the child: run_load over `requests` single-turn questions (the file format asks 2-3 turns, a
    user's conversation; vllm bench sends one prompt, so the pool is given here, not read), closed loop."""
    import statistics

    sys.path.insert(0, str(REPO))
    import verify.load.run as run
    from pipeline.matrix.model import LoadSpec
    from verify.load.outcome import LoadTarget
    from verify.load.workload import Question

    pool = tuple(Question(id=f"q{i:05d}", turns=(prompt(i, input_len),)) for i in range(requests))
    run._questions = lambda spec: pool  # one-turn questions, as vllm bench's
    spec = LoadSpec(questions=requests, concurrency=concurrency, max_tokens=max_tokens, determinism_repeats=0,
                    duration_s=3600.0)  # fmt: skip
    outcome = run.run_load(LoadTarget(base_url=url, label="client-vs-bench"), spec, out)
    ok = [r for r in outcome.records if r.ok and r.ttft is not None]
    tpots = [r.tpot for r in ok if r.tpot is not None]
    return {
        "ok": len(ok),
        "tokens": sum(r.output_tokens for r in ok),
        "tok_s": sum(r.output_tokens for r in ok) / max(outcome.seconds, 1e-9),
        "ttft": 1000 * statistics.median(r.ttft for r in ok if r.ttft is not None) if ok else float("nan"),
        "tpot": 1000 * statistics.median(tpots) if tpots else float("nan"),
    }


def theirs(bench: str, url: str, model: str, *, concurrency: int, requests: int, max_tokens: int, input_len: int,
           out: Path) -> dict[str, Any]:  # fmt: skip
    result = out / f"bench-c{concurrency}.json"
    argv = [
        bench, "bench", "serve", "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
        "--base-url", url, "--model", model, "--tokenizer", model, "--dataset-name", "random",
        "--random-input-len", str(input_len), "--random-output-len", str(max_tokens), "--ignore-eos",
        "--num-prompts", str(requests), "--max-concurrency", str(concurrency), "--save-result",
        "--result-dir", str(out), "--result-filename", result.name,
    ]  # fmt: skip
    done, cpu, wall = _child(argv, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"vllm bench serve failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    data = json.loads(result.read_text())
    return _row("vllm bench serve", data["completed"], data["total_output_tokens"], data["output_throughput"],
                data["median_ttft_ms"], data["median_tpot_ms"], cpu, wall)  # fmt: skip


def _row(
    who: str, ok: int, tokens: int, tok_s: float, ttft: float, tpot: float, cpu: float, wall: float
) -> dict[str, Any]:
    return {
        "client": who,
        "requests": ok,
        "output_tokens": tokens,
        "output_tok_s": round(tok_s, 1),
        "ttft_p50_ms": round(ttft, 3),
        "tpot_p50_ms": round(tpot, 3),
        "cpu_s": round(cpu, 3),
        "wall_s": round(wall, 2),
        "cpu_ms_per_1k_tokens": round(1e6 * cpu / max(tokens, 1), 1),
        "cpu_ms_per_request": round(1000 * cpu / max(ok, 1), 2),
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'conc':>5} {'tok/s ours / bench':>22} {'ratio':>6} {'TTFT p50 ms':>18} {'TPOT p50 ms':>16} "
        f"{'CPU ms/1k tok':>16} {'CPU ms/req':>14} {'added per req':>15}"
    ]
    for c in sorted({r["concurrency"] for r in rows}):
        a = next(r for r in rows if r["concurrency"] == c and r["client"] == "stackproof load")
        b = next((r for r in rows if r["concurrency"] == c and r["client"] != "stackproof load"), None)
        if b is None:
            lines.append(f"{c:>5} {a['output_tok_s']:>10,.0f} / {'-':>9} {'-':>6} {a['ttft_p50_ms']:>8.2f} / {'-':>7} "
                         f"{a['tpot_p50_ms']:>7.2f} / {'-':>6} {a['cpu_ms_per_1k_tokens']:>7.0f} / {'-':>6} "
                         f"{a['cpu_ms_per_request']:>6.1f} / {'-':>5}")  # fmt: skip
            continue
        ratio = a["output_tok_s"] / b["output_tok_s"]
        lines.append(
            f"{c:>5} {a['output_tok_s']:>10,.0f} / {b['output_tok_s']:>9,.0f} {ratio:>6.2f} "
            f"{a['ttft_p50_ms']:>8.2f} / {b['ttft_p50_ms']:>7.2f} {a['tpot_p50_ms']:>7.2f} / {b['tpot_p50_ms']:>6.2f} "
            f"{a['cpu_ms_per_1k_tokens']:>7.0f} / {b['cpu_ms_per_1k_tokens']:>6.0f} "
            f"{a['cpu_ms_per_request']:>6.1f} / {b['cpu_ms_per_request']:>5.1f} "
            f"{a['cpu_ms_per_request_added']:>6.2f} / {b['cpu_ms_per_request_added']:>5.2f}"
        )  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--bench", default=None, help="the `vllm` executable (its `bench serve`); none: ours only")
    parser.add_argument("--model", default="/models/tiny-llama")
    parser.add_argument("--concurrency", default="1,8,64,256")
    parser.add_argument("--requests-per-slot", type=int, default=16, help="requests = this x concurrency (at least 64)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=64, help="prompt words (ours) and tokens (vllm bench)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--quick", action="store_true", help="ours only, one small run against the instant fake server")
    parser.add_argument(
        "--fake-server",
        action="store_true",
        help="both clients against the instant fake server (benchmarks/client_ceiling.py) instead of --url: what "
        "each client costs per request when the server costs nothing; --model is then only the tokenizer's folder",
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--requests", type=int, default=64, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        figures = child(args.child, concurrency=int(args.concurrency), requests=args.requests,
                        max_tokens=args.max_tokens, input_len=args.input_len, out=args.out)  # fmt: skip
        print(json.dumps(figures))
        return 0
    out = args.out or Path(tempfile.mkdtemp(prefix="client-vs-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    server = None
    if args.quick or args.fake_server:
        sys.path.insert(0, str(REPO))
        from benchmarks.client_ceiling import start_server

        server, args.url = start_server(out)
    if args.quick:
        args.bench, args.concurrency, args.requests_per_slot, args.max_tokens = None, "2", 4, 8
    rows: list[dict[str, Any]] = []
    try:
        # Each client's start-up (imports, tokenizer, connection pool) measured once on 2 requests, so that the
        # CPU a request adds can be told from what a run costs before its first request.
        tiny = {"concurrency": 1, "requests": 2, "max_tokens": args.max_tokens, "input_len": args.input_len}
        startup = {"stackproof load": ours(args.url, **tiny, out=out / "ours-startup")["cpu_s"]}
        if args.bench:
            startup["vllm bench serve"] = theirs(args.bench, args.url, args.model, **tiny, out=out)["cpu_s"]
        for c in (int(x) for x in args.concurrency.split(",")):
            requests = max(64 if not args.quick else 8, args.requests_per_slot * c)
            same = {"concurrency": c, "requests": requests, "max_tokens": args.max_tokens, "input_len": args.input_len}
            rows.append({"concurrency": c, **ours(args.url, **same, out=out / f"ours-c{c}")})
            if args.bench:
                rows.append({"concurrency": c, **theirs(args.bench, args.url, args.model, **same, out=out)})
            # Each concurrency's rows as they end: a run its call's time limit cuts short keeps them.
            print(f"concurrency {c}: done: {json.dumps(rows[-2:])}", file=sys.stderr, flush=True)
    finally:
        if server is not None:
            server.kill()
            server.wait()
    for row in rows:  # the CPU each request adds, the start-up's 2 requests' worth taken off
        added = max(row["cpu_s"] - startup[row["client"]], 0.0)
        row["cpu_ms_per_request_added"] = round(1000 * added / max(row["requests"] - 2, 1), 3)
    (out / "client-vs-bench.json").write_text(json.dumps({"startup_cpu_s": startup, "rows": rows}, indent=1) + "\n")
    print(f"stackproof load vs vllm bench serve at {args.url}: {args.max_tokens} output tokens, {args.input_len}-token "
          f"single-turn prompts, ignore_eos")  # fmt: skip
    print(table(rows))
    print(f"rows: {out / 'client-vs-bench.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
