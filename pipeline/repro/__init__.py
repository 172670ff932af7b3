"""`stackproof repro`: turn what a bug reporter pasted into a cell of matrix.yaml.

Three steps, each pure:
1. `parse_source(text, name) -> Report`: what the source states, each value with the line it
   stands on, plus what the source is silent or ambiguous about. Four kinds of source: the output
   of `vllm collect-env` (often inside an issue body, with a `docker run`/`vllm serve` line), a
   plain environment block (`GPU: ...`, `Driver: ...`, `FlashInfer: ...`), a `pip freeze`, and the
   JSON of `stackproof doctor` (or of `verify/probes/doctor_probe.py`).
2. `plan_repro(report, matrix) -> ReproPlan`: the GPU arch and platform, and the base: the cell
   doctor ran in, else vLLM's release image when the report says it ran it, else a documented
   fallback (docs/repro.md).
3. `build_repro(report, matrix, plan, base_pins) -> ReproCell`: overrides for every reported
   version that differs from the base's pins (pipeline/releases/pins.py finds those), each from its index;
   the serve spec; the host expectations; every finding. `ReproCell.yaml()` renders it.

The modules, each importing only from those listed before it:
- `facts`: what a source states (`Seen`, `Kind`, `Finding`, `Gpu`, `Report`).
- `util`: small helpers the others share.
- `commands`: `docker run ...` / `vllm serve ...` commands inside a report.
- `doctor_json`, `collect_env`, `env_block`, `pip_freeze`: one parser per kind of source.
- `parse`: `parse_source`, which recognises the kind and picks the parser.
- `geometry`: arch, platform and base (`plan_repro`).
- `cell`: the cell and its matrix.yaml text (`build_repro`, `ReproCell`).
"""

from __future__ import annotations

from pipeline.repro.cell import ReproCell, build_repro
from pipeline.repro.doctor_json import cudnn_version_text
from pipeline.repro.facts import Finding, Gpu, Kind, Report, Seen
from pipeline.repro.geometry import ReproPlan, arch_of_gpu, image_env, plan_repro, runner_labels
from pipeline.repro.parse import parse_source

__all__ = [
    "Finding",
    "Gpu",
    "Kind",
    "Report",
    "ReproCell",
    "ReproPlan",
    "Seen",
    "arch_of_gpu",
    "build_repro",
    "cudnn_version_text",
    "image_env",
    "parse_source",
    "plan_repro",
    "runner_labels",
]
