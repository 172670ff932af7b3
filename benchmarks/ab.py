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

The A/A false-alarm rate, measured (`--measure-aa CELL`): two servers of the built cell, kept up
(stackproof/ab.py's start_servers), one warm-up pair, then `--repeats` independent A/A runs of
`--pairs` pairs each (measure_slices), every repeat judged by the real judge on its own slices.
Prints how many repeats ended NO CHANGE, UNDECIDED, and with a false alarm (any metric called a
REGRESSION or an IMPROVEMENT of the cell against itself), per metric too; then, from the pooled
pairs' noise, the pairs at which an A/A is called NO CHANGE in 19 of 20 runs, and the pairs a 5%
and a 10% effect need (as above). Writes every repeat's report and the pooled slices to --out.
       python benchmarks/ab.py --measure-aa cpu-tiny-host [--repeats 20] [--pairs 3] [--slice 3]
                               [--concurrency 8] [--max-tokens 16] [--out DIR] [--python PY]
       (a host cell without `install:`, on a GPU host: --python names its environment; the sides
        start apart and the first is restarted there, as `stackproof ab` starts a GPU cell's)

The judge on disjoint windows of long A/A runs (`--windows N AB_JSON...`): the measured pairs of
every report, pooled in their order, cut into windows of N pairs, each judged alone (one look, all
eight metrics): how many windows end NO CHANGE, UNDECIDED or in a false alarm. Then the pooled
pairs judged at once: per metric the offset of B against A with its interval, the start-order
bias the A/A still carries (an A/A of one cell: every change is a bias or noise).
       python benchmarks/ab.py --windows 12 run1/ab.json run2/ab.json run3/ab.json
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
    parser.add_argument("report", type=Path, nargs="*")
    parser.add_argument("--windows", type=int, default=None, metavar="N", help="judge disjoint windows of N pairs")
    parser.add_argument("--quick", action="store_true", help="the noise table of a drawn A/A, 3 trials (the unit tier)")
    parser.add_argument("--python", default=None, help="--measure-aa of a host cell: its environment's interpreter")
    parser.add_argument("--trials", type=int, default=60)
    parser.add_argument("--max-pairs", type=int, default=200)
    parser.add_argument("--measure-aa", metavar="CELL", default=None)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--slice", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--readiness-timeout", type=float, default=1200.0, help="seconds (a loaded host starts slowly)")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from verify.perf.ab import SliceMetrics

    if args.quick:
        args.trials, args.max_pairs = 3, 12
        return _noise_table(args, _drawn_aa(12), 3.0, 22.0)
    if args.windows is not None:
        if not args.report:
            parser.error("--windows N takes the A/A reports (AB_JSON ...) to cut")
        return windows(args.report, args.windows)
    if args.measure_aa:
        slices, slice_s, pairs, fixed_s = measure_aa(args)
        print(f"pooled noise of {len(slices) // 2} A/A pairs of {slice_s:.0f}s slices:")
    elif len(args.report) != 1:
        parser.error("give one A/B report (AB_JSON) or --measure-aa CELL")
    else:
        # The slices and timings only (their schema is the oldest part of ab.json): any A/A run's noise.
        args.report = args.report[0]
        document = json.loads(args.report.read_text())
        slices = [SliceMetrics.from_json(s) for s in document["slices"]]
        slice_s, pairs, seconds = document["config"]["slice_s"], document["config"]["pairs"], document["seconds"]
        fixed_s = max(0.0, seconds - 2 * pairs * slice_s)  # server starts, the warm-up pair, the judge
        print(f"A/A run {args.report}: {document['a']} vs {document['b']}, {pairs} pairs of {slice_s:.0f}s slices, "
              f"{seconds:.0f}s in all; fixed cost (server starts, warm-up pair) {fixed_s:.0f}s")  # fmt: skip
        print(f"A/A verdict as reported: {document['verdict']}")
    return _noise_table(args, slices, slice_s, fixed_s)


def _noise_table(args: argparse.Namespace, slices: list[Any], slice_s: float, fixed_s: float) -> int:
    from verify.perf.ab import METRICS

    print(f"{'metric':<13} {'pair sd':>8}   " + "   ".join(f"{e:.0%} @ {t:.1%}: pairs / time" for e, t in EFFECTS)
          + "   A/A NO CHANGE 19/20 @ 5%")  # fmt: skip
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
        quiet = _pairs_needed(
            metric, centred, 0.0, 0.05, rng, trials=args.trials, limit=args.max_pairs, want="NO CHANGE", power=0.95
        )
        cells.append(
            f"> {args.max_pairs}" if quiet is None else f"{quiet:>3} / {_minutes(fixed_s + 2 * quiet * slice_s)}"
        )
        print(f"{metric.name:<13} {sd:>8.2%}   " + "   ".join(f"{c:<24}" for c in cells))
    for (effect, threshold), n in worst.items():
        print(f"every metric decided, {effect:.0%} effect at threshold {threshold:.1%}: {n} pairs, "
              f"time to verdict {_minutes(fixed_s + 2 * n * slice_s)} at {slice_s:.0f}s slices")  # fmt: skip
    return 0


def _drawn_aa(pairs: int) -> list[Any]:
    """An A/A of `pairs` pairs drawn at the H100's 3% per pair (benchmarks/ab_looks.py), for --quick."""
    from verify.perf.ab import METRICS, SliceMetrics

    rng = np.random.default_rng(0)
    return [
        SliceMetrics(side=side, pair=pair, position=2 * pair + (side == "B"), seconds=3.0, questions=8, faulted=0,
                     values={m.name: float(np.exp(rng.normal(0, 0.03))) for m in METRICS})
        for pair in range(pairs)
        for side in ("A", "B")
    ]  # fmt: skip


def _pair_log_ratios(slices: list[Any], name: str) -> np.ndarray:
    pairs: dict[int, dict[str, float]] = {}
    for s in slices:
        value = s.values.get(name)
        if s.pair >= 0 and value:
            pairs.setdefault(s.pair, {})[s.side] = value
    return np.log(np.array([p["B"] / p["A"] for p in pairs.values() if len(p) == 2]))


def _pairs_needed(
    metric: object, noise: np.ndarray, effect: float, threshold: float, rng: np.random.Generator, *, trials: int,
    limit: int, want: str = "REGRESSION", power: float = POWER,
) -> int | None:  # fmt: skip
    """The smallest n at which the judge calls `want` in `power` of the trials (None: beyond limit)."""
    from verify.perf.ab import AbConfig, Metric, SliceMetrics, judge

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
            hits += verdict.verdict == want
        if hits >= power * trials:
            return n
        n = n + 1 if n < 16 else int(n * 1.25)
    return None


def measure_aa(args: argparse.Namespace) -> tuple[list[Any], float, int, float]:
    """Two servers of the cell kept up; a warm-up pair, then args.repeats A/A runs of args.pairs
    pairs, each judged on its own slices. Prints the tally; returns the pooled measured slices."""
    import contextlib
    import dataclasses
    import tempfile
    import time

    from pipeline.matrix.read import load_matrix
    from stackproof.ab import measure_slices, start_servers
    from stackproof.sides import resolve_side
    from verify.perf.ab import AbConfig, judge, slice_order

    matrix = load_matrix(REPO / "matrix.yaml", images_dir=REPO / "images")
    a, b = (resolve_side(matrix, REPO / "images", args.measure_aa, which, python=args.python) for which in ("A", "B"))
    assert a.cell.serve is not None
    # Two servers compiling at once on two shared cores took more than the cell's 420 s (load average 35).
    serve = dataclasses.replace(a.cell.serve, readiness_timeout_s=args.readiness_timeout)
    a, b = (dataclasses.replace(side, cell=dataclasses.replace(side.cell, serve=serve)) for side in (a, b))
    spec = dataclasses.replace(a.cell.serve.load, concurrency=args.concurrency, max_tokens=args.max_tokens)
    out = args.out or Path(tempfile.mkdtemp(prefix="stackproof-ab-aa-"))
    sides = {"A": a, "B": b}
    started = time.monotonic()
    reports, pooled = [], []
    with contextlib.ExitStack() as stack:
        gpu = a.cell.is_gpu  # started as `stackproof ab` starts a GPU cell's sides (stackproof/ab.py defaults_for)
        servers = start_servers(sides, out_dir=out, stack=stack, apart=gpu, restart_first=gpu)
        fixed_s = time.monotonic() - started
        measure_slices(servers, sides, spec, args.slice, slice_order(0), out / "warm")
        for repeat in range(args.repeats):
            order = [entry for entry in slice_order(args.pairs) if entry[0] >= 0]
            slices = measure_slices(servers, sides, spec, args.slice, order, out / f"repeat{repeat:02d}")
            config = AbConfig(threshold=0.05, confidence=0.95, resamples=4000, slice_s=args.slice, pairs=args.pairs,
                              concurrency=spec.concurrency, seed=repeat, max_tokens=spec.max_tokens)  # fmt: skip
            report = judge(slices, a=a.label, b=b.label, config=config)
            (out / f"repeat{repeat:02d}" / "ab.json").write_text(json.dumps(report.to_json(), indent=2) + "\n")
            reports.append(report)
            # Pairs renumbered across repeats, so the pooled noise keeps every pair apart.
            pooled += [dataclasses.replace(s, pair=s.pair + repeat * args.pairs) for s in slices]
            print(f"repeat {repeat + 1}/{args.repeats}: {report.verdict}", file=sys.stderr)
    _tally(reports, args, out, time.monotonic() - started)
    return pooled, args.slice, args.pairs, fixed_s


def _tally(reports: list[Any], args: argparse.Namespace, out: Path, seconds: float) -> None:
    from verify.perf.ab import METRICS

    n = len(reports)
    verdicts = [r.verdict for r in reports]
    alarms = [r for r in reports if any(m.verdict in ("REGRESSION", "IMPROVEMENT") for m in r.metrics)]
    print(f"A/A {args.measure_aa} vs itself, {n} repeats of {args.pairs} pairs of {args.slice:.0f}s slices "
          f"(concurrency {args.concurrency}, max tokens {args.max_tokens}), both servers kept up, {seconds:.0f}s; "
          f"reports under {out}")  # fmt: skip
    print(f"run verdicts: NO CHANGE {verdicts.count('NO CHANGE')}/{n}, "
          f"UNDECIDED {verdicts.count('UNDECIDED')}/{n}, IMPROVEMENT {verdicts.count('IMPROVEMENT')}/{n}, "
          f"REGRESSION {verdicts.count('REGRESSION')}/{n}")  # fmt: skip
    print(f"false alarms (any metric REGRESSION or IMPROVEMENT): {len(alarms)}/{n} = {len(alarms) / n:.0%}")
    for metric in METRICS:
        got = [next(m for m in r.metrics if m.name == metric.name).verdict for r in reports]
        print(f"  {metric.name:<13} NO CHANGE {got.count('NO CHANGE'):>2}  UNDECIDED {got.count('UNDECIDED'):>2}  "
              f"false alarm {got.count('REGRESSION') + got.count('IMPROVEMENT'):>2}")  # fmt: skip


def pooled_slices(reports: list[Path]) -> list[Any]:
    """The measured slices of every report, in order, their pairs renumbered to stay apart."""
    from verify.perf.ab import SliceMetrics

    pooled: list[Any] = []
    for path in reports:
        measured = [SliceMetrics.from_json(s) for s in json.loads(path.read_text())["slices"] if s["pair"] >= 0]
        base = 1 + max((s.pair for s in pooled), default=-1)
        pooled += [SliceMetrics(**{**s.__dict__, "pair": s.pair + base}) for s in measured]
    return pooled


def windows(reports: list[Path], size: int) -> int:
    """Disjoint windows of `size` pairs judged alone, then the pooled offset (module docstring)."""
    from verify.perf.ab import AbConfig, judge

    slices = pooled_slices(reports)
    pairs = sorted({s.pair for s in slices})
    cuts = [pairs[i : i + size] for i in range(0, len(pairs) - size + 1, size)]
    verdicts, alarms = [], 0
    for number, cut in enumerate(cuts):
        window = [s for s in slices if s.pair in set(cut)]
        config = AbConfig(threshold=0.05, confidence=0.95, resamples=4000, slice_s=0.0, pairs=size, concurrency=1,
                          seed=number, max_tokens=1)  # fmt: skip
        report = judge(window, a="A", b="B", config=config)
        verdicts.append(report.verdict)
        alarms += any(m.verdict in ("REGRESSION", "IMPROVEMENT") for m in report.metrics)
    n = len(cuts)
    print(f"{len(pairs)} A/A pairs from {len(reports)} report(s), {n} disjoint windows of {size} pairs:")
    print(f"  NO CHANGE {verdicts.count('NO CHANGE')}/{n}, UNDECIDED {verdicts.count('UNDECIDED')}/{n}, "
          f"false alarms {alarms}/{n}")  # fmt: skip
    config = AbConfig(threshold=0.05, confidence=0.95, resamples=4000, slice_s=0.0, pairs=len(pairs), concurrency=1,
                      seed=0, max_tokens=1)  # fmt: skip
    print(f"  the offset B vs A over all {len(pairs)} pairs (start-order bias, or noise):")
    for m in judge(slices, a="A", b="B", config=config).metrics:
        if m.change is not None:
            print(f"    {m.name:<13} {m.change:+6.2%} [{m.ci_low:+.2%}, {m.ci_high:+.2%}]  {m.verdict}")
    return 0


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


if __name__ == "__main__":
    raise SystemExit(main())
