"""The receipt's `cost` and `forensics` sections, read from the load stage's summary (pure).

`cost` is the load's (verify/forensics/gpucost.py) plus `gpu_seconds_verifying`: the verification's wall
clock times the GPUs the server used, i.e. what the cell cost the runner, not only the load.
`forensics` lists every stall the watchdog documented, each with its files relative to the run
directory. Both are present on every receipt; where they are empty they say why.
"""

from __future__ import annotations

from typing import Any

from pipeline.findings import LoadSection
from verify.forensics.gpucost import empty_cost_section

__all__ = ["cost_and_forensics"]


def cost_and_forensics(load: LoadSection | None, *, seconds: float) -> dict[str, Any]:
    if load is None:
        cost = empty_cost_section("no load stage ran (or it wrote no summary)")
    else:
        cost = dict(load.cost or empty_cost_section("this load summary predates cost sampling"))
    gpus = len(cost.get("gpus") or [])
    if gpus:
        cost["gpu_seconds_verifying"] = {"value": round(seconds * gpus, 3), "unit": "GPU-s"}
    else:
        cost["gpu_seconds_verifying"] = {"value": None, "unit": "GPU-s", "reason": cost.get("reason") or "no GPU"}
    stalls = [
        {"type": e.get("type"), "at": e.get("at"), "reason": e.get("reason"), **(e.get("forensics") or {})}
        for e in (load.summary.events if load else ())
        if e.get("forensics") is not None
    ]
    return {"cost": cost, "forensics": stalls}
