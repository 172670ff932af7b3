"""`stackproof report`: render the verified matrix as a static site from receipts.

Receipts come from run directories (`--receipts DIR...`, scanned for receipt.json; the raw load
series beside them are drawn) or from a registry (`--registry`, the receipts alone). Exit 0 when
the site is written, 2 for bad input (a missing directory, a broken receipt), 3 when the registry
is unreachable or the plotting library is missing.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from pipeline.errors import InputError
from stackproof.cli.common import Command, arg

__all__ = ["COMMANDS"]


def _report(args: argparse.Namespace) -> int:
    from stackproof.cli.common import emit
    from stackproof.site_report.model import build_site
    from stackproof.site_report.perfdocs import perfdocs_from_dirs
    from stackproof.site_report.render import render_site
    from stackproof.site_report.sources import read_fixtures, receipts_from_dirs, receipts_from_registry

    started = time.perf_counter()
    if args.out.exists() and not args.out.is_dir():
        raise InputError(f"--out {args.out}: exists and is not a directory")
    if args.receipts:
        receipts = receipts_from_dirs(args.receipts)
    else:
        from stackproof.cli.common import registry_credentials

        credentials = registry_credentials(args, args.registry)
        receipts = receipts_from_registry(args.registry, ca_bundle=_ca_bundle(args), credentials=credentials)
    cells, arch = _rows(args)
    site = build_site(receipts, cells=cells, cell_arch=arch)
    fixtures = read_fixtures(args.fixtures) if args.fixtures else None
    files = render_site(
        site,
        generated_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        fixtures=fixtures,
        perf=perfdocs_from_dirs(args.receipts or []),  # the ab/bisect/sweep.json found beside the receipts
    )
    from stackproof.site_report.write import write_site

    write_site(files, args.out)
    seconds = time.perf_counter() - started
    verified = sum(1 for s in site.squares.values() if s.receipt is not None)
    document = {
        "out": str(args.out),
        "index": str(args.out / "index.html"),
        "cells": len(site.cells),
        "hosts": len(site.hosts),
        "receipts": len(site.receipts),
        "squares_with_receipt": verified,
        "squares": len(site.squares),
        "files": len(files),
        "seconds": round(seconds, 2),
    }
    text = (
        f"{args.out}/index.html: {len(site.cells)} cell(s) x {len(site.hosts)} host(s), {len(site.receipts)} "
        f"receipt(s), {verified} of {len(site.squares)} square(s) verified, {len(files)} files in {seconds:.1f}s"
    )
    emit(args, document, text)
    return 0


def _rows(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The rows the user asked for, or the matrix's cells with their arch when the matrix loads."""
    if args.cells:
        return list(args.cells), {}
    if not args.matrix.is_file():
        return [], {}
    from pipeline.errors import MatrixError
    from stackproof.cli.common import load

    try:
        matrix, _ = load(args)
    except MatrixError:
        return [], {}  # the report reads receipts; a matrix that does not load only loses the empty rows
    return [c.id for c in matrix.cells], {c.id: ("cpu" if c.arch == "none" else c.arch) for c in matrix.cells}


def _ca_bundle(args: argparse.Namespace) -> str | None:

    bundle = os.environ.get("STACKPROOF_CA_BUNDLE")
    return None if not bundle or bundle == "none" else bundle


COMMANDS = (
    Command(
        path=("report",),
        help="render a static site of the verified matrix (cells x hosts, cell pages, compares) from receipts",
        handler=_report,
        one_of=(
            arg(
                "--receipts",
                type=Path,
                nargs="+",
                metavar="DIR",
                help="run directories or --out trees to scan for receipt.json",
            ),
            arg("--registry", help="HOST[:PORT][/NAMESPACE]: every receipt attached there"),
        ),
        args=(
            arg(
                "--password-stdin",
                action="store_true",
                help="with --registry: read the password (or token) for STACKPROOF_REGISTRY_USER from stdin; "
                "without it, docker's own login is used",
            ),
            arg(
                "--cells",
                nargs="+",
                default=None,
                metavar="CELL",
                help="rows, in this order (default: the matrix's cells when --matrix loads, else the receipts' cells)",
            ),
            arg("--out", type=Path, required=True, metavar="SITE", help="directory to write the site into"),
            arg(
                "--fixtures",
                type=Path,
                default=None,
                metavar="DIR",
                help="add a page of GPU fixture data (DIR/autotune/*.json caches, DIR/gpu/*.json NVML samples), "
                "labelled so",
            ),
        ),
    ),
)
