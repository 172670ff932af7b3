"""`stackproof model fetch`: fill the host model store with a cell's `hf:` model, once."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stackproof.cli.common import Command, arg, emit, jsonable, load

__all__ = ["COMMANDS"]


def _fetch(args: argparse.Namespace) -> int:
    """Exit 2 for a revision or repository the hub does not have, 3 when the hub cannot be reached."""
    from pipeline.host.modelstore import fetch, store_dir

    matrix, _ = load(args)
    cell = matrix.cell(args.cell)
    store = args.store or store_dir()
    if cell.serve is None or cell.serve.model.kind != "hf":
        source = cell.serve.model.source if cell.serve else "no serve spec"
        print(f"{cell.id}: nothing to fetch ({source}: the model, if any, is in the image)", file=sys.stderr)
        emit(args, {"cell": cell.id, "fetched": False, "store": str(store)}, f"{cell.id}: nothing to fetch")
        return 0
    where = f"{matrix.file}:{cell.line}: cells[{cell.id}].serve.model"
    result = fetch(cell.serve.model, store=store, where=where)
    emit(
        args,
        {"cell": cell.id, "fetched": True, **jsonable(result)},
        f"{cell.id}: {result.repo_id}@{result.revision}: {result.bytes_downloaded:,} bytes downloaded in "
        f"{result.seconds:.1f}s -> {result.snapshot}",
    )
    return 0


COMMANDS = (
    Command(
        path=("model", "fetch"),
        help="download a cell's hf: model at its revision into the store (resumable; 0 bytes when present)",
        handler=_fetch,
        args=(
            arg("cell"),
            arg(
                "--store",
                type=Path,
                default=None,
                help="the store (default: $STACKPROOF_MODEL_STORE, else CACHE_DIR/models)",
            ),
        ),
    ),
)
