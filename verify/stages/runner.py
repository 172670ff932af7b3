"""Run a cell's stages against a built image, cheapest first, stopping at the first failure.

A stage that FAILs stops the stages after it (they depend on it: never start a server for an
image whose imports are broken). The report, with the cell's expectation evaluated, is handed back
in memory: the receipt made from it (pipeline/receipt.py) is the one document a run writes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pipeline.console import console
from pipeline.docker.client import Docker
from pipeline.errors import InputError
from pipeline.matrix.model import STAGES, Arm, Cell, LoadSpec
from pipeline.receipt import Receipt
from pipeline.result import CheckResult, StageResult, Status, VerifyReport, evaluate, worst
from verify.logs.catalog import Facts
from verify.runtime import Runtime, as_runtime
from verify.serving import driver_for
from verify.stages.autotune import run_autotune
from verify.stages.imports import run_imports
from verify.stages.load import run_load_stage
from verify.stages.server import SharedServer
from verify.stages.serverplan import ServerPlan, plan_servers
from verify.stages.startup import run_startup

__all__ = ["STAGE_RUNNERS", "parse_stages", "verify_image"]


@dataclass(frozen=True, kw_only=True)
class StageContext:
    """What every stage is given: where servers run, the image (or environment) under test, the
    server plan and what the imports probe found."""

    runtime: Runtime
    cell: Cell
    image: str
    python: str
    arm: Arm | None
    out_dir: Path
    previous: Receipt | None = None  # an earlier receipt of the same cell, to diff autotune winners against
    load: LoadSpec | None = None  # the cell's load spec with command-line overrides; None = the cell's
    share: SharedServer  # startup keeps its server here for later stages; counts every server started
    plan: ServerPlan  # which stages start servers (verify.stages.serverplan)
    base_ref: str | None = None  # the untouched base image, probed by imports for the conflicts it brings
    facts: Facts  # for the log rule sets and signatures: the imports probe's, once it ran


def stage_facts(cell: Cell, imports: StageResult | None) -> Facts:
    """Facts for the log rule sets: from the imports probe when it ran, else from the cell. Taken
    once per verification, when the imports stage has run, from what it found (never its file)."""
    flashinfer = next((o.version for o in cell.overrides if o.name == "flashinfer-python"), None)
    driver = driver_for(cell.serve)
    cudnn = version = None
    if imports is not None and imports.probe_report is not None:
        report = imports.probe_report
        dist = report.dist("flashinfer-python")
        flashinfer = dist.version if dist else None
        cudnn = report.torch.cudnn if report.torch else None
        version = driver.version({name: d.version for name in driver.distributions if (d := report.dist(name))})
    return Facts(
        serve=cell.serve is not None,
        engine=driver.name,
        engine_version=version,
        arch=cell.arch,
        flashinfer=flashinfer,
        cudnn=cudnn,
    )


StageRunner = Callable[[StageContext], StageResult]


def _imports(ctx: StageContext) -> StageResult:
    return run_imports(
        ctx.runtime, ctx.cell, ctx.image, python=ctx.python, arm=ctx.arm, out_dir=ctx.out_dir, base_ref=ctx.base_ref
    )


def _startup(ctx: StageContext) -> StageResult:
    return run_startup(
        ctx.runtime,
        ctx.cell,
        ctx.image,
        arm=ctx.arm,
        out_dir=ctx.out_dir,
        facts=ctx.facts,
        share=ctx.share,
        keep=ctx.plan.keep_startup,
        tune=ctx.plan.startup_tunes,
    )


def _load(ctx: StageContext) -> StageResult:
    shared = None if ctx.plan.load_fresh else ctx.share.take()
    return run_load_stage(
        ctx.runtime,
        ctx.cell,
        ctx.image,
        arm=ctx.arm,
        out_dir=ctx.out_dir,
        spec=ctx.load,
        shared=shared,
        facts=ctx.facts,
        on_start=ctx.share.note_start,
    )


def _autotune(ctx: StageContext) -> StageResult:
    return run_autotune(
        ctx.runtime,
        ctx.cell,
        ctx.image,
        arm=ctx.arm,
        out_dir=ctx.out_dir,
        facts=ctx.facts,
        previous=ctx.previous,
        shared=ctx.share.peek() if ctx.plan.startup_tunes else None,
        on_start=ctx.share.note_start,
    )


# The stages, in dependency order.
STAGE_RUNNERS: dict[str, StageRunner] = {
    "imports": _imports,
    "startup": _startup,
    "autotune": _autotune,
    "load": _load,
}


def parse_stages(text: str | None) -> tuple[str, ...]:
    """`imports,startup` -> the stages in dependency order; unknown names are usage errors."""
    if not text:
        return STAGES
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:  # `--stages ,` verified nothing and passed
        raise InputError(f"--stages {text!r}: name at least one stage (stages: {', '.join(STAGES)})")
    for name in names:
        if name not in STAGES:
            raise InputError(f"--stages: unknown stage {name!r} (stages: {', '.join(STAGES)})")
    return tuple(s for s in STAGES if s in names)


def verify_image(
    runtime: Runtime | Docker,
    cell: Cell,
    *,
    image: str,
    image_id: str,
    python: str,
    stages: tuple[str, ...],
    arm: Arm | None,
    out_dir: Path,
    previous: Receipt | None = None,
    load: LoadSpec | None = None,
    extra_checks: dict[str, list[CheckResult]] | None = None,
    image_env: tuple[tuple[str, str], ...] = (),
    base_ref: str | None = None,
    runners: Mapping[str, StageRunner] = STAGE_RUNNERS,
) -> VerifyReport:
    """Run `stages` in order; `extra_checks` are judged with the stage they are keyed by (e.g. host
    expectations with imports), so they count toward its status. `image_env` is the image's ENV,
    which decides whether the startup server can also serve autotune (verify.stages.serverplan). `runners`:
    the stage table (stand-ins in unit tests)."""
    runtime = as_runtime(runtime)
    plan = plan_servers(cell, arm, stages, dict(image_env))
    console().say(f"{cell.id}: {plan.starts} server start(s) planned: {plan.reason}")
    share = SharedServer()  # the run owns the kept server: removed here whatever happens
    results: list[StageResult] = []
    facts = stage_facts(cell, None)
    try:
        for stage in stages:
            context = StageContext(
                runtime=runtime,
                cell=cell,
                image=image,
                python=python,
                arm=arm,
                out_dir=out_dir,
                previous=previous,
                load=load,
                share=share,
                plan=plan,
                base_ref=base_ref,
                facts=facts,
            )
            result = runners[stage](context)
            if result.stage == "imports":
                facts = stage_facts(cell, result)
            if extra_checks and extra_checks.get(stage):
                checks = [*result.checks, *extra_checks[stage]]
                result = dataclasses.replace(result, checks=tuple(checks), status=worst([c.status for c in checks]))
            results.append(_kept(result))
            _print_stage(cell, result)
            if result.status in (Status.FAIL, Status.ERROR):
                skipped = stages[stages.index(stage) + 1 :]
                if skipped:
                    console().say(f"{cell.id}: {stage} {result.status}: not running {', '.join(skipped)}")
                break
    finally:
        share.close()
    report = VerifyReport(
        cell=cell.id,
        arm=arm.name if arm else None,
        image=image,
        image_id=image_id,
        stages=tuple(results),
        outcome=evaluate(cell.expect, results),
        servers={
            "started": len(share.started),
            "runtime": runtime.kind,
            "containers": list(share.started),
            "compile_cache": list(share.cache_uses),
            **plan.to_json(),
        },
    )
    return report


def _kept(result: StageResult) -> StageResult:
    """The stage with only the files it kept named: a receipt names no file its run did not write
    (a server that never started leaves no log), since publish wants each beside it."""
    kept = {name: path for name, path in result.artifacts.items() if Path(path).exists()}
    if kept == result.artifacts:
        return result
    return dataclasses.replace(result, artifacts=kept)


def _print_stage(cell: Cell, result: StageResult) -> None:
    """The stage's verdict, then the checks a person must read: all of them with -v, otherwise only
    those that did not pass (a stage of 13 PASS lines says "13 passed"); a SKIP says why."""
    say = console().say
    shown = [c for c in result.checks if console().verbose or c.status not in (Status.PASS, Status.SKIP)]
    passed = sum(1 for c in result.checks if c.status is Status.PASS)
    why = ""
    if result.status is Status.SKIP:
        reasons = [c.message for c in result.checks if c.status is Status.SKIP and c.message]
        why = f": {' '.join(reasons[0].split())[:160]}" if reasons else ""
    counted = f", {passed} checks passed" if passed and len(shown) < len(result.checks) else ""
    say(f"{cell.id}: stage {result.stage}: {result.status} ({result.seconds:.1f}s){counted}{why}")
    for check in shown:
        if check.status is not Status.SKIP:
            say(f"  {check.status:<12} {check.name}: {check.message}")
        if check.status in (Status.FAIL, Status.ERROR) and check.evidence.get("last_log_lines"):
            say("\n".join(["  last log lines:", *(f"    {line}" for line in check.evidence["last_log_lines"][-15:])]))
