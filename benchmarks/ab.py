"""How long `stackproof ab` takes to a verdict, and how many slice pairs a 5% and a 10% effect need,
from the noise of a real A/A run (its ab.json).

For each metric the A/A run's per-pair log ratios B/A are the host's noise. A planted effect is
added to pairs resampled from that noise and the real judge (verify/ab.judge) is asked, for n = 2,
3, ... pairs, until it calls REGRESSION in at least 80% of the trials: that n is the pairs needed.
A 10% effect is judged against the default 5% threshold; a 5% effect sits on that threshold (never
decidable there), so it is judged against 2.5%. Time to a verdict is the A/A run's fixed cost
(two server starts, the warm-up pair) plus two slices per pair. Prints measured numbers; asserts
nothing.
Usage: python benchmarks/ab.py AB_JSON [--trials 60] [--max-pairs 200]
       (AB_JSON: `stackproof ab cpu-tiny-host cpu-tiny-host --json`'s report, e.g.
        stackproof-out/ab/ab-*/ab.json)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
POWER = 0.8
EFFECTS = ((0.10, 0.05), (0.05, 0.025))  # (planted effect, threshold it is judged against)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--trials", type=int, default=60)
    parser.add_argument("--max-pairs", type=int, default=200)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from verify.ab import METRICS, SliceMetrics

    # The slices and timings only (their schema is the oldest part of ab.json): any A/A run's noise.
    document = json.loads(args.report.read_text())
    slices = [SliceMetrics.from_json(s) for s in document["slices"]]
    slice_s, pairs, seconds = document["config"]["slice_s"], document["config"]["pairs"], document["seconds"]
    fixed_s = max(0.0, seconds - 2 * pairs * slice_s)  # server starts, the warm-up pair, the judge
    print(f"A/A run {args.report}: {document['a']} vs {document['b']}, {pairs} pairs of {slice_s:.0f}s slices, "
          f"{seconds:.0f}s in all; fixed cost (server starts, warm-up pair) {fixed_s:.0f}s")  # fmt: skip
    print(f"A/A verdict as reported: {document['verdict']}")
    print(f"{'metric':<13} {'pair sd':>8}   " + "   ".join(f"{e:.0%} @ {t:.1%}: pairs / time" for e, t in EFFECTS))
    rng = np.random.default_rng(0)
    worst = dict.fromkeys(EFFECTS, 0)
    for metric in METRICS:
        noise = _pair_log_ratios(slices, metric.name)
        if len(noise) < 2:
            print(f"{metric.name:<13} {'-':>8}   (fewer than 2 pairs measured it)")
            continue
        centred = noise - noise.mean()
        sd = float(centred.std(ddof=1))
        cells = []
        for effect, threshold in EFFECTS:
            n = _pairs_needed(metric, centred, effect, threshold, rng, trials=args.trials, limit=args.max_pairs)
            worst[(effect, threshold)] = max(worst[(effect, threshold)], n or args.max_pairs)
            cells.append(f"> {args.max_pairs}" if n is None else f"{n:>3} / {_minutes(fixed_s + 2 * n * slice_s)}")
        print(f"{metric.name:<13} {sd:>8.2%}   " + "   ".join(f"{c:<24}" for c in cells))
    for (effect, threshold), n in worst.items():
        print(f"every metric decided, {effect:.0%} effect at threshold {threshold:.1%}: {n} pairs, "
              f"time to verdict {_minutes(fixed_s + 2 * n * slice_s)} at {slice_s:.0f}s slices")  # fmt: skip
    return 0


def _pair_log_ratios(slices: list[Any], name: str) -> np.ndarray:
    pairs: dict[int, dict[str, float]] = {}
    for s in slices:
        value = s.values.get(name)
        if s.pair >= 0 and value:
            pairs.setdefault(s.pair, {})[s.side] = value
    return np.log(np.array([p["B"] / p["A"] for p in pairs.values() if len(p) == 2]))


def _pairs_needed(
    metric: object, noise: np.ndarray, effect: float, threshold: float, rng: np.random.Generator, *, trials: int,
    limit: int,
) -> int | None:  # fmt: skip
    """The smallest n at which the judge calls REGRESSION in POWER of the trials (None: beyond limit)."""
    from verify.ab import AbConfig, Metric, SliceMetrics, judge

    assert isinstance(metric, Metric)
    shift = math.log(1 + effect) * (1 if metric.higher_is_worse else -1)
    n = 2
    while n <= limit:
        hits = 0
        for trial in range(trials):
            draws = rng.choice(noise, size=n) + shift
            slices = []
            for pair, r in enumerate(draws):
                for side, value in (("A", 1.0), ("B", float(np.exp(r)))):
                    slices.append(
                        SliceMetrics(
                            side=side,
                            pair=pair,
                            position=2 * pair,
                            seconds=0.0,
                            questions=1,
                            faulted=0,
                            values={metric.name: value},
                        )
                    )
            # A is 1.0 here, not a latency in ms: the resolution floor has no meaning (resolution_ms=0).
            config = AbConfig(threshold=threshold, confidence=0.95, resamples=1000, slice_s=1.0, pairs=n,
                              concurrency=1, seed=trial, max_tokens=1, resolution_ms=0.0)  # fmt: skip
            verdict = next(m for m in judge(slices, a="a", b="b", config=config).metrics if m.name == metric.name)
            hits += verdict.verdict == "REGRESSION"
        if hits >= POWER * trials:
            return n
        n = n + 1 if n < 16 else int(n * 1.25)
    return None


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


if __name__ == "__main__":
    raise SystemExit(main())
