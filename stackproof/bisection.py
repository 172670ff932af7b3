"""`stackproof bisect CELL --package NAME --good V1 --bad V2`: the edge of the search (docs/bisect.md).

The versions come from the cell's own index for NAME (the index its override, requirement, lock
entry or `given:` names, mapped through the site's mirrors as every build is); the FlashInfer trio
moves in lockstep when NAME is flashinfer-python. Each probed version is the cell with NAME pinned
there: a layered host environment over the cell's environment without NAME (pipeline/host/layer.py),
named by its content, so a rerun builds nothing. Each step is one `stackproof ab` (stackproof/ab.py
`run_ab`, in this process) of V1's environment against the version's; verify/perf/bisection.py plans the
probes and judges the steps.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from pipeline.errors import CheckFailed, InfraError, InputError
from pipeline.guard.jsonfile import write_json_read_back
from pipeline.host.env import HostEnv, build_host_env, built_host_env, given_env, plan_host_env
from pipeline.host.layer import build_layer, given_base_plan, plan_layer
from pipeline.matrix.model import Cell, LoadSpec, Matrix, Requirement
from pipeline.matrix.site import SiteSettings
from pipeline.releases.simpleindex import list_versions, local_label
from stackproof.ab import KeptServers, Plan, Side, run_ab
from verify.perf.ab import AbReport
from verify.perf.bisection import (
    BEHAVIOURS,
    BisectReport,
    Evidence,
    Search,
    Step,
    conclude,
    evidence_of_ab,
    evidence_of_no_start,
    judge_evidence,
)

__all__ = ["BISECT_FILE", "TRIO", "Bisect", "moved_packages", "run_bisect"]

BISECT_FILE = "bisect.json"
TRIO = ("flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache")


@dataclass(frozen=True, kw_only=True)
class Bisect:
    """What the command line asked for, checked."""

    cell: Cell
    package: str  # canonical
    good: str
    bad: str
    metric: str
    threshold: float
    index: str | None  # --index: for a package the cell does not name
    plan: Plan  # each step's A/B: its schedule, starts (stackproof/ab.py); its threshold is `threshold`
    build_only: bool = False  # make every version's environment, run no A/B
    python: str | None = None  # --python: the layers sit on this existing environment, not a built one


def moved_packages(matrix: Matrix, cell: Cell, package: str, index: str | None) -> tuple[tuple[str, str, str], ...]:
    """(name, index, version the cell has or '') of every package a step pins: NAME, or the trio."""
    names = TRIO if package == TRIO[0] else (package,)
    known = _cell_pins(cell)
    moved = []
    for name in names:
        found = known.get(name)
        if found is None and name != package:
            continue  # a trio member the cell does not carry stays absent
        if found is None:
            if index is None:
                raise InputError(
                    f"{matrix.file}:{cell.line}: cells[{cell.id}]: names no index for {package} (not in its "
                    "overrides, requirements, lock or given): pass --index INDEX"
                )
            matrix.index(index)  # exit 2 when the matrix declares no such index
            found = (index, "")
        moved.append((name, found[0], found[1]))
    return tuple(moved)


def _cell_pins(cell: Cell) -> dict[str, tuple[str, str]]:
    """name -> (index, version) from the cell's own declarations, the most specific last."""
    from pipeline.build.lock import read_lock

    pins: dict[str, tuple[str, str]] = {g.name: (g.index, g.version) for g in cell.given}
    if cell.install is not None:
        pins |= {p.name: (p.index, p.version) for p in read_lock(cell).packages}
        pins |= {r.name: (r.index, r.version) for r in cell.install.requirements}
    pins |= {o.name: (o.index, o.version) for o in cell.overrides}
    return pins


MAX_VERSIONS = 128  # environments one bisection builds: 7 A/B steps search them


def candidate_versions(
    matrix: Matrix, site: SiteSettings, ask: Bisect, moved: tuple[tuple[str, str, str], ...]
) -> tuple[tuple[str, tuple[Requirement, ...]], ...]:
    """Every version from V1 to V2 with the pins that make it (the trio member at the same public version)."""
    cell = ask.cell
    python = cell.install.python_version if cell.install else "3"
    machine = (cell.install.python_platform if cell.install else cell.platform).replace("linux/amd64", "x86_64")
    machine = "aarch64" if "aarch64" in machine or "arm64" in machine else "x86_64"
    listed = {
        name: list_versions(site.index_location(matrix, index), name, python=python, machine=machine)
        for name, index, _ in moved
    }
    good, bad = Version(ask.good), Version(ask.bad)
    for end, flag in ((ask.good, "--good"), (ask.bad, "--bad")):
        if Version(end) not in listed[ask.package]:
            near = ", ".join(str(v) for v in listed[ask.package][-8:]) or "none"
            raise InputError(f"{flag} {end}: {ask.package} has no such version on index {moved[0][1]} (newest: {near})")
    pre = good.is_prerelease or bad.is_prerelease
    between = [v for v in listed[ask.package] if good <= v <= bad and (pre or not v.is_prerelease)]
    if len(between) > MAX_VERSIONS:  # issue 43: each is an environment built before the first A/B
        raise InputError(
            f"--good {ask.good} --bad {ask.bad}: {len(between):,} versions of {ask.package} between them, past the "
            f"{MAX_VERSIONS} a bisection builds; narrow the range (the newest good and oldest bad you know)"
        )
    out = []
    for version in between:
        pins = _pins_at(version, moved, listed)
        if pins is not None:
            out.append((str(version), pins))
    return tuple(out)


