"""`stackproof ci-matrix`: the GitHub Actions matrix of the cells, all of them or those changed since a commit.

The matrix logic is pure (`pipeline.matrix.cimatrix`); this module is its edge: it reads the matrix as
it was at the older commit and the files changed since, through git (`pipeline.cmd.run`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from pipeline.matrix.cimatrix import github_matrix, include_entries
from stackproof.cichanges import changes_since
from stackproof.cli.common import Command, arg

__all__ = ["COMMANDS"]


def _ci_matrix(args: argparse.Namespace) -> int:
    from pipeline.matrix.read import load_matrix

    images = args.images or args.matrix.parent / "images"
    matrix = load_matrix(args.matrix, images_dir=images)
    ids = [matrix.cell(c).id for c in args.cells] if args.cells else [c.id for c in matrix.cells]
    reasons: dict[str, tuple[str, ...]] = {}
    if args.changed_since is not None:
        reasons = {c.cell: c.reasons for c in changes_since(matrix, images, args.changed_since)}
        ids = [i for i in ids if i in reasons]
    from pipeline.matrix.runners import load_runner_labels

    # Only the label mapping of the site settings: the plan job has no mirrors or CA bundle to check.
    labels_file = os.environ.get("STACKPROOF_RUNNER_LABELS")
    entries = include_entries(matrix, ids, load_runner_labels(Path(labels_file), matrix) if labels_file else None)

    if args.json:
        for entry in entries:
            if entry.cell in reasons:
                print(f"ci-matrix: {entry.cell}: {'; '.join(reasons[entry.cell])}", file=sys.stderr)
        print(json.dumps(github_matrix(entries), indent=2))
        return 0
    rows = [
        (e.cell, e.arch, e.platform, ",".join(e.runs_on), e.expect or "-", "; ".join(reasons.get(e.cell, ())))
        for e in entries
    ]
    header = ("cell", "arch", "platform", "runs-on", "expect", "why" if args.changed_since is not None else "")
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    for row in (header, *rows) if rows else ():
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    since = f", changed since {args.changed_since}" if args.changed_since is not None else ""
    print(f"{len(entries)} of {len(matrix.cells)} cells selected{since}")
    return 0


COMMANDS = (
    Command(
        path=("ci-matrix",),
        help="the GitHub Actions matrix ({include: [...]}) of the cells to verify",
        handler=_ci_matrix,
        args=(
            arg("cells", nargs="*", help="only these cells (default: every cell)"),
            arg(
                "--changed-since",
                metavar="REF",
                default=None,
                help="only cells whose resolved definition or build inputs changed since the commit REF",
            ),
        ),
    ),
)
