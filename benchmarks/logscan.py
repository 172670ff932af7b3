"""`stackproof inspect log` against `grep -E -f <all patterns>` on the same generated 200 MB log.

Goal (issue 26, after issue 14): at least grep's throughput with everything
`inspect log` looks for: the failure classes, startup phases and facts of the diagnosis
(verify/logs/failure_classes.yaml), the whole signature catalog and the built-in rules. Prints MB/s side
by side (best of --repeat runs each); asserts nothing.
Usage: python benchmarks/logscan.py [--mb 200] [--repeat 3]
"""

from __future__ import annotations

import argparse
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "logs" / "vllm-0.28.0-cpu-startup.log"
GOAL = 1.0

# Lines a long-running server writes over and over, and a few it writes once in a while.
STEADY = [
    "(APIServer pid=1) INFO 11-30 10:{m:02d}:{s:02d} [loggers.py:{n}] Engine 000: Avg prompt throughput: {a}.0 "
    "tokens/s, Avg generation throughput: {b}.4 tokens/s, Running: 4 reqs, Waiting: 0 reqs, GPU KV cache usage: 3.1%",
    '(APIServer pid=1) INFO:     127.0.0.1:{n} - "POST /v1/chat/completions HTTP/1.1" 200 OK',
    '(APIServer pid=1) INFO:     127.0.0.1:{n} - "GET /metrics HTTP/1.1" 200 OK',
    "(EngineCore pid=24) DEBUG 11-30 10:{m:02d}:{s:02d} [core.py:{n}] EngineCore loop step {a}, scheduled {b} tokens",
]
RARE = [
    "(EngineCore pid=24) WARNING 11-30 10:00:01 [autotuner.py:1688] [AutoTuner]: No tuned config covers fp8_gemm "
    "input_shapes=((1, 8193, 5120),); falling back to runner=CutlassFp8GemmRunner tactic=-1.",
    "(EngineCore pid=24) ERROR 11-30 10:00:02 [core.py:900] RuntimeError: CUDA error: "
    "an illegal memory access was encountered",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from verify.logs.catalog import Facts, load_catalog, rules_for
    from verify.logs.classes import scan_rules

    patterns = [r.pattern for r in scan_rules()]
    patterns += [r.pattern for r in rules_for(None, None, Facts(serve=True, arch=""))]
    for sig in load_catalog():
        patterns += [p for p in (sig.match, sig.first, sig.then) if p]
    with tempfile.TemporaryDirectory(prefix="stackproof-logscan-") as tmp:
        log = Path(tmp) / "server.log"
        size = generate(log, args.mb * 1_000_000)
        ere = Path(tmp) / "patterns.ere"
        ere.write_text("".join(to_ere(p) + "\n" for p in patterns))
        inspect = [sys.executable, "-m", "pipeline", "inspect", "log", str(log), "--json"]
        ours = best(args.repeat, inspect, ok=(0, 1))
        fallback = best(1, ["env", "STACKPROOF_NO_HYPERSCAN=1", *inspect], ok=(0, 1))
        grep = best(args.repeat, ["grep", "-E", "-n", "-f", str(ere), str(log)], ok=(0, 1))
        grep_lines = subprocess.run(["grep", "-E", "-c", "-f", str(ere), str(log)], capture_output=True, text=True)
    mb = size / 1e6
    rows = [
        ("log size (MB)", f"{mb:.0f}", f"{len(patterns)} patterns (diagnosis + rules + catalog)"),
        ("stackproof inspect log (MB/s)", f"{mb / ours:.0f}", f"best of {args.repeat}: {ours:.2f}s"),
        ("  without Hyperscan: bytes.find per literal (MB/s)", f"{mb / fallback:.0f}", f"once: {fallback:.2f}s"),
        (
            "grep -E -f (MB/s)",
            f"{mb / grep:.0f}",
            f"best of {args.repeat}: {grep:.2f}s, {grep_lines.stdout.strip()} lines",
        ),
        ("ours / grep", f"{grep / ours:.2f}", f"goal >= {GOAL}"),
    ]
    print("\nstackproof log scan benchmark")
    width = max(len(r[0]) for r in rows)
    for name, value, note in rows:
        print(f"  {name:<{width}}  {value:>8}  {note}")
    return 0


def generate(path: Path, target: int) -> int:
    """A deterministic log: the real CPU startup log, then steady-state lines with rare events."""
    rng = random.Random(0)
    header = FIXTURE.read_text() if FIXTURE.exists() else ""
    block = []
    for i in range(20000):
        line = STEADY[i % len(STEADY)].format(
            m=i % 60, s=(i * 7) % 60, n=rng.randrange(10000, 60000), a=rng.randrange(100), b=rng.randrange(1000)
        )
        block.append(line)
    chunk = ("\n".join(block) + "\n").encode()
    with path.open("wb") as f:
        f.write(header.encode())
        written = len(header)
        k = 0
        while written < target:
            f.write(chunk)
            written += len(chunk)
            if k % 5 == 0:
                rare = (RARE[(k // 5) % len(RARE)] + "\n").encode()
                f.write(rare)
                written += len(rare)
            k += 1
    return path.stat().st_size


def to_ere(pattern: str) -> str:
    """Our Python regexes as POSIX ERE for GNU grep."""
    text = re.sub(r"\(\?P<\w+>", "(", pattern).replace("(?:", "(")
    text = text.replace("[^\\n]", ".")  # grep reads line by line: "not a newline" is any character
    text = text.replace(r"\d", "[0-9]").replace(r"\S", "[^[:space:]]").replace(r"\w", "[[:alnum:]_]")
    text = text.replace(r"\s", "[[:space:]]").replace("*?", "*").replace("+?", "+")
    return text


def best(repeat: int, argv: list[str], ok: tuple[int, ...]) -> float:
    times = []
    for _ in range(repeat):
        started = time.monotonic()
        # Output goes to a pipe, not /dev/null: GNU grep stops at the first match when it sees
        # its output is /dev/null, which would time nothing.
        proc = subprocess.run(argv, cwd=REPO, capture_output=True)
        times.append(time.monotonic() - started)
        if proc.returncode not in ok:
            sys.exit(f"{argv[0]} failed: {proc.stderr.decode()[-2000:]}")
    return min(times)


if __name__ == "__main__":
    raise SystemExit(main())