def _pins_at(
    version: Version, moved: tuple[tuple[str, str, str], ...], listed: dict[str, tuple[Version, ...]]
) -> tuple[Requirement, ...] | None:
    pins = []
    for name, index, current in moved:
        label = local_label(current)  # jit-cache keeps the cell's +cuXY
        same = [v for v in listed[name] if v.public == version.public and (not label or f"+{v.local}" == label)]
        if not same:
            return None  # a trio member missing at this version: not a version the trio can move to
        pins.append(Requirement(name=name, version=str(same[-1]), index=index))
    return tuple(pins)


def _conclusion(search: Search, ask: Bisect) -> tuple[str, str | None, str | None, str]:
    """The result, first bad and last good versions and why: the search's, or none under --build-only."""
    if ask.build_only:
        return "NOT RUN", None, None, "every environment made; no A/B run (--build-only)"
    return conclude(search)


def run_bisect(
    matrix: Matrix,
    images: Path,
    site: SiteSettings,
    ask: Bisect,
    *,
    moved: tuple[tuple[str, str, str], ...],
    spec: LoadSpec,
    out: Path,
) -> BisectReport:
    """Build what the probes need, run the A/Bs, write bisect.json (read back before it is returned)."""
    started = time.monotonic()
    versions = candidate_versions(matrix, site, ask, moved)
    pins = dict(versions)
    envs = _Environments(matrix, images, site, ask.cell, tuple(name for name, _, _ in moved), python=ask.python)
    names = tuple(v for v, _ in versions)
    print(f"bisect: {ask.package} {len(names)} versions {names[0]} .. {names[-1]}: {', '.join(names)}", file=sys.stderr)
    # Every listed version's environment now (a layer is 1-2 s): a rerun, or a later bisect with
    # another metric over the same versions, finds each one built.
    made = {version: envs.get(pins[version]) for version in names}
    baseline = made[ask.good]
    side_a = envs.side(baseline, ask.good, pins[ask.good])
    search, steps = _search(ask, names, pins, made, side_a, envs, spec, out)
    result, first_bad, last_good, reason = _conclusion(search, ask)
    report = BisectReport(
        cell=ask.cell.id,
        package=ask.package,
        moved=tuple(name for name, _, _ in moved),
        index=moved[0][1],
        metric=ask.metric,
        threshold=ask.threshold,
        good=ask.good,
        bad=ask.bad,
        versions=names,
        baseline=_env_json(baseline),
        environments=tuple(
            {"version": v, "pins": [p.pin for p in pins[v]], **_env_json(env)} for v, env in made.items()
        ),
        steps=tuple(steps),
        result=result,
        first_bad=first_bad,
        last_good=last_good,
        reason=reason,
        builds=envs.builds,
        ab_runs=len(steps),
        seconds=round(time.monotonic() - started, 1),
        files={"dir": str(out), "report": str(out / BISECT_FILE)},
    )
    path = out / BISECT_FILE
    return BisectReport.from_json(write_json_read_back(path, report.to_json(), "bisect report"))


def _search(
    ask: Bisect,
    names: tuple[str, ...],
    pins: dict[str, tuple[Requirement, ...]],
    made: dict[str, HostEnv],
    side_a: Side,
    envs: _Environments,
    spec: LoadSpec,
    out: Path,
) -> tuple[Search, list[Step]]:
    """The A/B steps of the binary search (none under --build-only), each against the good end."""
    search, steps = Search(versions=names), list[Step]()
    # The good end's server is started by the first step and kept up for every later one.
    with contextlib.ExitStack() as stack:
        kept = KeptServers(stack=stack, labels=frozenset({side_a.label}), servers={})
        while not ask.build_only and (probe := search.next_probe()) is not None:
            version, env, number = names[probe], made[names[probe]], len(steps) + 1
            print(
                f"bisect: step {number}: {ask.good} (A) against {version} (B), interval {search.interval}",
                file=sys.stderr,
            )
            side_b = envs.side(env, version, pins[version])
            evidence = _step(side_a, side_b, ask, spec, out / f"step{number:02d}-{version}", kept)
            judgement, why = judge_evidence(ask.metric, evidence)
            search = search.after(probe, judgement, why)
            steps.append(
                Step(
                    number=number,
                    version=version,
                    pins=tuple(p.pin for p in pins[version]),
                    environment=_env_json(env),
                    evidence=evidence,
                    judgement=judgement,
                    why=why,
                    interval=search.interval,
                )
            )
            print(f"bisect: step {number}: {version} is {judgement}: {why}", file=sys.stderr)
    return search, steps


