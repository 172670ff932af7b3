"""`stackproof` command line: parse, load the matrix once, dispatch, map exceptions to exit codes.

Exit codes: 0 success, 1 a check failed, 2 bad input or usage (nothing built or run),
3 infrastructure problem (no docker daemon, registry unreachable, a tool timeout), 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import pipeline
from pipeline.console import console
from pipeline.errors import InfraError, InputError, Interrupted, MatrixError, PipelineError
from pipeline.matrix.model import DEFAULT_ENGINE, SERVING_ENGINES, Cell, LoadSpec, Matrix
from pipeline.matrix.read import MAX_CONCURRENCY, MAX_COUNT, MAX_SECONDS
from stackproof.cliutil import NO_PREFLIGHT_HELP
from stackproof.cliutil import emit as _emit
from stackproof.cliutil import jsonable as _jsonable
from stackproof.cliutil import load as _load

if TYPE_CHECKING:
    from pipeline.docker.client import Docker
    from pipeline.matrix.site import SiteSettings
    from pipeline.result import VerifyReport

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Every line that leaves the process passes one redaction (pipeline.guard.redact.RedactingStream):
    a credential in a URL, a pip-freeze line, a doctor input or a server's answer never reaches the
    terminal, a log or a --json document, whichever command printed it."""
    with _redacted_output():
        try:
            args = _parser().parse_args(argv)
        except UsageError as exc:
            raise SystemExit(_usage_error(argv, exc)) from None  # argparse's contract: SystemExit(2)
        return _dispatch(args)


class UsageError(Exception):
    """argparse's usage error, raised instead of exiting so that `--json` still gets its document."""

    def __init__(self, message: str, usage: str) -> None:
        super().__init__(message)
        self.usage = usage


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse prints and exits; main prints (JSON too) and exits
        raise UsageError(message, self.format_usage())


def _usage_error(argv: list[str] | None, exc: UsageError) -> int:
    print(exc.usage.rstrip(), file=sys.stderr)
    print(f"stackproof: error: {exc}", file=sys.stderr)
    if "--json" in (sys.argv[1:] if argv is None else argv):
        document = {"error": {"exit_code": 2, "message": str(exc), "problems": [str(exc)]}}
        print(json.dumps(document, indent=2))
    return 2


@contextlib.contextmanager
def _redacted_output() -> Any:
    from pipeline.guard.redact import RedactingStream

    saved = sys.stdout, sys.stderr
    if not isinstance(sys.stdout, RedactingStream):
        sys.stdout = RedactingStream(sys.stdout)
    if not isinstance(sys.stderr, RedactingStream):
        sys.stderr = RedactingStream(sys.stderr)
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        sys.stdout, sys.stderr = saved


def _dispatch(args: argparse.Namespace) -> int:
    console().verbose = bool(getattr(args, "verbose", False)) or console().verbose
    signal.signal(signal.SIGTERM, _raise_interrupted)
    try:
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        print("stackproof: interrupted; cleaned up", file=sys.stderr)
        return _fail(args, Interrupted.exit_code, "interrupted; cleaned up")
    except BrokenPipeError:
        return _broken_pipe()
    except MatrixError as exc:
        listed = _first_problems(exc.problems)
        for problem in listed:
            print(problem, file=sys.stderr)
        print(f"stackproof: {len(exc.problems)} problem(s) in the matrix; nothing was built or run", file=sys.stderr)
        return _fail(args, exc.exit_code, "the matrix is invalid", listed)
    except PipelineError as exc:
        # A failed tool's last lines were printed by its phase (pipeline.console): not twice.
        shown = str(exc).splitlines()[0] if getattr(exc, "tail_shown", False) else str(exc)
        print(f"stackproof: error: {shown}", file=sys.stderr)
        return _fail(args, exc.exit_code, str(exc))
    # Foreseeable conditions a reader below did not name more precisely: still no traceback.
    except UnicodeDecodeError as exc:
        return _report(args, InputError.exit_code, f"an input is not UTF-8 text ({exc.reason} at byte {exc.start})")
    except RecursionError:
        return _report(args, InputError.exit_code, "an input is nested too deeply to read")
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        return _report(args, 3, f"{where}{exc.strerror or exc}: fix the path or its permissions")
    except MemoryError:
        return _report(args, 3, "out of memory: the input or the run is larger than this host allows")


# A person reads the first screenfuls; a broken generator's 300,000 identical problems cost half a
# minute to print (and a CI log's limit) and say nothing the first hundred do not.
MAX_PROBLEMS_SHOWN = 100


def _first_problems(problems: list[str]) -> list[str]:
    if len(problems) <= MAX_PROBLEMS_SHOWN:
        return problems
    rest = len(problems) - MAX_PROBLEMS_SHOWN
    return [*problems[:MAX_PROBLEMS_SHOWN], f"... and {rest:,} more problem(s) not listed (fix these first)"]


def _report(args: argparse.Namespace, code: int, message: str) -> int:
    print(f"stackproof: error: {message}", file=sys.stderr)
    return _fail(args, code, message)


def _fail(args: argparse.Namespace, code: int, message: str, problems: list[str] | None = None) -> int:
    """With `--json`, an error is one JSON document on stdout too (the contract: always a document)."""
    if getattr(args, "json", False) and not getattr(args, "emitted", False):
        document = {"error": {"exit_code": code, "message": message, "problems": problems or [message]}}
        try:
            print(json.dumps(document, indent=2))
        except BrokenPipeError:
            return _broken_pipe()
    return code


