"""Per-cell degeneration baselines, kept in the tool's cache.

A baseline is keyed by what shapes the answers, not by the stack that produced them: the cell id,
the arm, the model (source and revision), the serve args and env, and the workload fields that
decide the prompts and their lengths. The image is deliberately left out: a new build of the same
cell (another FlashInfer, a patched kernel) is exactly what is compared against the cell's earlier
clean run. Only a clean run records one (every other load check passed), and a baseline is never
overwritten: delete the file (`path_of` prints where) to recalibrate.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from pipeline.cache import cache_dir
from pipeline.guard import boundedio
from pipeline.matrix.model import Arm, Cell, LoadSpec
from verify.load.degeneration import Rates
from verify.load.workload import MAX_QUESTIONS_BYTES

__all__ = ["baseline_key", "path_of", "read_baseline", "record_baseline"]

# Bumped when a detector's definition changes: old baselines then no longer apply.
DETECTORS_VERSION = 1


def baseline_key(cell: Cell, arm: Arm | None, spec: LoadSpec) -> dict[str, Any]:
    """What a baseline is valid for; its sha256 names the file."""
    serve = cell.serve
    return {
        "detectors_version": DETECTORS_VERSION,
        "cell": cell.id,
        "arm": arm.name if arm else None,
        "model": {"source": serve.model.source, "revision": serve.model.revision} if serve else None,
        "args": [*(serve.args if serve else ()), *(arm.args if arm else ())],
        "env": sorted(cell.serve_env(arm).items()),
        "workload": {
            "questions": spec.questions,
            "seed": spec.seed,
            "questions_file": _digest(spec.questions_file),
            "max_tokens": spec.max_tokens,
            "ignore_eos": spec.ignore_eos,
            "determinism_prompts": spec.determinism_prompts,
            "determinism_max_tokens": spec.determinism_max_tokens,
        },
    }


def path_of(key: dict[str, Any], root: Path | None = None) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return (root or cache_dir()) / "degeneration-baselines" / f"{key['cell']}-{digest}.json"


def read_baseline(key: dict[str, Any], root: Path | None = None) -> Rates | None:
    """The recorded baseline, or None (none yet, or an unreadable file: then it is recorded anew)."""
    try:
        data = json.loads(path_of(key, root).read_text())
        return Rates.parse(data["rates"]) if data.get("key") == key else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def record_baseline(key: dict[str, Any], rates: Rates, *, source: str, root: Path | None = None) -> Path | None:
    """Write the baseline atomically; None when the cache is not writable (the run still judges)."""
    path = path_of(key, root)
    document = {"kind": "stackproof.degeneration-baseline", "key": key, "rates": rates.to_json(), "source": source}
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(document, indent=2) + "\n")
        tmp.replace(path)
        return path
    return None


def _digest(path: str | None) -> str | None:
    if path is None:
        return None
    if not os.path.lexists(path):
        return path
    # The questions file was read (bounded) before; read again here, through the same reader.
    return hashlib.sha256(boundedio.read_bytes(Path(path), "questions file", limit=MAX_QUESTIONS_BYTES)).hexdigest()