def _step(a: Side, b: Side, ask: Bisect, spec: LoadSpec, out: Path, kept: KeptServers) -> Evidence:
    started = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    try:
        # One metric decides a step (--metric): its interval at 95%, not the run's family-wise one.
        plan = replace(ask.plan, threshold=ask.threshold, stop=step_decided(ask.metric))
        report = run_ab(a, b, spec=spec, plan=plan, out_dir=out, family=1, kept=kept)
    except CheckFailed as exc:
        if not str(exc).startswith("side B"):
            raise CheckFailed(f"the good end {ask.good} does not start: {exc}") from exc
        return evidence_of_no_start(str(exc), time.monotonic() - started)
    if report.verdict == "REFUSED":  # the engines did not get the same memory: no step can be judged
        raise InfraError(
            f"{b.label} against {a.label}: REFUSED: {report.refusal} (report: {report.files.get('report')})"
        )
    return evidence_of_ab(report, ask.metric)


def step_decided(metric: str) -> Callable[[AbReport], bool]:
    """A step's looks stop once its metric is judged BAD or GOOD (one-sided, as the step is judged):
    another metric's REGRESSION, or one still UNDECIDED, does not decide the step nor keep it going.
    `greedy` and `start` need no more pairs than the first look's."""

    def stop(report: AbReport) -> bool:
        if metric in BEHAVIOURS:
            return True
        return judge_evidence(metric, evidence_of_ab(report, metric))[0] != "UNDECIDED"

    return stop


def _env_json(env: HostEnv) -> dict[str, object]:
    return {"ref": env.ref, "digest": env.digest, "source": env.source, "built_in_s": env.built_in_s}


class _Environments:
    """The layered environment of each set of pins over the cell's environment without them, built once."""

    def __init__(
        self,
        matrix: Matrix,
        images: Path,
        site: SiteSettings,
        cell: Cell,
        moved: tuple[str, ...],
        *,
        python: str | None = None,
    ) -> None:
        if not cell.on_host:
            raise InputError(
                f"{matrix.file}:{cell.line}: cells[{cell.id}]: bisect runs on host cells (runtime: host, with "
                "install: or --python); an image cell is not supported yet"
            )
        self.matrix, self.site, self.cell = matrix, site, cell
        self._stem: HostEnv | None = None
        self.given: Path | None = None
        stem_cell = replace(cell, overrides=tuple(o for o in cell.overrides if o.name not in moved))
        if python is not None:  # the layers sit on an existing environment (a GPU host's own venv)
            self._stem = given_env(python)
            self.given = self._stem.python
            self.stem_plan = given_base_plan(stem_cell, self._stem)
        elif cell.install is None:
            raise InputError(
                f"{matrix.file}:{cell.line}: cells[{cell.id}] has no `install:` to build the versions over: "
                "pass --python PY (the environment it was verified with)"
            )
        else:
            self.stem_plan = plan_host_env(matrix, stem_cell, images)
        self.images = images
        self.builds = 0
        self._made: dict[tuple[str, ...], HostEnv] = {}

    def stem(self) -> HostEnv:
        if self._stem is None:
            found = built_host_env(self.stem_plan)
            if found is None:
                found = build_host_env(self.stem_plan, self.site, self.matrix, self.images)
                self.builds += 1
            self._stem = found
        return self._stem

    def get(self, pins: tuple[Requirement, ...]) -> HostEnv:
        key = tuple(p.pin for p in pins)
        if key not in self._made:
            env = build_layer(plan_layer(self.stem_plan, pins, given=self.given), self.stem(), self.site, self.matrix)
            self.builds += env.source == "built"
            self._made[key] = env
        return self._made[key]

    def side(self, env: HostEnv, version: str, pins: tuple[Requirement, ...]) -> Side:
        from stackproof.runjob import host_runtime

        runtime = host_runtime(self.matrix, self.cell, env)  # the layers over one base share a compile-cache slot
        cell = replace(
            self.cell, overrides=(*(o for o in self.cell.overrides if o.name not in {p.name for p in pins}), *pins)
        )
        return Side(
            label=f"{self.cell.id}@{pins[0].name}=={version}", cell=cell, arm=None, runtime=runtime, image=env.ref
        )


def parse_version(text: str, flag: str) -> str:
    try:
        return str(Version(text))
    except InvalidVersion:
        raise InputError(f"{flag} {text!r} is not a version (PEP 440)") from None


def check_ends(good: str, bad: str) -> None:
    if Version(good) >= Version(bad):
        raise InputError(f"--good {good} must be older than --bad {bad}")


def canonical(name: str) -> str:
    return str(canonicalize_name(name))
