"""`stackproof fleet run [CELL...] --scheduler slurm --site FILE`: one scheduler job per cell (docs/fleet.md).

Live progress per cell on stderr; at the end a summary table, each cell's fleet receipt, the matrix
page of the receipts gathered (SHARED/fleet-*/site/index.html). Exit: the worst cell's (0 all
passed, 1 a check failed, 3 a fault: cancelled, timed out, lost with its node, or a job that could not
verify); 2 bad input, nothing submitted (a cell no node serves, a bad site file); 130 interrupted,
every unfinished job cancelled first.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from pipeline.errors import InputError
from stackproof.cli.common import Command, arg, emit, load

__all__ = ["COMMANDS"]


def _fleet_run(args: argparse.Namespace) -> int:
    from pipeline.fleet.site import load_fleet_site
    from pipeline.fleet.slurm import Slurm
    from stackproof.fleetjob import run_fleet

    matrix, images = load(args)
    for cell in args.cells:
        matrix.cell(cell)  # an unknown cell is exit 2 before the site is read
    site = load_fleet_site(args.site)
    if site.scheduler != args.scheduler:
        raise InputError(f"{args.site}: scheduler {site.scheduler!r}, but --scheduler {args.scheduler}")
    run = run_fleet(
        matrix,
        list(args.cells),
        site,
        Slurm(),
        matrix_file=args.matrix,
        images=images,
        stages=args.stages,
        poll_s=args.poll,
    )
    page = _page(run.folder, [c.id for c in matrix.cells])
    rows = [r.to_json() for r in run.cells]
    document = {"folder": str(run.folder), "exit_code": run.exit_code, "page": page, "cells": rows}
    emit(args, document, _table(rows, page))
    return run.exit_code


def _page(folder: Path, cells: list[str]) -> str | None:
    """The matrix page of the receipts the jobs wrote (none: no page, said in the table)."""
    from stackproof.site_report.model import build_site
    from stackproof.site_report.render import render_site
    from stackproof.site_report.sources import receipts_from_dirs
    from stackproof.site_report.write import write_site

    if not any(folder.glob("*/out/*/run-*/receipt.json")):
        return None
    site = build_site(receipts_from_dirs([folder]), cells=cells, cell_arch={})
    files = render_site(site, generated_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), fixtures=None)
    write_site(files, folder / "site")
    return str(folder / "site" / "index.html")


def _table(rows: list[dict[str, object]], page: str | None) -> str:
    lines = [f"{'cell':<28} {'status':<14} {'job':>6} {'node':<8} {'state':<12} {'dispatch':>8}  reason"]
    for row in rows:
        s = row["scheduler"]
        t = row["times"]
        assert isinstance(s, dict) and isinstance(t, dict)
        dispatch = "-" if t["dispatch_s"] is None else f"{t['dispatch_s']:.1f}s"
        lines.append(
            f"{row['cell']!s:<28} {row['status']!s:<14} {s['job_id']!s:>6} {s['node'] or '-'!s:<8} "
            f"{s['state'] or '-'!s:<12} {dispatch:>8}  {s['reason'] or ''}"
        )
    lines.append(f"matrix page: {page}" if page else "matrix page: none (no job wrote a verification receipt)")
    return "\n".join(lines)


COMMANDS = (
    Command(
        path=("fleet", "run"),
        help="verify cells on a cluster: one scheduler job per cell, placed by a fleet site file",
        handler=_fleet_run,
        args=(
            arg("cells", nargs="*", metavar="CELL", help="cells to run (default: every cell of the matrix)"),
            arg("--scheduler", choices=("slurm",), required=True, help="the cluster's scheduler"),
            arg("--site", type=Path, required=True, metavar="FILE", help="the fleet site file (docs/fleet.md)"),
            arg("--stages", default=None, help="stages each job runs (default: all)"),
            arg("--poll", type=float, default=1.0, help="seconds between state polls (default 1)"),
        ),
    ),
)
