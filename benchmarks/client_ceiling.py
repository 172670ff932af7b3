"""The load client's own ceiling: what `stackproof load` costs per token against a server that answers at once.

A fake OpenAI server (an asyncio server in its own process, on 127.0.0.1: every chat stream's SSE
events pre-built and written one by one, as vLLM writes one event per token, with no delay) takes
the load; the client runs in a fresh process per run (what a user's `stackproof load` is: its
imports, and the first time anything is imported inside the event loop, fall inside its run), and
reports from its own process:

- the first run, as a user's `stackproof load` runs it: its CPU ms per 1,000 output tokens (process
  CPU around `run_load`: the start-up imports are out, anything it does once inside is in) and the
  longest pause: the largest gap in the union of every stream's chunk arrival times after the load
  filled (a stall of the event loop stalls every stream at once);
- a second run in the same process, the steady state: CPU ms per 1,000 output tokens, and tokens
  per CPU-second, the client's ceiling per core (1,000,000 / the former);
- output tok/s (bounded by the fake server's own CPU on a small host: a reading, not the ceiling).

Usage: python benchmarks/client_ceiling.py [--concurrency 8,64] [--max-tokens 64] [--duration 10] [--repeats 3]
       python benchmarks/client_ceiling.py --quick   (the unit tier: one short run, checks the figures exist)
Prints measured numbers; asserts nothing beyond the figures being there (--quick).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MODEL = "fake/ceiling"
WORDS = [f"w{i} " for i in range(64)]


# -- the server (its own process) -----------------------------------------------------------------


def _event(payload: dict[str, Any]) -> bytes:
    data = {"id": "chatcmpl-c", "object": "chat.completion.chunk", "model": MODEL, **payload}
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _stream_events(max_tokens: int) -> list[bytes]:
    events = [_event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})]
    events += [
        _event({"choices": [{"index": 0, "delta": {"content": WORDS[i % len(WORDS)]}, "finish_reason": None}]})
        for i in range(max_tokens)
    ]
    events.append(_event({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}))
    usage = {"prompt_tokens": 16, "completion_tokens": max_tokens, "total_tokens": 16 + max_tokens}
    events.append(_event({"choices": [], "usage": usage}))
    events.append(b"data: [DONE]\n\n")
    return events


async def _serve(port_file: Path) -> None:
    cache: dict[int, list[bytes]] = {}
    generated = [0]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            first = head.split(b"\r\n", 1)[0].decode()
            method, path = first.split(" ")[:2]
            length = next(
                (int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")), 0
            )
            body = json.loads(await reader.readexactly(length)) if length else {}
            if method == "POST" and path.endswith("/chat/completions"):
                # vllm bench's chat backend sends max_completion_tokens (the OpenAI name), ours max_tokens
                n = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
                events = cache.setdefault(n, _stream_events(n))
                writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
                for event in events:
                    writer.write(event)
                    await writer.drain()
                generated[0] += n
            else:
                if path.startswith("/v1/models"):
                    text, kind = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}), "json"
                elif path.startswith("/metrics"):
                    text, kind = f'vllm:generation_tokens_total{{model_name="{MODEL}"}} {generated[0]}\n', "plain"
                else:
                    text, kind = "", "plain"
                data = text.encode()
                writer.write(
                    f"HTTP/1.0 200 OK\r\nContent-Type: {'application/json' if kind == 'json' else 'text/plain'}\r\n"
                    f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
                    + data
                )
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    port_file.write_text(str(port))
    async with server:
        await server.serve_forever()


def start_server(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The fake server in its own process; its base URL once it listens."""
    port_file = workdir / "port"
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(port_file)], cwd=REPO)
    deadline = time.monotonic() + 30
    while not port_file.exists() or not port_file.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit("the fake server did not start")
        time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port_file.read_text()}"


# -- the client (a fresh process per run) ----------------------------------------------------------


