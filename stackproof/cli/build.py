"""`stackproof render|lock|build|run|verify`: the jobs that make a cell's image (or host
environment) and verify it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.errors import InputError
from pipeline.matrix.model import Cell, LoadSpec, Matrix
from stackproof.cli.common import NO_PREFLIGHT_HELP, Command, arg
from stackproof.cli.common import emit as _emit
from stackproof.cli.common import load as _load
from stackproof.cli.common import load_spec as _load_spec

if TYPE_CHECKING:
    from pipeline.docker.client import Docker
    from pipeline.matrix.site import SiteSettings
    from pipeline.receipt import Receipt

__all__ = ["COMMANDS"]


# `run` and `verify` take the same options: one is the other with a build first.
VERIFY_OPTIONS = (
    arg("cell"),
    arg("--arm", default=None),
    arg("--stages", default=None, help="comma-separated stages (default: all)"),
    arg("--out", type=Path, default=Path("stackproof-out")),
    arg(
        "--previous",
        type=Path,
        default=None,
        metavar="RECEIPT",
        help="an earlier run's receipt.json (OUT/CELL/run-*/receipt.json): diff autotune winners against it",
    ),
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
    arg(
        "--compile-cache",
        type=Path,
        default=None,
        metavar="DIR",
        help="the servers' compile/JIT cache, one slot per image (sets STACKPROOF_COMPILE_CACHE); the receipt "
        "says whether it was warm. `none`: start cold whatever the site sets",
    ),
    arg(
        "--compile-cache-compare",
        action="store_true",
        help="verify twice with a fresh cache (cold, then warm) and print the two startup times side by side",
    ),
)

PULL_ONLY_HELP = (
    "never build: take the image from STACKPROOF_REGISTRY or fail (exit 3); registry_ref is always the "
    "registry's digest of the image, also when its content tag was already here"
)


def _render(args: argparse.Namespace) -> int:
    from pipeline.build.plan import plan_cell, write_plan
    from pipeline.matrix.site import load_site

    matrix, images = _load(args)
    site = load_site(matrix)
    cells: list[Cell] = [matrix.cell(c) for c in args.cells] if args.cells else _image_cells(matrix)
    written = []
    for cell in cells:
        plan = plan_cell(matrix, cell, site, images)
        target = args.out / cell.id
        write_plan(plan, target)
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


def _image_cells(matrix: Matrix) -> list[Cell]:
    """Every cell that has an image: `render` with no cell named. A host-runtime cell has none (a
    Python environment on the host instead); named, it stays an error, unnamed it is left out, said."""
    from pipeline.matrix.model import HostBase

    hosted = [c.id for c in matrix.cells if isinstance(c.base, HostBase)]
    if hosted:
        print(f"render: left out (host runtime, no image): {', '.join(hosted)}", file=sys.stderr)
    return [c for c in matrix.cells if not isinstance(c.base, HostBase)]


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
    if result.source == "local" and result.registry_ref:
        how = f" (existing, {result.registry_ref})"
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
    from stackproof.compilecompare import compared, use_compile_cache

    use_compile_cache(args.compile_cache)  # a bad directory is exit 2 before anything runs
    if args.compile_cache_compare:
        code, document, line = compared(lambda: _verify_once(args, build=build, quiet=True))
        _emit(args, document, line)
        return code
    return _verify_once(args, build=build)[0]


def _verify_once(args: argparse.Namespace, *, build: bool, quiet: bool = False) -> tuple[int, Receipt]:
    from stackproof.runjob import remove_dead_runs, run_cell
    from verify.stages.runner import parse_stages

    matrix, images = _load(args)
    cell = matrix.cell(args.cell)
    if args.arm:
        cell.arm(args.arm)  # a bad arm name is a usage error before anything is built or run
    stages = parse_stages(args.stages)
    site = _site(matrix)
    previous = _previous(args.previous)  # a bad file is exit 2 before anything runs
    load = _load_spec(args, cell.serve.load) if cell.serve else None
    runtime = args.runtime or cell.runtime
    if args.python is not None and runtime != "host":
        raise InputError(f"--python {args.python}: only with --runtime host (cell {cell.id} runs on {runtime})")
    if runtime == "host":
        found = _on_host(args, matrix, cell, images, site, build=build, stages=stages, load=load, previous=previous)
        return _verdict(args, cell, found, quiet=quiet), found
    docker = _engine(args, matrix, cell, images, site)  # bad input is exit 2 before any host check
    remove_dead_runs(docker)
    receipt = run_cell(
        docker,
        matrix,
        cell,
        site,
        images,
        build=build,
        out_root=args.out,
        stages=stages,
        arm_name=args.arm,
        previous=previous,
        load=load,
        fetch_model=not args.no_fetch,
    )
    return _verdict(args, cell, receipt, quiet=quiet), receipt


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
    previous: Receipt | None,
) -> Receipt:
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
        previous=previous,
        load=load,
        fetch_model=not args.no_fetch,
    )


def _previous(path: Path | None) -> Receipt | None:
    """`--previous`: an earlier run's receipt, read through the receipt model; a file that is not
    one (a report.json of an older stackproof among them) is exit 2 naming it."""
    if path is None:
        return None
    from pipeline.receipt import Receipt, ReceiptError

    try:
        return Receipt.read(path)
    except ReceiptError as exc:
        old = " (stackproof no longer writes report.json: the receipt holds every stage's checks)"
        raise InputError(
            f"--previous {exc}; pass an earlier run's receipt.json{old if path.name == 'report.json' else ''}"
        ) from None


def _verdict(args: argparse.Namespace, cell: Cell, receipt: Receipt, *, quiet: bool = False) -> int:
    """The pipeline's verdict (the cell's `expect` applied), and with `--json` the receipt itself:
    the document receipt.json holds, so what a script reads from stdout is what publish gates on."""
    outcome = receipt.outcome
    verdict = "NOT_REPRODUCED" if outcome.not_reproduced else "PASS" if outcome.passed else "FAIL"
    stages_line = ", ".join(f"{s.stage} {s.status}" for s in receipt.stages)
    if not quiet:  # --compile-cache-compare prints one document for both runs
        _emit(args, receipt.to_json(), f"{cell.id}: {verdict}: {outcome.summary} [{stages_line}]")
    return 0 if outcome.passed else 1


COMMANDS = (
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
)
