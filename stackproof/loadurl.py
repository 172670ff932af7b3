"""`stackproof load`: the load test against a server already running on this machine, judged, its
summary and checks written to OUT/load.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.guard.jsonfile import jsonable
from pipeline.matrix.model import LoadSpec
from pipeline.result import CheckResult
from verify.load.run import LoadTarget, judge_load, run_load, summarise

__all__ = ["load_url"]


def load_url(target: LoadTarget, spec: LoadSpec, out: Path, *, soak: bool) -> tuple[dict[str, Any], list[CheckResult]]:
    """The run's summary and checks (also in `out`/load.json, strict JSON)."""
    outcome = run_load(target, spec, out, soak=soak)
    summary = summarise(outcome, spec)
    checks = judge_load(outcome, summary, batch_invariant=False)
    out.mkdir(parents=True, exist_ok=True)
    document = jsonable({**summary, "checks": checks})
    (out / "load.json").write_text(json.dumps(document, indent=2, allow_nan=False) + "\n")
    return summary, checks
