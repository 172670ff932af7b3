"""The jobs that touch images: `verify` (stages against a built image) and `run` (build + verify).

`run` is the main job: build the cell (or reuse its content tag), then its stages in order —
imports (no server), startup (server, readiness, one completion), autotune (GPU cells), load (a
short load run on startup's server, kept running) — stopping at the first failure. The cell's
`expect` decides whether that outcome passes the pipeline.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.build.image import build_cell, build_seconds, built_image
from pipeline.docker.client import Docker
from pipeline.errors import InfraError, InputError
from pipeline.host.env import (
    HostEnv,
    build_host_env,
    built_host_env,
    given_differences,
    given_env,
    import_differences,
    lock_differences,
    plan_host_env,
)
from pipeline.host.geometry import host_fingerprint
from pipeline.host.modelstore import ensure_model
from pipeline.matrix.model import ArchiveBase, Arm, Cell, LoadSpec, Matrix
from pipeline.matrix.site import SiteSettings
from pipeline.receipt import Receipt
from pipeline.receiptrender import write_all
from pipeline.result import CheckResult, Status
from verify.runtime.host import HostRuntime
from verify.stages.receipt import build_receipt, build_section
from verify.stages.runner import verify_image

__all__ = [
    "exclusive_dir",
    "host_build_section",
    "host_runtime",
    "lineage_env",
    "remove_dead_runs",
    "run_cell",
    "run_on_host",
]

SERVER_STAGES = {"startup", "autotune", "load"}  # the stages that start a server container


def run_cell(
    docker: Docker,
    matrix: Matrix,
    cell: Cell,
    site: SiteSettings,
    images_dir: Path,
    *,
    build: bool,
    out_root: Path,
    stages: tuple[str, ...],
    arm_name: str | None = None,
    previous: Receipt | None = None,
    load: LoadSpec | None = None,
    fetch_model: bool = True,
) -> Receipt:
    """`stackproof run` (`build`: build the cell, then verify it) and `stackproof verify` (verify
    the cell's already-built image, its content tag; nothing is built). The receipt it wrote."""
    arm = cell.arm(arm_name) if arm_name else None
    if build:
        _ensure_model(matrix, cell, stages, fetch_model)  # a wrong revision ends the run before a long build
        built = build_cell(docker, matrix, cell, site, images_dir, out_dir=out_root / cell.id)
        tag, image_id, base_ref = built.tag, built.image_id, built.base_ref
        source, made_in_s = built.source, built.made_in_s
    else:
        plan, image = built_image(docker, matrix, cell, site, images_dir)
        _ensure_model(matrix, cell, stages, fetch_model)
        print(f"{cell.id}: verifying {plan.tag} ({image.id[:19]})", file=sys.stderr)
        tag, image_id, base_ref = plan.tag, image.id, plan.base_ref
        source, made_in_s = "local", build_seconds(out_root / cell.id, plan.tag)
    return _verify_with_receipt(
        docker,
        matrix,
        cell,
        image=tag,
        image_id=image_id,
        base_ref=base_ref,
        stages=stages,
        arm=arm,
        out_dir=_run_dir(out_root, cell),
        previous=previous,
        load=load,
        build=(source, made_in_s),
    )


def _verify_with_receipt(
    docker: Docker,
    matrix: Matrix,
    cell: Cell,
    *,
    image: str,
    image_id: str,
    base_ref: str,
    stages: tuple[str, ...],
    arm: Arm | None,
    out_dir: Path,
    previous: Receipt | None,
    load: LoadSpec | None,
    build: tuple[str, float | None] = ("local", None),
) -> Receipt:
    """The stages, then the receipt (JSON, JUnit XML, Markdown) of this image on this host."""
    started = time.time()
    host_check = _host_expectations(matrix, cell)
    before = docker.image(image)
    report = verify_image(
        docker,
        cell,
        image=image,
        image_id=image_id,
        python=matrix.python_of(cell),
        stages=stages,
        arm=arm,
        out_dir=out_dir,
        previous=previous,
        load=load,
        extra_checks={stages[0]: [host_check]} if host_check and stages else None,
        image_env=before.env if before else (),
        base_ref=base_ref,
    )
    info = before
    receipt = build_receipt(
        report,
        matrix_digest=matrix.digest,
        host=host_fingerprint(docker.server_version()),
        started_at=started,
        finished_at=time.time(),
        repo_digests=info.repo_digests if info else (),
        image_store=docker.image_store(),
        gpu_access=dataclasses.asdict(docker.chosen_gpu_access) if docker.chosen_gpu_access else None,
        base=_archive_base(matrix, cell),
        build=build_section(source=build[0], made_in_s=build[1], image_size=info.size if info else None),
    )
    paths = write_all(receipt, out_dir)
    print(f"{cell.id}: receipt {receipt.status}: {paths['receipt']} (+ junit.xml, summary.md)", file=sys.stderr)
    return receipt


def run_on_host(
    matrix: Matrix,
    cell: Cell,
    site: SiteSettings,
    images_dir: Path,
    *,
    build: bool,
    python: str | None,
    out_root: Path,
    stages: tuple[str, ...],
    arm_name: str | None = None,
    previous: Receipt | None = None,
    load: LoadSpec | None = None,
    fetch_model: bool = True,
) -> Receipt:
    """The same stages on the host runtime: in the environment `python` belongs to (`--python`),
    else in the cell's built environment (`build`: built now when it is not here)."""
    arm = cell.arm(arm_name) if arm_name else None
    env = _host_env(matrix, cell, site, images_dir, build=build, python=python, out_dir=out_root / cell.id)
    _ensure_model(matrix, cell, stages, fetch_model)
    print(f"{cell.id}: verifying the host environment {env.ref} ({env.digest[:19]})", file=sys.stderr)
    runtime = host_runtime(matrix, cell, env)
    out_dir = _run_dir(out_root, cell)
    checks = (_given_check(cell, env), _lock_check(cell, env), _host_expectations(matrix, cell))
    first_checks = [c for c in checks if c]
    started = time.time()
    report = verify_image(
        runtime,
        cell,
        image=env.ref,
        image_id=env.digest,
        python=str(env.python),
        stages=stages,
        arm=arm,
        out_dir=out_dir,
        previous=previous,
        load=load,
        extra_checks={stages[0]: first_checks} if first_checks and stages else None,
    )
    receipt = build_receipt(
        report,
        matrix_digest=matrix.digest,
        host=host_fingerprint(None),
        started_at=started,
        finished_at=time.time(),
        build=host_build_section(env),
        environment=env.to_json(),
    )
    paths = write_all(receipt, out_dir)
    print(f"{cell.id}: receipt {receipt.status}: {paths['receipt']} (+ junit.xml, summary.md)", file=sys.stderr)
    return receipt


def _host_env(
    matrix: Matrix, cell: Cell, site: SiteSettings, images_dir: Path, *, build: bool, python: str | None, out_dir: Path
) -> HostEnv:
    if python is not None:
        given = given_env(python)
        _same_python_as_lock(matrix, cell, given)
        return given
    plan = plan_host_env(matrix, cell, images_dir)
    if build:
        out_dir.mkdir(parents=True, exist_ok=True)
        return build_host_env(plan, site, matrix, images_dir, log=out_dir / "host-env.log")
    env = built_host_env(plan)
    if env is None:
        raise InfraError(
            f"{cell.id}: its host environment {plan.name} is not built: run `stackproof build {cell.id}` "
            "(or verify an existing one with --runtime host --python PY)"
        )
    return env


def _same_python_as_lock(matrix: Matrix, cell: Cell, env: HostEnv) -> None:
    """A given environment for a locked cell runs the Python the lock was resolved for (exit 2)."""
    if cell.install is None:
        return
    wanted = cell.install.python_version
    if ".".join(env.python_version.split(".")[:2]) != wanted:
        raise InputError(
            f"{matrix.file}:{cell.line}: cells[{cell.id}].install.python_version: the lock is for Python {wanted}, "
            f"and --python {env.python} is Python {env.python_version}"
        )


def _given_check(cell: Cell, env: HostEnv) -> CheckResult | None:
    """The environment against the versions the cell says it is given: a FAIL before any stage
    runs on an environment that is not the one the cell describes."""
    if not cell.given:
        return None
    differences = given_differences(cell, env.versions)
    differences += import_differences(env.python, tuple(r.name for r in cell.given))
    wanted = {r.name: r.version for r in cell.given}
    evidence: dict[str, Any] = {"given": wanted, "differences": list(differences)}
    if differences:
        return CheckResult(
            name="given-environment", status=Status.FAIL, message="; ".join(differences), evidence=evidence
        )
    message = f"{len(wanted)} given packages at their versions ({env.packages} installed)"
    return CheckResult(name="given-environment", status=Status.PASS, message=message, evidence=evidence)


def _lock_check(cell: Cell, env: HostEnv) -> CheckResult | None:
    """An environment given with --python for a locked cell holds the cell's lock (issue 43): a FAIL
    before any stage runs on one that does not, whatever it imports."""
    if cell.install is None or env.source != "given":
        return None
    differences = lock_differences(cell, env.versions)
    evidence: dict[str, Any] = {"differences": list(differences[:50]), "count": len(differences)}
    if differences:
        shown = "; ".join(differences[:5]) + (f"; and {len(differences) - 5} more" if len(differences) > 5 else "")
        return CheckResult(name="lock-environment", status=Status.FAIL, message=shown, evidence=evidence)
    message = f"the environment holds the cell's lock ({env.packages} installed)"
    return CheckResult(name="lock-environment", status=Status.PASS, message=message, evidence=evidence)


def lineage_env(matrix: Matrix, cell: Cell) -> tuple[tuple[str, str], ...]:
    """What an image of the cell would have as ENV: its chain's `env`, the cell's own last."""
    merged: dict[str, str] = {}
    for member in reversed(matrix.lineage(cell)):
        merged.update(dict(member.env))
    return tuple(merged.items())


def host_runtime(matrix: Matrix, cell: Cell, env: HostEnv) -> HostRuntime:
    """The runtime that serves `cell` from `env`: its interpreter, its files, the ENV an image of the cell
    would have, and its slot in a site's compile cache (by its compiled packages: HostEnv.compile_cache_key)."""
    return HostRuntime(
        python=env.python,
        files_root=env.files_root,
        image_env=lineage_env(matrix, cell),
        cache_key=env.compile_cache_key,
    )


def host_build_section(env: HostEnv) -> dict[str, Any]:
    """The receipt's `build` for a host environment: built now, found built, or given."""
    why = {"given": "given with --python: not built by this tool", "local": "built by an earlier run"}
    seconds: dict[str, Any] = {"value": env.built_in_s, "unit": "s"}
    if env.built_in_s is None:
        seconds["reason"] = why.get(env.source, "not recorded")
    size = {"value": None, "unit": "bytes", "reason": "a host environment, not an image"}
    return {"source": env.source, "build_seconds": seconds, "image_size_bytes": size}


def _ensure_model(matrix: Matrix, cell: Cell, stages: tuple[str, ...], fetch_model: bool) -> None:
    """Stages that start a server need the cell's `hf:` model in the host store first, so a server's
    readiness timeout covers its start only and a wrong revision fails before any server starts."""
    if cell.serve is None or not set(stages) & SERVER_STAGES:
        return
    where = f"{matrix.file}:{cell.line}: cells[{cell.id}].serve.model"
    ensure_model(cell.serve.model, where=where, allow_fetch=fetch_model)


def _host_expectations(
    matrix: Matrix, cell: Cell, *, this_host: Callable[[], dict[str, Any]] | None = None
) -> CheckResult | None:
    """A cell made by `stackproof repro` records the reporter's host facts (driver, kernel, GPU, host
    cuDNN) as the cell's `host:`: not image content, so checked against this host (WARN
    on a difference) and reported with the first stage that runs. `this_host`: the doctor document
    of this host (default: the doctor probe run here, only when the cell has expectations)."""
    from stackproof.doctor import Fingerprint, check_host_expectations, doctor_host, host_expectations

    expected = host_expectations(cell)
    if not expected:
        return None
    document = this_host() if this_host else doctor_host(sys.executable, imports=False)
    return check_host_expectations(expected, Fingerprint.parse(document, source="this host"))


def _run_dir(out_root: Path, cell: Cell) -> Path:
    """A new directory for this run, made with an exclusive mkdir: two runs of one cell started in
    the same second (two CI jobs, two terminals) get `run-...` and `run-...-2`, never one shared."""
    return exclusive_dir(out_root / cell.id, time.strftime("run-%Y%m%dT%H%M%S"))


def exclusive_dir(parent: Path, stem: str) -> Path:
    """`parent/stem`, or `stem-2`, `stem-3`...: the first that this process creates itself."""
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InfraError(f"{parent}: cannot create the output directory: {exc.strerror}") from exc
    for n in range(1, 10_000):
        path = parent / (stem if n == 1 else f"{stem}-{n}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        except OSError as exc:
            raise InfraError(f"{path}: cannot create the run directory: {exc.strerror}") from exc
        return path
    raise InfraError(f"{parent}: 10,000 runs named {stem}: remove old run directories")


def remove_dead_runs(docker: Docker) -> list[str]:
    """Containers left by runs that died unclean (SIGKILL) on this host go before this run starts."""
    removed = docker.collect_garbage()
    for name in removed:
        print(f"stackproof: removed {name}: its run is gone", file=sys.stderr)
    return removed


def _archive_base(matrix: Matrix, cell: Cell) -> dict[str, Any] | None:
    """The receipt's `image.base` when the cell's image grew from a local archive: the file the
    content tag pins, so a reader can tell which host tree the verified image was built over."""
    base = matrix.root_base(cell)
    if not isinstance(base, ArchiveBase):
        return None
    return {"name": base.name, "archive": base.archive, "format": base.format, "sha256": base.sha256}