def _broken_pipe() -> int:
    """The reader went away (`stackproof matrix list --json | head`): stop quietly, as `yes | head`
    does; 141 is the shell's code for a SIGPIPE death. stdout is pointed at /dev/null so the
    interpreter's final flush raises nothing."""
    with contextlib.suppress(OSError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 141


def _raise_interrupted(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@dataclasses.dataclass(frozen=True)
class Arg:
    """One `add_argument` call: its flags (or positional name) and keywords."""

    flags: tuple[str, ...]
    options: dict[str, Any]


def arg(*flags: str, **options: Any) -> Arg:
    return Arg(flags, options)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Command:
    """A row of the command table: `stackproof PATH...`, its options and the function that runs it."""

    path: tuple[str, ...]  # ("render",) or ("matrix", "validate")
    help: str
    handler: Callable[[argparse.Namespace], int]
    args: tuple[Arg, ...] = ()
    load_options: bool = False  # takes the overrides of the cell's serve.load


# Groups of subcommands: `stackproof matrix validate`, `stackproof inspect log`, ...
GROUPS = {"matrix": "validate, list and show cells", "inspect": "inspect a file", "probe": "run an in-image probe"}


def _load_options() -> tuple[Arg, ...]:
    """Overrides of the cell's `serve.load` (the load stage, `load` and `soak`); unset = the cell's value."""
    return (
        arg("--questions", type=_positive_int, default=None, help="questions in a short run"),
        arg("--questions-file", type=Path, default=None, help="JSONL of {id, turns: [2-3 strings]}"),
        arg("--concurrency", type=_concurrency, default=None, help="questions in flight (closed loop)"),
        arg("--rate", type=_positive_float, default=None, help="open loop: questions started per second"),
        arg("--burstiness", type=_positive_float, default=None, help="gamma shape of arrivals (1 = Poisson)"),
        arg("--max-tokens", type=_positive_int, default=None, help="output tokens per turn"),
        arg("--duration", type=_seconds, default=None, help="seconds after which no question starts"),
        arg("--stall-seconds", type=_seconds, default=None, help="no progress this long = stall"),
        arg("--chunk-timeout", type=_seconds, default=None, help="seconds one stream may be silent"),
        arg("--scrape-interval", type=_seconds, default=None, help="seconds between /metrics scrapes"),
        arg("--baseline-rate", default=None, help="fault probability per question: 1/450 or 0.00222"),
        arg("--determinism-repeats", type=_count, default=None, help="greedy samples per prompt and phase (0 = off)"),
    )


# `run` and `verify` take the same options: one is the other with a build first.
VERIFY_OPTIONS = (
    arg("cell"),
    arg("--arm", default=None),
    arg("--stages", default=None, help="comma-separated stages (default: all)"),
    arg("--out", type=Path, default=Path("stackproof-out")),
    arg("--previous", type=Path, default=None, help="an earlier report.json: diff autotune winners"),
    arg("--no-preflight", action="store_true", help=NO_PREFLIGHT_HELP),
    arg("--no-fetch", action="store_true", help="never ask the hub: an hf: model must be in the store"),
    arg(
        "--runtime",
        choices=("docker", "host"),
        default=None,
        help="where the servers run: docker (the cell's image) or host (a Python environment of this host: "
        "the cell's built one, or --python's); default: the cell's `runtime`",
    ),
    arg(
        "--python",
        default=None,
        metavar="PY",
        help="with --runtime host: verify the environment this interpreter belongs to (nothing is built or "
        "installed); its identity in the receipt is the digest of its installed inventory",
    ),
)

PULL_ONLY_HELP = "never build: take the image from STACKPROOF_REGISTRY or fail (exit 3)"
MODULES_HELP = (
    "modules to import (default: the cell's, or the default engine's: "
    + ",".join(SERVING_ENGINES[DEFAULT_ENGINE])
    + ")"
)


def _commands() -> tuple[Command, ...]:
    """The command table (the commands of cli_*.py register themselves beside it)."""
    return (
        Command(
            path=("matrix", "validate"), help="check matrix.yaml; FILE:LINE: path: message", handler=_matrix_validate
        ),
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
        Command(
            path=("render",),
            help="write Dockerfiles and per-index requirement files",
            handler=_render,
            args=(
                arg("cells", nargs="*", help="cells to render (default: all)"),
                arg("--out", type=Path, default=Path("stackproof-out/render")),
            ),
        ),
        Command(
            path=("lock",),
            help="resolve a cell's install into its hash-locked file",
            handler=_lock,
            args=(arg("cells", nargs="+"),),
        ),
        Command(
            path=("build",),
            help="build a cell's image (skipped when its content tag exists; pulled when STACKPROOF_REGISTRY has it)",
            handler=_build,
            args=(
                arg("cell"),
                arg("--out", type=Path, default=Path("stackproof-out")),
                arg("--no-cache", action="store_true", help="rebuild every step"),
                arg("--force", action="store_true", help="build even when the content tag is here or in the registry"),
                arg("--push", action="store_true", help="push the image to STACKPROOF_REGISTRY under its content tag"),
                arg("--pull-only", action="store_true", help=PULL_ONLY_HELP),
                arg("--no-preflight", action="store_true", help=NO_PREFLIGHT_HELP),
            ),
        ),
        Command(
            path=("run",),
            help="build + verify every stage: the main job",
            handler=_run,
            args=VERIFY_OPTIONS,
            load_options=True,
        ),
        Command(
            path=("verify",),
            help="run stages against a cell's built image",
            handler=_verify,
            args=VERIFY_OPTIONS,
            load_options=True,
        ),
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
        Command(
            path=("ab",),
            help="A/B of two cells or arms on this host: the change per metric, with a verdict",
            handler=_ab,
            load_options=True,
            args=(
                arg("a", metavar="A", help="CELL or CELL:ARM: the baseline"),
                arg("b", metavar="B", help="CELL or CELL:ARM: the bump"),
                arg("--slice", type=_seconds, default=20.0, help="seconds of load per slice (default 20)"),
                arg(
                    "--pairs", type=_ab_pairs, default=5, help="measured A/B slice pairs after the warm-up (default 5)"
                ),
                arg("--threshold", type=_ab_threshold, default=0.05, help="smallest change that matters: 5%% or 0.05"),
                arg("--out", type=Path, default=Path("stackproof-out")),
            ),
        ),
        Command(
            path=("sweep",),
            help="the throughput-latency curve of a built cell: a slice per load point, where TTFT p99 crosses a limit",
            handler=_sweep,
            load_options=True,
            args=(
                arg("target", metavar="CELL", help="CELL or CELL:ARM"),
                arg("--sweep", type=_sweep_axis, required=True, help="concurrency=1,2,4,8 or rate=0.5,1,2"),
                arg("--slice", type=_seconds, default=20.0, help="seconds of load per point (default 20)"),
                arg(
                    "--ttft-p99-limit",
                    type=_ttft_limit,
                    default=2000.0,
                    help="TTFT p99 limit: 2000ms or 2s (default 2s)",
                ),
                arg("--out", type=Path, default=Path("stackproof-out")),
            ),
        ),
        Command(
            path=("bisect",),
            help="the first version of a package that made a cell worse: A/B runs against the good end",
            handler=_bisect,
            load_options=True,
            args=(
                arg("cell"),
                arg("--package", required=True, help="the package moved (flashinfer-python moves the trio)"),
                arg("--good", required=True, help="a version of the package known good: every step's baseline"),
                arg("--bad", required=True, help="a newer version known bad"),
                arg(
                    "--metric",
                    choices=("tok_s", "tpot_p50", "ttft_p50", "greedy", "start"),
                    default="tok_s",
                    help="what makes a version bad (default tok_s): an A/B REGRESSION of a metric, "
                    "greedy answers that differ, or a server that does not start",
                ),
                arg("--threshold", type=_ab_threshold, default=0.05, help="smallest change that matters: 5%% or 0.05"),
                arg("--index", default=None, help="the package's index, when the cell names none for it"),
                arg("--slice", type=_seconds, default=20.0, help="seconds of load per A/B slice (default 20)"),
                arg("--pairs", type=_ab_pairs, default=5, help="measured slice pairs per A/B (default 5)"),
                arg("--build-only", action="store_true", help="make every version's environment; run no A/B"),
                arg("--out", type=Path, default=Path("stackproof-out")),
            ),
        ),
        Command(
            path=("inspect", "log"),
            help="what failed in a log: class, incident, facts, last exception",
            handler=_inspect_log,
            args=(
                arg("file", type=Path, help="a log file, a pipe or FIFO, or - for standard input"),
                arg("--cell", default=None, help="also apply this cell's rules (and its built-in rule sets)"),
                arg("--arm", default=None),
            ),
        ),
        Command(
            path=("inspect", "autotune"),
            help="winners per op, shape and M bucket + policy verdict",
            handler=_inspect_autotune,
            args=(
                arg(
                    "file",
                    type=Path,
                    help="a legacy cache file (any FlashInfer 0.6-0.7 value shape, per-rank files too), or a "
                    "managed v2 store: its directory, its manifest.json, or a root holding one v2/<hash> store",
                ),
                arg("--arch", default="", help="the GPU arch the cache is judged for (sm90, sm120, sm121...)"),
                arg("--policy", action="append", default=None, help="apply only these policies (by id)"),
                arg("--m", type=int, action="append", default=[], help="also say which bucket serves this M"),
            ),
        ),
        Command(path=("gc",), help="remove containers of dead runs on this host (owner gone)", handler=_gc),
        Command(
            path=("stats",),
            help="what a fault count over N questions proves",
            handler=_stats,
            args=(
                arg("--baseline-rate", required=True, help="fault probability per question: 1/450 or 0.00222"),
                arg("--questions", type=int, required=True),
                arg("--faults", type=int, default=0),
                arg("--other-questions", type=int, default=None, help="a second arm to compare against"),
                arg("--other-faults", type=int, default=None),
            ),
        ),
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


def _parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument(
        "--matrix",
        type=Path,
        default=Path(os.environ.get("STACKPROOF_MATRIX", "matrix.yaml")),
        help="matrix file (default: ./matrix.yaml or $STACKPROOF_MATRIX)",
    )
    common.add_argument(
        "--images", type=Path, default=None, help="templates and recipes directory (default: images/ beside the matrix)"
    )
    common.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    common.add_argument(
        "-v", "--verbose", action="store_true", help="stream the tools' whole output (debootstrap, build, server)"
    )
    load_opts = _Parser(add_help=False)
    group = load_opts.add_argument_group("load (overrides serve.load)")
    for option in _load_options():
        group.add_argument(*option.flags, **option.options)

    parser = _Parser(prog="stackproof", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"stackproof {pipeline.__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    groups: dict[str, Any] = {}  # made where the table first names them, so `--help` lists commands in its order
    for command in _commands():
        *within, name = command.path
        where = commands
        if within:
            if within[0] not in groups:
                group_parser = commands.add_parser(within[0], help=GROUPS[within[0]])
                groups[within[0]] = group_parser.add_subparsers(dest="sub", required=True)
            where = groups[within[0]]
        parents = [common, load_opts] if command.load_options else [common]
        p = where.add_parser(name, parents=parents, help=command.help)
        for option in command.args:
            p.add_argument(*option.flags, **option.options)
        p.set_defaults(handler=command.handler)

    # The commands of the other command modules register themselves.
    from stackproof import cli_ci, cli_compare, cli_model, cli_propose, cli_publish, cli_report, cli_repro

    cli_propose.add_matrix_commands(groups["matrix"], common)

    for module in (cli_publish, cli_ci, cli_repro, cli_model, cli_report, cli_compare):
        module.add_commands(commands, common)
    return parser


# -- handlers --------------------------------------------------------------------------------------


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
    from stackproof.cli_propose import release_lookup
    from verify.audit.report import render_json, render_text

    matrix, _ = _load(args)
    cells = [matrix.cell(c) for c in args.cells] if args.cells else list(matrix.cells)
    report = audit_cells(matrix, cells, release_lookup(matrix))
    _emit(args, render_json(report), render_text(report))
    if getattr(args, "fix", False) and report.errors:
        return _audit_fix(args.matrix, report, sys.stderr if getattr(args, "json", False) else sys.stdout)
    return 1 if report.errors else 0


def audit_cells(matrix: Matrix, cells: list[Cell], lookup: Any) -> Any:
    """The audit of `cells` (`matrix audit`, `matrix propose`): wheels from the cells' indexes
    (mirrors applied) into the cache directory, release pins from `lookup`."""
    from pipeline.cache import cache_dir
    from pipeline.matrix.site import load_site
    from verify.audit import Sources, audit_matrix
    from verify.logs.logscan import load_catalog, rulesets_for

    site = load_site(matrix)

    def index_url(name: str) -> tuple[str, Path | None]:
        url = matrix.index(name).url
        mirror = site.mirror(name)
        if mirror is None:
            return url, None
        return (url, mirror.directory) if mirror.is_local else (mirror.location, None)

    def rulesets(facts: Any) -> list[tuple[str, Any]]:
        # Each rule under the set it came from (two sets may hold equal rules, e.g. no-traceback).
        return [(f"logrules.yaml {rs.id}", r) for rs in rulesets_for(facts) for r in rs.rules]

    return audit_matrix(
        matrix,
        cells,
        sources=Sources(root=cache_dir(), index_url=index_url, cert=site.ca_bundle),
        lookup=lookup,
        rulesets=rulesets,
        signatures=load_catalog(),
    )


def _audit_fix(path: Path, report: Any, out: Any) -> int:
    """Print the diff, then write it: each stale cell or arm rule becomes its package's current text."""
    from verify.audit.fix import plan_fix

    plan = plan_fix(path, [f for c in report.cells for f in c.findings])
    out.write(plan.diff or f"matrix audit --fix: nothing in {path} to rewrite\n")
    out.flush()
    for problem in plan.problems:
        print(f"matrix audit --fix: {problem}", file=sys.stderr)
    if plan.edits:
        path.write_text(plan.new_text)
        print(
            f"matrix audit --fix: rewrote {len(plan.edits)} rule(s) in {path}; run matrix audit again", file=sys.stderr
        )
    return 1 if plan.unfixed else 0


# -- end of matrix audit ---------------------------------------------------------------------------


def _render(args: argparse.Namespace) -> int:
    from pipeline.build.plan import plan_cell
    from pipeline.matrix.site import load_site

    matrix, images = _load(args)
    site = load_site(matrix)
    cells: list[Cell] = [matrix.cell(c) for c in args.cells] if args.cells else list(matrix.cells)
    written = []
    for cell in cells:
        plan = plan_cell(matrix, cell, site, images)
        target = args.out / cell.id
        target.mkdir(parents=True, exist_ok=True)
        (target / "Dockerfile").write_text(plan.dockerfile)
        for rel, data in plan.files:
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            (target / rel).write_bytes(data)
        written.append(
            {
                "cell": cell.id,
                "dir": str(target),
                "tag": plan.tag,
                "requirements": [rel for rel, _ in plan.files if "/requirements/" in rel],
            }
        )
    _emit(args, {"rendered": written}, "\n".join(f"{w['cell']}: {w['dir']}/Dockerfile  {w['tag']}" for w in written))
    return 0


def _lock(args: argparse.Namespace) -> int:
    from pipeline.build.lock import resolve_lock, write_lock
    from pipeline.matrix.site import load_site

    matrix, _ = _load(args)
    site = load_site(matrix)
    done = []
    for cell_id in args.cells:
        cell = matrix.cell(cell_id)
        lock = resolve_lock(matrix, cell, site)
        path = write_lock(cell, lock)
        done.append({"cell": cell.id, "lock": str(path), "packages": len(lock.packages)})
    _emit(args, {"locked": done}, "\n".join(f"{d['cell']}: {d['packages']} packages -> {d['lock']}" for d in done))
    return 0


def _build(args: argparse.Namespace) -> int:
    from pipeline.build.image import build_cell

    matrix, images = _load(args)
    cell = matrix.cell(args.cell)
    site = _site(matrix)
    if cell.on_host:
        return _build_host_env(args, matrix, cell, images, site)
    docker = _engine(args, matrix, cell, images, site)
    result = build_cell(
        docker,
        matrix,
        cell,
        site,
        images,
        out_dir=args.out / cell.id,
        no_cache=args.no_cache,
        force=args.force,
        push=args.push,
        pull_only=args.pull_only,
    )
    how = {"local": " (existing)", "registry": f" (pulled {result.registry_ref})"}.get(result.source, "")
    _emit(args, result.to_json(), f"{result.tag} {result.image_id}{how}")
    return 0


def _build_host_env(args: argparse.Namespace, matrix: Matrix, cell: Cell, images: Path, site: SiteSettings) -> int:
    """A `runtime: host` cell's build: its Python environment, under the cache directory."""
    from pipeline.host.env import build_host_env, plan_host_env

    plan = plan_host_env(matrix, cell, images)
    out = args.out / cell.id
    out.mkdir(parents=True, exist_ok=True)
    env = build_host_env(plan, site, matrix, images, log=out / "host-env.log")
    _emit(args, env.to_json(), f"{env.ref} {env.digest} ({env.source}, {env.packages} packages)")
    return 0


def _site(matrix: Matrix) -> SiteSettings:
    """This machine's site settings, saying on stderr what was found rather than set (a mirror)."""
    from pipeline.matrix.site import load_site

    site = load_site(matrix)
    for note in site.notes:
        print(f"site: {note}", file=sys.stderr)
    return site


def _engine(args: argparse.Namespace, matrix: Matrix, cell: Cell, images: Path, site: SiteSettings) -> Docker:
    """The docker engine for a job that builds or runs `cell`: for a GPU cell, only after its
    preflight passed (exit 3 listing every failing item otherwise), unless `--no-preflight`."""
    from pipeline.docker.client import Docker

    if not cell.is_gpu or args.no_preflight:
        return Docker.connect()
    from pipeline.build.plan import plan_cell
    from pipeline.host.modelstore import snapshot_in_store, store_dir
    from pipeline.host.preflight import preflight_job

    # A model already in the store needs no disk; one still to fetch is of a size the hub knows
    # and this host does not (a WARN), never guessed.
    model = cell.serve.model if cell.serve else None
    model_bytes = 0 if model is None or model.kind != "hf" or snapshot_in_store(model, store_dir()) else None
    return preflight_job(matrix, cell, tag=plan_cell(matrix, cell, site, images).tag, model_bytes=model_bytes)


def _run(args: argparse.Namespace) -> int:
    return _verify_or_run(args, build=True)


def _verify(args: argparse.Namespace) -> int:
    return _verify_or_run(args, build=False)


def _verify_or_run(args: argparse.Namespace, *, build: bool) -> int:
    from stackproof.runjob import run_cell
    from verify.stages.runner import parse_stages

    matrix, images = _load(args)
    cell = matrix.cell(args.cell)
    if args.arm:
        cell.arm(args.arm)  # a bad arm name is a usage error before anything is built or run
    stages = parse_stages(args.stages)
    site = _site(matrix)
    if args.previous is not None:
        from pipeline.guard.jsonfile import read_json

        read_json(args.previous, "earlier report (--previous)")  # a bad file is exit 2 before anything runs
    load = _load_spec(args, cell.serve.load) if cell.serve else None
    runtime = args.runtime or cell.runtime
    if args.python is not None and runtime != "host":
        raise InputError(f"--python {args.python}: only with --runtime host (cell {cell.id} runs on {runtime})")
    if runtime == "host":
        return _verdict(args, cell, _on_host(args, matrix, cell, images, site, build=build, stages=stages, load=load))
    docker = _engine(args, matrix, cell, images, site)  # bad input is exit 2 before any host check
    _remove_dead_runs(docker)
    report = run_cell(
        docker,
        matrix,
        cell,
        site,
        images,
        build=build,
        out_root=args.out,
        stages=stages,
        arm_name=args.arm,
        previous=args.previous,
        load=load,
        fetch_model=not args.no_fetch,
    )
    return _verdict(args, cell, report)


def _on_host(
    args: argparse.Namespace,
    matrix: Matrix,
    cell: Cell,
    images: Path,
    site: SiteSettings,
    *,
    build: bool,
    stages: tuple[str, ...],
    load: LoadSpec | None,
) -> VerifyReport:
    from stackproof.runjob import run_on_host
    from verify.runtime.host import remove_dead_host_runs

    if args.python is not None:
        from pipeline.host.env import given_env

        given_env(args.python)  # a missing or broken interpreter is exit 2 before anything starts
    elif build is False and cell.install is None:
        raise InputError(f"cell {cell.id} has no `install:` to build a host environment from: pass --python PY")
    if cell.is_gpu and not args.no_preflight:
        from pipeline.host.preflight import preflight_host

        preflight_host(matrix, cell)  # a host without the cell's GPU is exit 3 before anything starts
    for run in remove_dead_host_runs():
        print(f"stackproof: ended {run}: its run is gone", file=sys.stderr)
    return run_on_host(
        matrix,
        cell,
        site,
        images,
        build=build,
        python=args.python,
        out_root=args.out,
        stages=stages,
        arm_name=args.arm,
        previous=args.previous,
        load=load,
        fetch_model=not args.no_fetch,
    )


def _verdict(args: argparse.Namespace, cell: Cell, report: VerifyReport) -> int:
    verdict = "NOT_REPRODUCED" if report.outcome.not_reproduced else "PASS" if report.outcome.passed else "FAIL"
    stages_line = ", ".join(f"{s.stage} {s.status}" for s in report.stages)
    _emit(args, report.to_json(), f"{cell.id}: {verdict}: {report.outcome.summary} [{stages_line}]")
    return 0 if report.outcome.passed else 1


def _remove_dead_runs(docker: Docker) -> list[str]:
    """Containers left by runs that died unclean (SIGKILL) on this host go before this run starts."""
    removed = docker.collect_garbage()
    for name in removed:
        print(f"stackproof: removed {name}: its run is gone", file=sys.stderr)
    return removed


def _gc(args: argparse.Namespace) -> int:
    """Containers and host server processes of dead runs; with no daemon, the host's only."""
    from pipeline.docker.client import Docker
    from verify.runtime.host import remove_dead_host_runs

    ended = remove_dead_host_runs()
    for run in ended:
        print(f"stackproof: ended {run}: its run is gone", file=sys.stderr)
    try:
        docker: Docker | None = Docker.connect()
    except InfraError as exc:
        print(f"stackproof: no docker daemon ({exc}): host processes only", file=sys.stderr)
        docker = None
    removed = _remove_dead_runs(docker) if docker else []
    summary = f"{len(removed)} container(s) and {len(ended)} host server(s) of dead runs removed"
    _emit(args, {"removed": removed, "host_runs_ended": ended}, summary)
    return 0


def _load_spec(args: argparse.Namespace, spec: LoadSpec) -> LoadSpec:
    """The cell's load spec with the command line's overrides on top (checked before anything runs)."""
    from verify.load.stats import parse_rate

    changes: dict[str, Any] = {
        "questions": args.questions,
        "concurrency": args.concurrency,
        "rate": args.rate,
        "burstiness": args.burstiness,
        "max_tokens": args.max_tokens,
        "duration_s": args.duration,
        "stall_seconds": args.stall_seconds,
        "chunk_timeout_s": args.chunk_timeout,
        "scrape_interval_s": args.scrape_interval,
        "determinism_repeats": args.determinism_repeats,
    }
    if args.questions_file is not None:
        from verify.load.workload import read_questions

        read_questions(args.questions_file)  # a bad file is a usage error now, not mid-run
        changes["questions_file"] = str(args.questions_file)
    if args.baseline_rate is not None:
        changes["baseline_rate"] = parse_rate(args.baseline_rate)
    return dataclasses.replace(spec, **{k: v for k, v in changes.items() if v is not None})


def _load_url(args: argparse.Namespace) -> int:
    """Exit 1 when a question faulted, the watchdog reached a verdict, or determinism failed."""
    from urllib.parse import urlsplit

    from pipeline.result import Status
    from verify.load.run import LoadTarget, judge_load, run_load, summarise
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
    from pipeline.guard.redact import redact

    # The label is what artifacts and progress lines name: the URL without its user info.
    target = LoadTarget(base_url=args.url.rstrip("/"), label=redact(args.url), driver=driver)
    outcome = run_load(target, spec, args.out, soak=args.soak)
    summary = summarise(outcome, spec)
    checks = judge_load(outcome, summary, batch_invariant=False)
    args.out.mkdir(parents=True, exist_ok=True)
    document = _jsonable({**summary, "checks": checks})
    (args.out / "load.json").write_text(json.dumps(document, indent=2, allow_nan=False) + "\n")
    lines = [f"{c.status:<12} {c.name}: {c.message}" for c in checks]
    _emit(args, {**summary, "checks": _jsonable(checks)}, "\n".join(lines))
    return 1 if any(c.status in (Status.FAIL, Status.ERROR) for c in checks) else 0


def _soak(args: argparse.Namespace) -> int:
    """Exit 1 when any arm saw a fault."""
    from pipeline.build.image import built_image
    from pipeline.docker.client import Docker
    from pipeline.matrix.site import load_site
    from stackproof.runjob import exclusive_dir
    from stackproof.soak import DEFAULT_ARM, soak

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
    docker = Docker.connect()
    tag = built_image(docker, matrix, cell, load_site(matrix), images)[0].tag
    from pipeline.host.modelstore import ensure_model

    ensure_model(cell.serve.model, where=f"{matrix.file}:{cell.line}: cells[{cell.id}].serve.model")
    out = exclusive_dir(args.out / cell.id, time.strftime("soak-%Y%m%dT%H%M%S"))
    document = soak(docker, cell, tag, arms=arms, spec=spec, duration_s=duration, slice_s=args.slice, out_dir=out)
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
    lines.append(f"soak report: {out / 'soak.json'}")
    _emit(args, document, "\n".join(lines))
    return 1 if any(a["faults"] for a in document["arms"].values()) else 0


def _ab(args: argparse.Namespace) -> int:
    """Exit 1 on a REGRESSION (or greedy corruption); the command lives in stackproof/cli_ab.py."""
    from stackproof.cli_ab import ab_command

    return ab_command(args, _load_spec)


def _sweep(args: argparse.Namespace) -> int:
    """The command lives in stackproof/cli_sweep.py."""
    from stackproof.cli_sweep import sweep_command

    return sweep_command(args, _load_spec)


def _sweep_axis(text: str) -> object:
    from stackproof.cli_sweep import parse_axis

    return parse_axis(text)


def _ttft_limit(text: str) -> float:
    from stackproof.cli_sweep import parse_limit_ms

    return parse_limit_ms(text)


def _bisect(args: argparse.Namespace) -> int:
    """Exit 1 when the bisect cannot decide; the command lives in stackproof/cli_bisect.py."""
    from stackproof.cli_bisect import bisect_command

    return bisect_command(args, _load_spec)


def _ab_pairs(text: str) -> int:
    from stackproof.cli_ab import parse_pairs

    return parse_pairs(text)


def _ab_threshold(text: str) -> float:
    from stackproof.cli_ab import parse_threshold

    return parse_threshold(text)


def _number(kind: type[int] | type[float], *, zero_ok: bool = False, high: float = MAX_COUNT) -> Callable[[str], Any]:
    """An argparse type: a finite int or float that must be positive (or, with zero_ok, not
    negative) and at most `high`: no NaN, no infinity, no 10**9 workers."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} must be a finite number")
        if value < 0 or (value == 0 and not zero_ok):
            raise argparse.ArgumentTypeError(f"{text!r} {'must not be negative' if zero_ok else 'must be positive'}")
        if value > high:
            raise argparse.ArgumentTypeError(f"{text!r} is too large (at most {high:,})")
        return value

    return parse


_positive_int = _number(int)
_count = _number(int, zero_ok=True)
_positive_float = _number(float)
_concurrency = _number(int, high=MAX_CONCURRENCY)
_seconds = _number(float, high=MAX_SECONDS)


def _inspect_log(args: argparse.Namespace) -> int:
    """Exit 1 when the log names a failure, 0 otherwise (clean, or inconclusive), 2 on bad input.

    The diagnosis (verify/logs/diagnosis.py) names the failure class, the incident only when its
    preconditions are shown, the facts and the last exception; docs/inspect-log.md is the JSON.
    Without --cell no expectation applies; with it, the cell's rules (and built-in sets) do.
    """
    from pipeline.result import CheckResult, Status
    from verify.logs.diagnosis import cell_facts, diagnose
    from verify.logs.logscan import Facts, judge, open_log, rules_for, scan

    cell = arm = None
    if args.cell:
        matrix, _ = _load(args)
        cell = matrix.cell(args.cell)
        arm = cell.arm(args.arm) if args.arm else None
    rules = rules_for(cell, arm, Facts(serve=True, arch=cell.arch, flashinfer=None, cudnn=None)) if cell else ()
    name = "stdin" if str(args.file) == "-" else str(args.file)
    try:
        with open_log(args.file) as data:
            problem = _not_a_text_log(data)
            if problem:
                raise InputError(f"{name}: {problem}")
            undecodable = _undecodable(data)
            diagnosis = diagnose(data, facts=cell_facts(cell, arm) if cell else ())
            rule_matches = scan(data, rules, ()) if rules else []
            size = len(data)
    except IsADirectoryError as exc:
        raise InputError(f"{name}: is a directory, not a log file") from exc
    except OSError as exc:
        raise InputError(f"{name}: cannot read: {exc.strerror or exc}") from exc
    if undecodable:
        print(
            f"stackproof: {name}: line {undecodable[1]}: {undecodable[0]} byte sequence(s) are not UTF-8; "
            "read as U+FFFD",
            file=sys.stderr,
        )
    checks = [c for c in judge(rule_matches, rules, source=name) if c.name != "signatures"] if rules else []
    status = Status.FAIL if diagnosis.verdict == "failed" else Status.PASS
    checks.append(CheckResult(name="diagnosis", status=status, message=diagnosis.summary()))
    failed = any(c.status is Status.FAIL for c in checks)
    verdict = (
        "failed" if failed else ("inconclusive" if any(c.status is Status.INCONCLUSIVE for c in checks) else "clean")
    )
    matches = [m.to_json() for m in rule_matches if m.kind != "evidence"]
    matches += [
        {"id": m.id.split(":")[1], "kind": "class", "line": m.line_no, "text": m.line}
        for m in diagnosis.matches
        if m.kind != "signature"
    ]
    if diagnosis.incident is not None:
        matches += [
            m.to_json() | {"kind": "incident"}
            for m in diagnosis.matches
            if m.kind == "signature" and m.id == diagnosis.incident.id
        ]
    document = {
        "schema_version": 2,
        "file": name,
        "bytes": size,
        "undecodable": None if not undecodable else {"sequences": undecodable[0], "first_line": undecodable[1]},
        "verdict": verdict,
        "failed": failed,
        "diagnosis": diagnosis.to_json(),
        "matches": sorted(matches, key=lambda m: m["line"])[:200],
        "checks": [_jsonable(c) for c in checks],
    }
    try:
        _emit(args, document, _diagnosis_text(name, verdict, diagnosis, checks))
    except BrokenPipeError:
        # The reader left (`| head`, `| grep -q`): the verdict still decides the exit code, and
        # stdout goes to /dev/null so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    # Exit 1 only for a named failure (a class, an incident, a cell's rule): a script can tell a
    # failing log from an excerpt that proves nothing either way (verdict inconclusive, exit 0).
    return 1 if verdict == "failed" else 0


def _not_a_text_log(data: Any) -> str | None:
    """Why these bytes cannot be a log (nothing, or binary), or None."""
    if len(data) == 0:
        return "empty: there is no log to inspect"
    head = bytes(data[:8192])
    if b"\0" in head:
        return (
            f"binary data (a NUL byte at offset {head.index(bytes(1))}), not a text log; decompress or extract it first"
        )
    return None


def _undecodable(data: Any, limit: int = 16 << 20) -> tuple[int, int] | None:
    """(count, line of the first) of the byte sequences that are not UTF-8 in the first `limit` bytes."""
    from verify.logs.logtext import decode

    head = bytes(data[:limit])
    _, count, first = decode(head)
    if not count or first is None:
        return None
    return count, head.count(b"\n", 0, first) + 1


def _diagnosis_text(name: str, verdict: str, diagnosis: Any, checks: list[Any]) -> str:
    lines = [f"{name}: {verdict.upper()}: {diagnosis.summary()}"]
    hit = diagnosis.primary
    if hit is not None:
        where = f" ({hit.process})" if hit.process else ""
        lines += [f"  line {hit.line_no}{where}: {hit.text[:300]}", f"  what: {hit.what}", f"  next: {hit.next}"]
    if diagnosis.incident is not None:
        lines.append(f"  shown by: {'; '.join(diagnosis.incident.shown_by)}")
        lines.append(f"  workaround: {diagnosis.incident.workaround}")
    lines += [f"  hint: {h.text}" for h in diagnosis.hints]
    e = diagnosis.last_exception
    if e is not None:
        frame = f" at {e.frame.file}:{e.frame.line} in {e.frame.function}" if e.frame else ""
        process = f", {e.process}" if e.process else ""
        lines.append(f"  last exception (line {e.line_no}{process}): {e.type}: {e.message[:200]}{frame}")
    if diagnosis.startup.completed is not None:
        state = "completed" if diagnosis.startup.completed else diagnosis.startup.note
        shown = f"last step shown {diagnosis.startup.last_phase} (line {diagnosis.startup.line_no})"
        lines.append(f"  startup: {state}, {shown}")
    if diagnosis.facts:
        lines.append("  facts: " + ", ".join(f"{f.name}={f.value} ({f.source})" for f in diagnosis.facts[:20]))
    lines += [f"  also: {h.id} (line {h.line_no}, {h.count}x)" for h in diagnosis.classes[1:6]]
    lines += [f"  warning: {h.id}: {h.title} (line {h.line_no}, {h.count}x)" for h in diagnosis.warnings[:6]]
    lines += [f"{c.status:<12} {c.name}: {c.message[:300]}" for c in checks]
    return "\n".join(lines)


def _inspect_autotune(args: argparse.Namespace) -> int:
    """Exit 1 when a policy is violated."""
    from pipeline.result import Status
    from verify.kernels.autotune import FORMATS, judge_cache, load_policies, map_to_hybrid_bucket, read_cache, winners
    from verify.serving import autotune_file_patterns
    from verify.stages.autotune import winners_table

    cache = read_cache(args.file, files=autotune_file_patterns())
    written_by = next(f for f in FORMATS if f.name == cache.format)
    policies = load_policies()
    if args.policy:
        unknown = set(args.policy) - {p.id for p in policies}
        if unknown:
            known = ", ".join(p.id for p in policies)
            raise InputError(f"--policy: unknown {', '.join(sorted(unknown))} (known: {known})")
        policies = tuple(p for p in policies if p.id in args.policy)
    checks = judge_cache(cache, arch=args.arch, policies=policies)
    table = winners(cache)
    read = cache.file if cache.layout == "legacy" else cache.file.parent
    lines = [
        f"{args.file}: FlashInfer autotune cache, {len(cache.entries)} entries, format {cache.format} "
        f"({written_by.shape}; FlashInfer {written_by.since}: {written_by.source})"
    ]
    lines += [f"  read: {read}"] if read != args.file else []
    lines += [f"  {k}: {v}" for k, v in cache.metadata.items()]
    tables = winners_table(cache)
    buckets_for: dict[str, object] = {}
    for (op, n, k), rows in table.items():
        lines.append(f"{op} N={n} K={k}:" if n >= 0 else f"{op} (profiles not read as a GEMM's):")
        lines += [
            f"  M<={e.m_bucket:<6} {e.runner:<24} tactic {json.dumps(e.tactic)}"
            if e.profile is None
            else f"  {e.profile[:120]}: {e.runner} tactic {json.dumps(e.tactic)}"
            for e in rows
        ]
    for m in args.m:
        bucket = map_to_hybrid_bucket(m)
        served = {
            f"{op} N={n} K={k}": next((e.runner for e in rows if e.m_bucket == bucket), None)
            for (op, n, k), rows in table.items()
        }
        buckets_for[str(m)] = {"bucket": bucket, "runners": served}
        lines.append(f"M={m} -> bucket {bucket}: " + ", ".join(f"{s}: {r}" for s, r in served.items()))
    document = {
        "file": str(args.file),
        "read": str(read),
        "format": cache.format,
        "layout": cache.layout,
        "format_source": {"flashinfer": written_by.since, "shape": written_by.shape, "source": written_by.source},
        "metadata": cache.metadata,
        "tables": tables,
        "buckets_for": buckets_for,
        "checks": [_jsonable(c) for c in checks],
    }
    lines += [f"{c.status:<12} {c.name}: {c.message}" for c in checks]
    _emit(args, document, "\n".join(lines))
    return 1 if any(c.status is Status.FAIL for c in checks) else 0


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


def _stats(args: argparse.Namespace) -> int:
    from verify.load.stats import compare_arms, fault_stats, parse_rate

    p0 = parse_rate(args.baseline_rate)
    result = fault_stats(p0, args.questions, args.faults)
    document: dict[str, object] = {"faults": result.to_json()}
    rarest, most = result.one_per_ci95
    rarest_text = "unbounded" if rarest is None else f"{rarest:,.0f}"
    lines = [
        f"baseline 1 fault per {1 / p0:.0f} questions; {args.faults} fault(s) in {args.questions} questions",
        (
            f"chance a clean run is luck (rate still at the baseline): {result.p_luck:.1%}"
            if args.faults == 0
            else f"chance of {args.faults} or fewer faults at the baseline rate: {result.p_luck:.1%}"
        ),
        f"observed rate, exact 95% interval: 1 per [{most:,.0f}, {rarest_text}]",
        f"clean questions needed to claim a fix: {result.need_clean_95:,} (95%), {result.need_clean_99:,} (99%); "
        f"a 10x lower rate: {result.need_clean_10x_lower_95:,} (95%)",
        f"if the rate were still the baseline, {args.questions} questions would show >= 5 faults with "
        f"{result.p_faulty_arm_shows_5:.0%} chance",
    ]
    if (args.other_questions is None) != (args.other_faults is None):
        raise InputError("give both --other-questions and --other-faults to compare two arms")
    if args.other_questions is not None:
        arms = compare_arms(args.faults, args.questions, args.other_faults, args.other_questions)
        document["comparison"] = arms.to_json()
        lines.append(
            f"this arm worse than the other (one-sided): conditional binomial p = {arms.p_conditional:.4f}, "
            f"E-test p = {arms.p_etest:.4f}"
        )
    _emit(args, document, "\n".join(lines))
    return 0


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
