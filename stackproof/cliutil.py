"""What every command handler shares: load the matrix named by the common options, print a result.

Kept apart from `stackproof.cli` so that command groups in their own modules (publish, ci-matrix,
repro) use it without importing the parser that imports them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from pipeline.guard.jsonfile import jsonable
from pipeline.matrix.model import Matrix

__all__ = ["NO_PREFLIGHT_HELP", "emit", "jsonable", "load"]

NO_PREFLIGHT_HELP = "GPU cells: skip the host checks (GPU, compute capability, driver CUDA, NVIDIA runtime, disk)"


def load(args: argparse.Namespace) -> tuple[Matrix, Path]:
    """The matrix from `--matrix` (validated) and the images directory (`--images`, else beside it)."""
    from pipeline.matrix.read import load_matrix

    images = args.images or args.matrix.parent / "images"
    return load_matrix(args.matrix, images_dir=images), images


def emit(args: argparse.Namespace, document: Any, text: str) -> None:
    """One JSON document on stdout with `--json`, else the human text. The document is strict JSON:
    NaN and infinities (which strict parsers reject) are written as null."""
    if args.json:
        print(json.dumps(jsonable(document), indent=2, allow_nan=False))
        args.emitted = True  # a command that reports, then fails (doctor, exit 3), printed its one document
    else:
        print(text)
