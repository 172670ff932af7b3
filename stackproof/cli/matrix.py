"""`stackproof matrix validate|list|show|audit`: read the matrix, and audit its cells against their wheels."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from stackproof.cli.common import Command, arg
from stackproof.cli.common import emit as _emit
from stackproof.cli.common import jsonable as _jsonable
from stackproof.cli.common import load as _load

__all__ = ["COMMANDS"]


def _matrix_validate(args: argparse.Namespace) -> int:
    matrix, _ = _load(args)
    notes = [f"{matrix.file}:{c.line}: cells[{c.id}]: note: {n}" for c in matrix.cells for n in c.notes]
    for note in notes:
        print(note, file=sys.stderr)
    _emit(
        args,
        {"file": str(matrix.file), "valid": True, "cells": len(matrix.cells), "notes": notes},
        f"{matrix.file}: valid, {len(matrix.cells)} cells",
    )
    return 0


def _matrix_list(args: argparse.Namespace) -> int:
    matrix, _ = _load(args)
    rows = [
        {
            "id": c.id,
            "arch": c.arch,
            "platform": c.platform,
            "base": c.base.name,
            "engine": c.serve.engine if c.serve else None,  # the serving engine; None: the cell serves nothing
            "runner": list(c.runner),
            "arms": [a.name for a in c.arms],
            "expect": c.expect.stage if c.expect else None,
        }
        for c in matrix.cells
    ]
    width = max((len(r["id"]) for r in rows), default=4)  # type: ignore[arg-type]
    lines = [
        f"{r['id']:<{width}}  {r['arch']:<6} {r['platform']:<12} {r['engine'] or '-':<7} {r['base']:<20} "
        f"{','.join(r['runner'])}" + (f"  expect fail at {r['expect']}" if r["expect"] else "")  # type: ignore[arg-type]
        for r in rows
    ]
    _emit(args, {"cells": rows}, "\n".join(lines))
    return 0


def _matrix_show(args: argparse.Namespace) -> int:
    matrix, _ = _load(args)
    cell = matrix.cell(args.cell)
    document = _jsonable(cell)
    _emit(args, document, json.dumps(document, indent=2))
    return 0


# -- matrix audit (issue 13): one block, registration and handler -----------------------------------


def _matrix_audit(args: argparse.Namespace) -> int:
    from stackproof.auditjob import audit_cells, release_lookup
    from verify.audit.report import render_json, render_text

    matrix, _ = _load(args)
    cells = [matrix.cell(c) for c in args.cells] if args.cells else list(matrix.cells)
    report = audit_cells(matrix, cells, release_lookup(matrix))
    _emit(args, render_json(report), render_text(report))
    if getattr(args, "fix", False) and report.errors:
        return _audit_fix(args.matrix, report, sys.stderr if getattr(args, "json", False) else sys.stdout)
    return 1 if report.errors else 0


def _audit_fix(path: Path, report: Any, out: Any) -> int:
    """Print the diff, then write it: each stale cell or arm rule becomes its package's current text."""
    from verify.audit.fix import plan_fix

    plan = plan_fix(path, [f for c in report.cells for f in c.findings])
    out.write(plan.diff or f"matrix audit --fix: nothing in {path} to rewrite\n")
    out.flush()
    for problem in plan.problems:
        print(f"matrix audit --fix: {problem}", file=sys.stderr)
    if plan.edits:
        from pipeline.guard.atomic import replace_text

        replace_text(path, plan.new_text)  # read back as only those rules changed (verify/audit/fix.py)
        print(
            f"matrix audit --fix: rewrote {len(plan.edits)} rule(s) in {path}, read back as only those rules "
            "changed; run matrix audit again",
            file=sys.stderr,
        )
    return 1 if plan.unfixed else 0


# -- end of matrix audit ---------------------------------------------------------------------------


COMMANDS = (
    Command(path=("matrix", "validate"), help="check matrix.yaml; FILE:LINE: path: message", handler=_matrix_validate),
    Command(path=("matrix", "list"), help="cell ids, arch, base, runner labels", handler=_matrix_list),
    Command(path=("matrix", "show"), help="the fully resolved cell", handler=_matrix_show, args=(arg("cell"),)),
    Command(
        path=("matrix", "audit"),
        help="can each cell's rules match, its variables act, its kernels exist (wheels)",
        handler=_matrix_audit,
        args=(
            arg("cells", nargs="*", help="cells to audit (default: all)"),
            arg("--fix", action="store_true", help="rewrite stale matrix.yaml rules in place (diff first)"),
        ),
    ),
)