def client_run(url: str, *, concurrency: int, max_tokens: int, duration: float, out: Path) -> dict[str, Any]:
    """Two `run_load`s in this process: the first as a user's `stackproof load` runs it (its longest
    pause, and its CPU with whatever it does once: connections, lazy imports, the first figures),
    the second the steady state (CPU per token, the ceiling)."""
    sys.path.insert(0, str(REPO))
    from pipeline.matrix.model import LoadSpec
    from verify.load.outcome import LoadTarget
    from verify.load.run import run_load

    spec = LoadSpec(
        questions=256, concurrency=concurrency, max_tokens=max_tokens, duration_s=duration,
        determinism_repeats=0, scrape_interval_s=1.0, seed=0,
    )  # fmt: skip
    runs = []
    for name in ("first", "steady"):
        cpu0 = time.process_time()
        outcome = run_load(LoadTarget(base_url=url, label="ceiling"), spec, out / name, soak=True)
        cpu = time.process_time() - cpu0
        ok = [r for r in outcome.records if r.ok and r.ttft is not None]
        runs.append((outcome, ok, sum(r.output_tokens for r in ok), cpu))
    (first, first_ok, first_tokens, first_cpu), (steady, ok, tokens, cpu) = runs
    return {
        "concurrency": concurrency,
        "max_tokens": max_tokens,
        "requests": len(ok),
        "failed": len(steady.records) - len(ok) + len(first.records) - len(first_ok),
        "output_tokens": tokens,
        "cpu_s": round(cpu, 3),
        "first_cpu_ms_per_1k_tokens": round(1e6 * first_cpu / max(first_tokens, 1), 1),
        "cpu_ms_per_1k_tokens": round(1e6 * cpu / max(tokens, 1), 1),
        "tokens_per_cpu_s": round(tokens / max(cpu, 1e-9)),
        "output_tok_s": round(tokens / max(steady.seconds, 1e-9)),
        "longest_pause_ms": round(1000 * longest_pause(first_ok), 1),
    }


def longest_pause(records: list[Any], *, skip_s: float = 0.5) -> float:
    """The largest gap between consecutive chunk arrivals over all streams, after the first
    `skip_s` of the load (while the slots fill, gaps are the connects')."""
    times: list[float] = []
    for r in records:
        t = r.start + r.ttft
        times.append(t)
        for gap in r.itl:
            t += gap
            times.append(t)
    times.sort()
    if len(times) < 2:
        return 0.0
    start = times[0] + skip_s
    kept = [t for t in times if t >= start]
    return max((b - a for a, b in itertools.pairwise(kept)), default=0.0)


def measure(url: str, *, concurrency: int, max_tokens: int, duration: float, workdir: Path) -> dict[str, Any]:
    argv = [
        sys.executable, __file__, "--client", url, "--concurrency", str(concurrency),
        "--max-tokens", str(max_tokens), "--duration", str(duration), "--out", str(workdir),
    ]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=duration + 300, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the client run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="8,64", help="comma-separated concurrencies")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one 1 s run at concurrency 4 (the unit tier)")
    parser.add_argument("--json", action="store_true", help="the rows as JSON, last line")
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve(args.serve))
        return 0
    if args.client:
        row = client_run(
            args.client,
            concurrency=int(args.concurrency),
            max_tokens=args.max_tokens,
            duration=args.duration,
            out=args.out,
        )
        print(json.dumps(row))
        return 0
    if args.quick:
        args.concurrency, args.duration, args.repeats, args.max_tokens = "4", 1.0, 1, 16
    rows = []
    with tempfile.TemporaryDirectory(prefix="stackproof-ceiling-") as tmp:
        server, url = start_server(Path(tmp))
        try:
            for concurrency in (int(c) for c in args.concurrency.split(",")):
                for repeat in range(args.repeats):
                    workdir = Path(tmp) / f"c{concurrency}-r{repeat}"
                    rows.append(
                        measure(
                            url,
                            concurrency=concurrency,
                            max_tokens=args.max_tokens,
                            duration=args.duration,
                            workdir=workdir,
                        )
                    )
        finally:
            server.kill()
            server.wait()
    _print(rows, args)
    return 0


def _print(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(
        f"load client against an instant fake server (127.0.0.1), {args.max_tokens} output tokens, "
        f"{args.duration:g}s runs, {os.cpu_count()} cores on this host"
    )
    print(f"{'conc':>5} {'first run CPU ms/1k':>20} {'longest pause ms':>17} {'steady CPU ms/1k':>17} "
          f"{'tok per CPU-s':>14} {'tok/s':>8} {'req':>6}")  # fmt: skip
    for concurrency in sorted({r["concurrency"] for r in rows}):
        mine = [r for r in rows if r["concurrency"] == concurrency]
        for r in mine:
            print(
                f"{concurrency:>5} {r['first_cpu_ms_per_1k_tokens']:>20.1f} {r['longest_pause_ms']:>17.1f} "
                f"{r['cpu_ms_per_1k_tokens']:>17.1f} {r['tokens_per_cpu_s']:>14,} {r['output_tok_s']:>8,} "
                f"{r['requests']:>6}"
            )
        if len(mine) > 1:
            med = statistics.median(r["cpu_ms_per_1k_tokens"] for r in mine)
            print(f"{concurrency:>5} median {med:.1f} ms per 1k tokens, ceiling {1e6 / med:,.0f} tokens per CPU-second")
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    raise SystemExit(main())
