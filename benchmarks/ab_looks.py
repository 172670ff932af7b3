"""What the GPU defaults of `stackproof ab` (3 s slices, 12 pairs doubling to 96) give on the H100's
measured noise, before and after the start-order offset is removed: the judge, unchanged, on drawn pairs.

Each simulated run draws every metric's per-pair log ratio B/A from a normal with the H100's
per-pair sd (shared/reference/gpu-docker.md, section 3: 30 A/A pairs pooled, 3 s slices) plus an
offset, and runs the command's schedule: judged at 12 pairs, and while any metric is UNDECIDED at
24, 48, 96 (verify/perf/ab.py `look_sizes`, `decided`, `judge` with `looks` = 4). Metrics are drawn
independently (the real ones correlate, which makes the run's verdicts move together: a
conservative picture of the family-wise rate). Three cases:

- A/A, with the offset the H100 showed (the server started second, on a warm JIT cache, faster:
  tok/s +2.3%, TPOT p50 -1.6%, TPOT p90 -5.1%): what an A/A on the GPU gave before this change;
- A/A without it (the sides started apart and the first restarted: the same caches on both);
- a known 10% regression of tok/s and TPOT (A/B), to show the schedule stops early when it can.

Prints, per case: the run verdicts (NO CHANGE, UNDECIDED, IMPROVEMENT/REGRESSION = a false alarm in
an A/A), the pairs and minutes to a verdict (6.7 s a pair, as measured there: two 3 s slices and the
client's set-up), and the metrics left undecided. Asserts nothing.

Usage: python benchmarks/ab_looks.py [--trials 100] [--seed 0]
       python benchmarks/ab_looks.py --quick   (the unit tier: 3 trials a case)
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
# Per-pair sd of log(B/A), H100, 30 A/A pairs of 3 s slices (shared/reference/gpu-docker/ab-noise-table.txt).
H100_NOISE = {
    "ttft_p50": 0.0729,
    "ttft_p90": 0.0607,
    "tpot_p50": 0.0244,
    "tpot_p90": 0.0809,
    "itl_p50": 0.0251,
    "itl_p90": 0.0854,
    "e2el_p50": 0.0231,
    "output_tok_s": 0.0364,
}
# B vs A of the server started second (warm JIT cache), same section: about 3.5 standard errors.
H100_START_OFFSET = {"output_tok_s": 0.023, "tpot_p50": -0.016, "tpot_p90": -0.051}
REGRESSION_10 = {"output_tok_s": -0.10, "tpot_p50": 0.10, "tpot_p90": 0.10, "itl_p50": 0.10, "e2el_p50": 0.10}
PAIR_S = 6.7  # seconds per measured pair on the H100 (3 s slices)
FIXED_S = 22.0  # the warm-up pair and the judge, same run (starts not counted: they are the servers')


def one_run(offset: dict[str, float], rng: np.random.Generator, *, pairs: int, max_pairs: int, seed: int) -> Any:
    """The command's schedule on drawn pairs: (the last look's report, the pairs it took)."""
    sys.path.insert(0, str(REPO))
    from verify.perf.ab import AbConfig, SliceMetrics, decided, judge, look_sizes

    sizes = look_sizes(pairs, max_pairs)
    config = AbConfig(threshold=0.05, confidence=0.95, resamples=2000, slice_s=3.0, pairs=pairs, concurrency=8,
                      seed=seed, max_tokens=64, resolution_ms=0.0, looks=len(sizes), max_pairs=sizes[-1])  # fmt: skip
    slices: list[SliceMetrics] = []
    done, report = 0, None
    for size in sizes:
        for pair in range(done, size):
            ratios = {m: math.exp(offset.get(m, 0.0) + rng.normal(0, sd)) for m, sd in H100_NOISE.items()}
            slices.append(SliceMetrics(side="A", pair=pair, position=2 * pair, seconds=3.0, questions=8, faulted=0,
                                       values=dict.fromkeys(H100_NOISE, 1.0)))  # fmt: skip
            slices.append(SliceMetrics(side="B", pair=pair, position=2 * pair + 1, seconds=3.0, questions=8,
                                       faulted=0, values=dict(ratios)))  # fmt: skip
        done = size
        report = judge(slices, a="A", b="B", config=AbConfig(**{**config.__dict__, "pairs": size}))
        if decided(report):
            break
    return report, done


def simulate(trials: int, seed: int, *, pairs: int = 12, max_pairs: int = 96) -> dict[str, dict[str, Any]]:
    cases = {
        "A/A, start-order offset (before)": H100_START_OFFSET,
        "A/A, no offset (apart + restart)": {},
        "A/B, 10% regression": REGRESSION_10,
    }
    rng = np.random.default_rng(seed)
    results = {}
    for name, offset in cases.items():
        verdicts: Counter[str] = Counter()
        undecided: Counter[str] = Counter()
        used = []
        for trial in range(trials):
            report, took = one_run(offset, rng, pairs=pairs, max_pairs=max_pairs, seed=seed + trial)
            verdicts[report.verdict] += 1
            undecided.update(m.name for m in report.metrics if m.verdict == "UNDECIDED")
            used.append(took)
        results[name] = {"verdicts": verdicts, "undecided": undecided, "pairs": used, "trials": trials}
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pairs", type=int, default=12)
    parser.add_argument("--max-pairs", type=int, default=96)
    parser.add_argument("--quick", action="store_true", help="3 trials a case (the unit tier)")
    args = parser.parse_args()
    trials = 3 if args.quick else args.trials
    results = simulate(trials, args.seed, pairs=args.pairs, max_pairs=args.max_pairs)
    print(f"stackproof ab's schedule ({args.pairs} pairs doubling to {args.max_pairs}, threshold 5%, run confidence "
          f"95%) on the H100's per-pair noise, {trials} simulated runs a case")  # fmt: skip
    for name, r in results.items():
        n, v = r["trials"], r["verdicts"]
        alarms = v["REGRESSION"] + v["IMPROVEMENT"]
        median = statistics.median(r["pairs"])
        print(f"{name}:")
        print(f"  verdicts: NO CHANGE {v['NO CHANGE']}/{n}, UNDECIDED {v['UNDECIDED']}/{n}, "
              f"REGRESSION {v['REGRESSION']}/{n}, IMPROVEMENT {v['IMPROVEMENT']}/{n}"
              + ("" if "A/B" in name else f"  (false alarms {alarms}/{n})"))  # fmt: skip
        print(f"  pairs to the verdict: median {median:g} (min {min(r['pairs'])}, max {max(r['pairs'])}), "
              f"{(FIXED_S + PAIR_S * median) / 60:.1f} min at {PAIR_S} s a pair")  # fmt: skip
        looks = Counter(r["pairs"])
        print("  runs decided by look: " + ", ".join(f"{size} pairs {looks[size]}/{n}" for size in sorted(looks)))
        if r["undecided"]:
            print("  left UNDECIDED: " + ", ".join(f"{m} {c}/{n}" for m, c in r["undecided"].most_common()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
