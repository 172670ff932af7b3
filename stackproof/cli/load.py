"""`stackproof load|soak`: load a server already running on this machine, or soak a cell's arms."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.errors import InputError
from pipeline.matrix.model import DEFAULT_ENGINE, SERVING_ENGINES, LoadSpec
from stackproof.cli.common import Command, arg
from stackproof.cli.common import emit as _emit
from stackproof.cli.common import jsonable as _jsonable
from stackproof.cli.common import load as _load
from stackproof.cli.common import load_spec as _load_spec
from stackproof.cli.common import seconds as _seconds

if TYPE_CHECKING:
    from verify.load.run import LoadTarget

__all__ = ["COMMANDS"]


def _load_url(args: argparse.Namespace) -> int:
    """Exit 1 when a question faulted, the watchdog reached a verdict, or determinism failed."""
    from pipeline.result import Status
    from stackproof.loadurl import load_url

    target, spec = _target(args)
    summary, checks = load_url(target, spec, args.out, soak=args.soak)
    lines = [f"{c.status:<12} {c.name}: {c.message}" for c in checks]
    _emit(args, {**summary, "checks": _jsonable(checks)}, "\n".join(lines))
    return 1 if any(c.status in (Status.FAIL, Status.ERROR) for c in checks) else 0


def _target(args: argparse.Namespace) -> tuple[LoadTarget, LoadSpec]:
    """The server `--url` names (loopback only) and the load spec to send it; bad input is exit 2."""
    from urllib.parse import urlsplit

    from pipeline.guard.redact import redact
    from verify.load.run import LoadTarget
    from verify.serving import driver_named

    try:
        parts = urlsplit(args.url)
        host, port = parts.hostname, parts.port  # .port raises on 99999, -1, 8000:9
    except ValueError as exc:
        raise InputError(f"--url {args.url[:200]}: not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not host:
        raise InputError(f"--url {args.url[:200]}: give http://127.0.0.1:PORT (an http or https URL)")
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise InputError(f"--url {args.url[:200]}: load goes to a server on this machine only (127.0.0.1)")
    if port == 0:
        raise InputError(f"--url {args.url[:200]}: port 0 is no server's port")
    base, serving_engine = LoadSpec(), DEFAULT_ENGINE
    if args.cell:
        matrix, _ = _load(args)
        cell = matrix.cell(args.cell)
        base = cell.serve.load if cell.serve else base
        serving_engine = cell.serve.engine if cell.serve else serving_engine
    spec = _load_spec(args, base)
    driver = driver_named(args.engine or serving_engine)
    # The label is what artifacts and progress lines name: the URL without its user info.
    return LoadTarget(base_url=args.url.rstrip("/"), label=redact(args.url), driver=driver), spec


def _soak(args: argparse.Namespace) -> int:
    """Exit 1 when any arm saw a fault."""
    from stackproof.soak import DEFAULT_ARM, soak_cell

    matrix, images = _load(args)
    cell = matrix.cell(args.cell)
    if cell.serve is None:
        raise InputError(f"{cell.id}: the cell has no serve spec: nothing to soak")
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    for name in arms:
        if name != DEFAULT_ARM:
            cell.arm(name)
    if len(set(arms)) != len(arms) or not arms:
        raise InputError(f"--arms {args.arms}: name each arm once")
    spec = _load_spec(args, cell.serve.load)
    duration = args.duration or spec.duration_s
    document, report = soak_cell(
        matrix, cell, images, arms=arms, spec=spec, duration_s=duration, slice_s=args.slice, out_root=args.out
    )
    lines = []
    for name, arm in document["arms"].items():
        stats = arm["stats"] or {}
        lines.append(
            f"{name}: {arm['questions']} questions, {arm['faults']} faulted, {arm['output_tokens']} tokens in "
            f"{arm['seconds']:.0f}s; clean-run luck {stats.get('p_luck', float('nan')):.1%}"
        )
    if "comparison" in document:
        c = document["comparison"]
        lines.append(f"{c['a']} vs {c['b']}: conditional p={c['p_conditional']:.3g}, E-test p={c['p_etest']:.3g}")
    lines.append(f"soak report: {report}")
    _emit(args, document, "\n".join(lines))
    return 1 if any(a["faults"] for a in document["arms"].values()) else 0


COMMANDS = (
    Command(
        path=("load",),
        help="load a server already running on this machine (no cell needed)",
        handler=_load_url,
        load_options=True,
        args=(
            arg("--url", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000 (loopback only)"),
            arg("--cell", default=None, help="take the load spec (and the engine) from this cell's serve"),
            arg(
                "--engine",
                default=None,
                choices=tuple(SERVING_ENGINES),
                help="the server's serving engine (its metric names, dead markers); default: the cell's, else vllm",
            ),
            arg("--soak", action="store_true", help="cycle the questions until --duration instead of stopping"),
            arg("--out", type=Path, default=Path("stackproof-out/load")),
        ),
    ),
    Command(
        path=("soak",),
        help="alternate arms of a cell on this host for --duration seconds",
        handler=_soak,
        load_options=True,
        args=(
            arg("cell"),
            arg("--arms", default="default", help="comma-separated arm names; `default` = the cell without arm"),
            arg("--slice", type=_seconds, default=300.0, help="seconds of load per arm per round"),
            arg("--out", type=Path, default=Path("stackproof-out")),
        ),
    ),
)
