"""The load stage's correctness checks: degeneration against the cell's baseline, and the canaries.

`judge_correctness` runs after the load's own checks: it measures the degeneration rates of the
run's answers (`verify/load/degeneration.py`), reads the cell's baseline from the cache
(`verify/load/baselines.py`), records one when there is none and the run was clean, and judges the
canary answers (`verify/load/canary.py`) that `ask_for_cell` collected while the server was up.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from pipeline.matrix.model import Arm, Cell, LoadSpec
from pipeline.result import CheckResult, Status
from verify.load.baselines import baseline_key, path_of, read_baseline, record_baseline
from verify.load.canary import CanaryAnswer, ask_canaries, judge_canaries, read_canaries
from verify.load.degeneration import judge_degeneration, measure
from verify.load.outcome import LoadOutcome
from verify.serving import ServingDriver

__all__ = ["ask_for_cell", "judge_correctness"]

# A run that shows any of these is not clean: it never becomes a cell's baseline.
_NOT_CLEAN = (Status.FAIL, Status.ERROR, Status.INCONCLUSIVE)


def ask_for_cell(base_url: str, outcome: LoadOutcome, spec: LoadSpec, *, driver: ServingDriver) -> list[CanaryAnswer]:
    """The canaries, asked once, when the cell declares a floor (else none: nothing is sent) and
    the load did not end on a server verdict (a stalled or dead engine would only time them out)."""
    if spec.canary_floor is None or outcome.crashed or any(e.type != "UNKNOWN" for e in outcome.events):
        return []
    return ask_canaries(base_url, outcome.model, read_canaries(), timeout=spec.ttft_timeout_s, driver=driver)


def judge_correctness(
    cell: Cell,
    arm: Arm | None,
    spec: LoadSpec,
    outcome: LoadOutcome,
    load_checks: list[CheckResult],
    canary_answers: list[CanaryAnswer],
    *,
    source: str,
    cache_root: Path | None = None,
) -> tuple[list[CheckResult], dict[str, Any]]:
    """The degeneration and canary checks, and the receipt's `correctness` section."""
    rates = measure(outcome.records, [*outcome.determinism_a, *outcome.determinism_b], eos_allowed=not spec.ignore_eos)
    canary = judge_canaries(spec.canary_floor, canary_answers)
    key = baseline_key(cell, arm, spec)
    path = path_of(key, cache_root)
    baseline = read_baseline(key, cache_root)
    recorded = False
    note = ""
    if baseline is None:
        dirty = [c.name for c in [*load_checks, canary] if c.status in _NOT_CLEAN] or (
            ["load-workers"] if outcome.crashed else []
        )
        if dirty:
            note = f"no baseline yet for this cell, and this run is not clean ({', '.join(dirty)}): none recorded"
        elif rates.answers == 0:
            note = "no baseline yet for this cell, and no answer to calibrate on: none recorded"
        else:
            recorded = record_baseline(key, rates, source=source, root=cache_root) is not None
            note = (
                f"no baseline yet for this cell: this first clean run is recorded as its baseline ({path})"
                if recorded
                else f"no baseline yet for this cell, and the cache is not writable ({path}): none recorded"
            )
    checks = [*judge_degeneration(rates, baseline, baseline_note=note), canary]
    section = {
        "rates": rates.to_json(),
        "baseline": {
            "path": str(path),
            "rates": baseline.to_json() if baseline else None,
            "recorded_now": recorded,
            "note": note or None,
        },
        "canary": canary.evidence or {"floor": spec.canary_floor},
        "checks": [asdict(c) for c in checks],
    }
    return checks, section
