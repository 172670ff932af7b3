"""`stackproof probe imports|kernels`: the in-image (or host) probes."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.errors import InputError
from pipeline.matrix.model import DEFAULT_ENGINE, SERVING_ENGINES
from stackproof.cli.common import Command, arg
from stackproof.cli.common import emit as _emit
from stackproof.cli.common import load as _load

if TYPE_CHECKING:
    pass

MODULES_HELP = (
    "modules to import (default: the cell's, or the default engine's: "
    + ",".join(SERVING_ENGINES[DEFAULT_ENGINE])
    + ")"
)

__all__ = ["COMMANDS"]


def _probe_imports(args: argparse.Namespace) -> int:
    from verify.stages.probe import probe_host

    if args.host == bool(args.cell):
        raise InputError("probe imports: give a CELL, or --host")
    if args.host:
        modules = tuple(args.modules.split(",")) if args.modules else SERVING_ENGINES[DEFAULT_ENGINE]
        report = probe_host(args.python, modules=modules)
    else:
        from pipeline.build.image import built_image
        from pipeline.docker.client import Docker
        from pipeline.matrix.site import load_site
        from verify.stages.probe import probe_image

        matrix, images = _load(args)
        cell = matrix.cell(args.cell)
        docker = Docker.connect()
        tag = built_image(docker, matrix, cell, load_site(matrix), images)[0].tag
        modules = tuple(args.modules.split(",")) if args.modules else cell.imports
        report = probe_image(docker, tag, python=matrix.python_of(cell), modules=modules, env=cell.serve_env())
    print(json.dumps(report.raw, indent=1, sort_keys=True))
    return 0


def _probe_kernels(args: argparse.Namespace) -> int:
    """Exit 1 when the autotune policy is violated."""
    from pipeline.result import Status
    from stackproof.kernels import probe_kernels

    if args.host == bool(args.cell):
        raise InputError("probe kernels: give a CELL, or --host")
    if not args.config.is_file():
        raise InputError(f"--config {args.config}: no such file")
    docker = image = gpus = None
    python = args.python
    if args.cell:
        from pipeline.build.image import built_image
        from pipeline.docker.client import Docker
        from pipeline.matrix.site import load_site

        matrix, images = _load(args)
        cell = matrix.cell(args.cell)
        docker = Docker.connect()
        image = built_image(docker, matrix, cell, load_site(matrix), images)[0].tag
        python, gpus = matrix.python_of(cell), (cell.serve.gpus if cell.serve else None) or "all"
    result = probe_kernels(
        config=args.config,
        out_dir=args.out,
        max_tokens=args.max_num_batched_tokens,
        python=python,
        arch=args.arch,
        docker=docker,
        image=image,
        gpus=gpus,
        churn=args.churn,
    )
    lines = [
        f"{args.config}: {len(result.table)} shapes on {result.report.get('gpu')} ({result.arch}), "
        f"probe {result.seconds:.0f}s, FlashInfer tuning {result.report.get('wall_seconds')}s"
    ]
    for t in result.table:
        lines.append(f"fp8 N={t['n']} K={t['k']}: " + ", ".join(f"M<={r['m_bucket']} {r['runner']}" for r in t["rows"]))
    lines += [f"{c.status:<12} {c.name}: {c.message}" for c in result.checks]
    _emit(args, result.to_json(), "\n".join(lines))
    return 1 if any(c.status is Status.FAIL for c in result.checks) else 0


COMMANDS = (
    Command(
        path=("probe", "imports"),
        help="installed distributions, imports, torch, env (JSON)",
        handler=_probe_imports,
        args=(
            arg("cell", nargs="?", help="probe this cell's built image"),
            arg("--host", action="store_true", help="probe this host's Python environment instead"),
            arg("--python", default=sys.executable, help="with --host: the interpreter to probe"),
            arg("--modules", default=None, help=MODULES_HELP),
        ),
    ),
    Command(
        path=("probe", "kernels"),
        help="FlashInfer bmm_fp8 autotune on a model's linear shapes",
        handler=_probe_kernels,
        args=(
            arg("cell", nargs="?", help="run in a GPU container of this cell's built image"),
            arg("--host", action="store_true", help="run on this host's Python environment instead"),
            arg("--python", default=sys.executable, help="with --host: the interpreter to use"),
            arg("--config", type=Path, required=True, help="the model's HF config.json (no weights needed)"),
            arg("--max-num-batched-tokens", type=int, default=8192),
            arg("--arch", default=None, help="judge for this arch (default: from the GPU's compute capability)"),
            arg("--churn", action="store_true", help="also measure per-call device allocations per GEMM and M"),
            arg("--out", type=Path, default=Path("stackproof-out/kernel-probe")),
        ),
    ),
)
