"""Allocator churn per GEMM call over M buckets, on the GPU this runs on (flashinfer-ai/flashinfer#4549).

    python3 benchmarks/h200_host/churn.py --out DIR [--n 5120 --k 34816] [--m 1,2,...] [--threshold-bytes N]
    python3 benchmarks/h200_host/churn.py --judge DIR/churn-probe.json     # judge a recorded run, no GPU

Needs torch with CUDA (FlashInfer where installed: without it only torch.mm is measured, and each
FlashInfer GEMM says why it was not). Measures with verify/probes/churn_probe.py, judges with
verify/kernels/churn.py (both stdlib + torch; nothing else of stackproof's is imported), prints the table
and writes DIR/churn-probe.json (the raw counters) and DIR/churn.json (the verdicts). On SM90 (the
H200) mm_fp4 is reported as not available: the baseline there is torch.mm and bmm_fp8, whose
steady-state calls are expected to allocate nothing beyond their output.

The default shape is the incident's (K=5120, N=34816: a 27B model's NVFP4 MLP, #4550's table).
Exit 0 measured (whatever the verdicts), 2 bad input, 3 no torch or no CUDA device.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from verify.kernels.churn import DEFAULT_THRESHOLD, ChurnInputError, judge_churn, render_table, summary  # noqa: E402
from verify.probes import churn_probe  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="where churn-probe.json and churn.json are written")
    parser.add_argument("--judge", type=Path, help="judge this recorded churn-probe.json instead of measuring")
    parser.add_argument("--n", type=int, default=34816)
    parser.add_argument("--k", type=int, default=5120)
    parser.add_argument("--m", default=",".join(map(str, churn_probe.DEFAULT_BUCKETS)))
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threshold-bytes", type=int, default=DEFAULT_THRESHOLD)
    args = parser.parse_args(argv)
    if (args.out is None) == (args.judge is None):
        print("churn: give --out DIR (measure) or --judge FILE (judge a recorded run)", file=sys.stderr)
        return 2
    if args.judge is not None:
        return _judge_file(args.judge, args.threshold_bytes)
    try:
        buckets = tuple(int(m) for m in args.m.split(",") if m.strip())
    except ValueError:
        print(f"churn: --m {args.m!r}: not a comma-separated list of integers", file=sys.stderr)
        return 2
    try:
        document = churn_probe.measure(n=args.n, k=args.k, buckets=buckets, calls=args.calls, warmup=args.warmup)
    except churn_probe.NoCuda as exc:
        print(f"churn: {exc}", file=sys.stderr)
        return 3
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "churn-probe.json").write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    return _report(document, args.threshold_bytes, args.out)


def _judge_file(path: Path, threshold: int) -> int:
    try:
        document = json.loads(path.read_text())
        return _report(document, threshold, None)
    except (OSError, ValueError) as exc:
        print(f"churn: {path}: {exc}", file=sys.stderr)
        return 2


def _report(document: dict, threshold: int, out: Path | None) -> int:
    try:
        verdicts = judge_churn(document, threshold)
    except ChurnInputError as exc:
        print(f"churn: {exc}", file=sys.stderr)
        return 2
    print(
        f"{document.get('gpu')} ({document.get('arch')}), torch {document.get('torch')}, "
        f"FlashInfer {document.get('flashinfer') or 'not installed: ' + str(document.get('flashinfer_error'))}, "
        f"N={document.get('n')} K={document.get('k')}, "
        f"{document.get('calls')} calls after {document.get('warmup')} warm-up"
    )
    print(render_table(verdicts, threshold))
    if out is not None:
        result = {
            "threshold_bytes": threshold,
            "incident": "flashinfer-ai/flashinfer#4549",
            "summary": summary(verdicts),
            "verdicts": [v.to_json() for v in verdicts],
        }
        (out / "churn.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
        print(f"wrote {out / 'churn-probe.json'} and {out / 'churn.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
