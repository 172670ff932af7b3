"""Build a cell's image: skip when the content tag exists here, pull it when the site's registry has
it (pipeline.registry.fleet), else build its bases and then it, stream the log, record it, and push it when asked.

The build context is assembled in a temporary directory from the plan; the per-index pip options
(mirror URLs may carry credentials) and the CA bundle are written to a separate private directory
and passed as BuildKit secrets, so they never enter the context, a layer or the log.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

from pipeline.build.bootstrap import ensure_base
from pipeline.build.plan import BuildPlan, plan_cell
from pipeline.cache import cache_dir, locked
from pipeline.console import console
from pipeline.docker.client import Docker, ImageInfo
from pipeline.docker.gc import job_labels
from pipeline.errors import InfraError, InputError
from pipeline.guard.redact import redact
from pipeline.matrix.model import ArchiveBase, BootstrapBase, Cell, CellBase, Matrix, RegistryBase
from pipeline.matrix.site import Mirror, SiteSettings
from pipeline.registry.fleet import Wanted, bind_local, cache_ref, fetch_built, push_built, registry_credentials
from pipeline.registry.oci import Credentials

__all__ = [
    "BuildResult",
    "build_cell",
    "build_seconds",
    "built_image",
    "index_options",
    "link_build_log",
    "write_context",
]

MATRIX_DIGEST_LABEL = "io.stackproof.matrix.digest"
# The last line of a build log whose build finished: which tag it built. `build.log` points only
# at such a log, and a skipped build finds the log that built its tag by it.
BUILT_MARK = "# stackproof: built "
_STEP = re.compile(r"#(\d+) \[(?:[^\]\s]+ )?(\d+)/(\d+)\]")
_CACHED = re.compile(r"#(\d+) CACHED\b")
_RESOLVED_BASE = re.compile(r"resolve (?:docker-image://)?(\S+@sha256:[0-9a-f]{64})")


@dataclass(frozen=True, kw_only=True)
class BuildResult:
    cell: str
    tag: str
    image_id: str
    skipped: bool
    seconds: float
    base_ref: str
    base_resolved: str | None  # what a tag-only registry base resolved to, read from the build log
    matrix_digest: str
    log: str | None
    source: str = "built"  # "built", "local" (the content tag was here) or "registry" (pulled by digest)
    registry_ref: str | None = None  # HOST/REPO@sha256:... pulled from or pushed to
    # How long the build that made this image took: this one's, or for a skipped build the one
    # whose log is here (its last line says); None when it was built elsewhere or pulled.
    made_in_s: float | None = None

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def built_image(
    docker: Docker, matrix: Matrix, cell: Cell, site: SiteSettings, images_dir: Path, *, builds_it: str = "build"
) -> tuple[BuildPlan, ImageInfo]:
    """The cell's plan (its content tag) and the image docker has under that tag: the one answer to
    "is this cell built?". Not built: bad input (exit 2), naming the command that builds it."""
    plan = plan_cell(matrix, cell, site, images_dir)
    image = docker.image(plan.tag)
    if image is None:
        raise InputError(f"{cell.id}: image {plan.tag} is not built: run `stackproof {builds_it} {cell.id}`")
    return plan, image


def build_cell(
    docker: Docker,
    matrix: Matrix,
    cell: Cell,
    site: SiteSettings,
    images_dir: Path,
    *,
    out_dir: Path,
    no_cache: bool = False,
    force: bool = False,
    push: bool = False,
    pull_only: bool = False,
) -> BuildResult:
    """Build `cell` (and whatever it stands on) unless its content tag is here or in the site's registry.

    `force` (or `no_cache`) builds even then; `push` pushes the result to the site's registry under
    its content tag; `pull_only` never builds (a GPU runner of a fleet): InfraError when neither
    this daemon nor the registry has the image."""
    for note in cell.notes:
        print(f"note: {cell.id}: {note}", file=sys.stderr)
    plan = plan_cell(matrix, cell, site, images_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    credentials = registry_credentials(site.registry) if site.registry and (push or not force) else None
    result = None if force or no_cache else _reuse(docker, plan, site, credentials, pull_only=pull_only)
    if result is not None and link_build_log(out_dir, plan.tag) is not None:
        result = dataclasses.replace(result, made_in_s=build_seconds(out_dir, plan.tag))
    if result is None:
        if pull_only:
            where = f"nor in {site.registry}" if site.registry else "and no registry is set (STACKPROOF_REGISTRY)"
            raise InfraError(
                f"{cell.id}: {plan.tag} is neither on this daemon {where}, and this runner does not build "
                f"(--pull-only): run `stackproof build {cell.id} --push` on a build runner first"
            )
        if site.registry and not force:
            print(f"{cell.id}: {plan.tag} is not in {site.registry}: building it here", file=sys.stderr)
        # Before the bases: a build pip cannot finish must not start with minutes of debootstrap.
        site.check_reachable(matrix, plan.indexes)
        _ensure_bases(docker, matrix, cell, site, images_dir, out_dir)
        result = _build(docker, matrix, plan, site, out_dir=out_dir, no_cache=no_cache)
    if push:
        if not site.registry:
            raise InputError("--push: set STACKPROOF_REGISTRY=HOST[:PORT][/NAMESPACE] (the fleet's registry)")
        pushed = push_built(
            docker, registry=site.registry, cell_id=cell.id, content_tag=plan.tag, credentials=credentials
        )
        result = dataclasses.replace(result, registry_ref=pushed)
    (out_dir / "build.json").write_text(json.dumps(result.to_json(), indent=2) + "\n")
    return result


def _ensure_bases(
    docker: Docker, matrix: Matrix, cell: Cell, site: SiteSettings, images_dir: Path, out_dir: Path
) -> None:
    """What the cell's build stands on: its parent cell (reused, pulled or built) or its bootstrap base."""
    base = cell.base
    if isinstance(base, CellBase):
        parent = matrix.cell(base.cell)
        build_cell(docker, matrix, parent, site, images_dir, out_dir=out_dir.parent / parent.id)
    elif isinstance(base, BootstrapBase):
        ensure_base(docker, base, site, images_dir, log_dir=out_dir)
    elif isinstance(base, ArchiveBase):
        from pipeline.build.archive import ensure_archive_base

        ensure_archive_base(docker, base, directory=site.base_archives, matrix_file=matrix.file)


def _reuse(
    docker: Docker, plan: BuildPlan, site: SiteSettings, credentials: Credentials | None, *, pull_only: bool = False
) -> BuildResult | None:
    """The cell's image without a build: its content tag on this daemon, else pulled from the site's
    registry by digest; None when neither has it. `pull_only` (a fleet's verify runner) with a registry:
    the image is also bound to the registry's digest for its content tag (`registry_ref`), which a
    receipt's signature names, even when the tag was already here (pipeline.registry.fleet.bind_local)."""
    cell = plan.cell
    existing = docker.image(plan.tag)
    source, reference = "local", None
    ca_bundle = str(site.ca_bundle) if site.ca_bundle else None
    wanted = None
    if site.registry:  # where the fleet's registry would hold the image under its content tag
        wanted = Wanted(
            registry=site.registry, cell_id=cell.id, content_tag=plan.tag, platform=cell.platform,
            credentials=credentials, ca_bundle=ca_bundle,
        )  # fmt: skip
    if existing is not None:
        print(f"{cell.id}: {plan.tag} exists, build skipped", file=sys.stderr)
        if pull_only and wanted:
            bound = bind_local(docker, wanted, local=existing)
            existing, reference = bound.image, bound.reference
            source = "registry" if bound.pulled else "local"
    elif wanted:
        fetched = fetch_built(docker, wanted)
        if fetched is None:
            return None
        existing, source, reference = fetched.image, "registry", fetched.reference
    else:
        return None
    return BuildResult(
        cell=cell.id,
        tag=plan.tag,
        image_id=existing.id,
        skipped=True,
        seconds=0.0,
        base_ref=plan.base_ref,
        base_resolved=None,
        matrix_digest=existing.labels.get(MATRIX_DIGEST_LABEL, ""),
        log=None,
        source=source,
        registry_ref=reference,
    )


def _build(
    docker: Docker,
    matrix: Matrix,
    plan: BuildPlan,
    site: SiteSettings,
    *,
    out_dir: Path,
    no_cache: bool,
) -> BuildResult:
    cell = plan.cell
    log_path = _build_log(out_dir)
    started = time.monotonic()
    resolved: list[str] = []
    # The context lives at a stable path, updated in place: BuildKit then transfers only what
    # changed (a 190 MB local torch wheel is sent once, not on every rebuild).
    with (
        locked(cache_dir() / "context" / cell.id) as context,
        tempfile.TemporaryDirectory(prefix=f"stackproof-{cell.id}-") as tmp,
        log_path.open("w") as log,
    ):
        secrets_dir = Path(tmp) / "secrets"
        write_context(plan, context)
        secrets = _write_secrets(matrix, plan, site, secrets_dir)
        console().say(
            f"{cell.id}: building {plan.tag} ({len(plan.files)} context files, "
            f"{len(plan.local_wheels)} local wheels), log: {log_path}"
        )

        hidden = site.secrets()
        steps = BuildSteps()

        def on_line(line: str, log: TextIO = log) -> None:
            line = redact(line, hidden)
            log.write(line + "\n")
            if steps.feed(line):
                phase.update(steps.counts())
            phase.tool(line)
            match = _RESOLVED_BASE.search(line)
            if match:
                resolved.append(match.group(1))

        with console().phase("build", cell.id, log=log_path) as phase:
            docker.build(
                context,
                tag=plan.tag,
                platform=cell.platform,
                secrets=secrets,
                labels={MATRIX_DIGEST_LABEL: matrix.digest, **job_labels()},
                on_line=on_line,
                no_cache=no_cache,
                cache_ref=_cache_ref(docker, site, cell.id),
            )
            phase.done(steps.counts())
    image = docker.image(plan.tag)
    if image is None:
        raise InfraError(f"{cell.id}: the build reported success but {plan.tag} is not in the image store")
    seconds = time.monotonic() - started
    with log_path.open("a") as log:
        log.write(f"{BUILT_MARK}{plan.tag} {image.id} in {seconds:.1f}s\n")
    link_build_log(out_dir, plan.tag, log_path)
    console().say(f"{cell.id}: built {plan.tag} ({image.id[:19]}) in {seconds:.0f}s")
    base_resolved = resolved[0] if resolved and isinstance(cell.base, RegistryBase) else None
    if base_resolved and isinstance(cell.base, RegistryBase) and not cell.base.digest:
        print(
            f"note: {cell.id}: base {cell.base.image} resolved to {base_resolved}; pin that digest in matrix.yaml",
            file=sys.stderr,
        )
    return BuildResult(
        cell=cell.id,
        tag=plan.tag,
        image_id=image.id,
        skipped=False,
        seconds=round(seconds, 1),
        base_ref=plan.base_ref,
        base_resolved=base_resolved,
        matrix_digest=matrix.digest,
        log=str(log_path),
        made_in_s=round(seconds, 1),
    )


@dataclass
class BuildSteps:
    """BuildKit's plain progress read for the build's phase line: `#7 [3/7] RUN ...` is step 3 of 7
    (the `[internal]` steps are not counted), `#7 CACHED` a step taken from the cache."""

    step: int = 0
    total: int = 0
    cached: int = 0
    _current: dict[str, int] = dataclasses.field(default_factory=dict)  # BuildKit's #N -> step

    def feed(self, line: str) -> bool:
        """Read one line; True when the counts changed."""
        if match := _STEP.match(line):
            number, step, total = match.group(1), int(match.group(2)), int(match.group(3))
            self._current[number] = step
            if (step, total) != (self.step, self.total) and step >= self.step:
                self.step, self.total = step, total
                return True
        elif (match := _CACHED.match(line)) and match.group(1) in self._current:
            self.cached += 1
            return True
        return False

    def counts(self) -> str:
        if not self.total:
            return "preparing"
        cached = f", {self.cached} cached" if self.cached else ""
        return f"step {self.step}/{self.total}{cached}"


def _cache_ref(docker: Docker, site: SiteSettings, cell_id: str) -> str | None:
    """The registry reference of the cell's buildx layer cache, when the site has a registry and the
    CLI can export cache to it (said on stderr either way). BuildKit reaches the registry with
    docker's own login (`docker login`)."""
    if not site.registry or not site.build_cache:
        return None
    supported, why = docker.registry_cache_supported()
    if not supported:
        print(f"{cell_id}: no registry layer cache: {why}", file=sys.stderr)
        return None
    ref = cache_ref(site.registry, cell_id)
    print(f"{cell_id}: layer cache {ref} ({why})", file=sys.stderr)
    return ref


def _build_log(out_dir: Path) -> Path:
    """A log file of this build's own (`build-STAMP[-N].log`, created exclusively: concurrent builds
    of one cell never share one). `build.log` moves to it only when the build succeeds."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    for n in range(1, 10_000):
        path = out_dir / (f"build-{stamp}.log" if n == 1 else f"build-{stamp}-{n}.log")
        try:
            path.touch(exist_ok=False)
        except FileExistsError:
            continue
        return path
    raise InfraError(f"{out_dir}: 10,000 build logs this second")


def link_build_log(out_dir: Path, tag: str, log: Path | None = None) -> Path | None:
    """Point `build.log` at the log of the build that made `tag`: `log`, else the newest log here
    that ends with that build's mark. None found (the image was built elsewhere, or pulled):
    `build.log` is removed rather than left naming another build, a failed one least of all."""
    if log is None:
        logs = sorted(out_dir.glob("build-*.log"), key=lambda p: p.stat().st_mtime, reverse=True)
        log = next((p for p in logs if _built_tag(p) == tag), None)
    link = out_dir / "build.log"
    if log is None:
        link.unlink(missing_ok=True)
        return None
    latest = out_dir / f".build.log.{os.getpid()}"
    latest.unlink(missing_ok=True)
    latest.symlink_to(log.name)
    os.replace(latest, link)  # atomic: readers see the old or the new link
    return log


def build_seconds(out_dir: Path, tag: str) -> float | None:
    """How long the build whose log `build.log` points at took to make `tag` (its last line)."""
    link = out_dir / "build.log"
    mark = _built_mark(link) if link.exists() else None
    return mark[1] if mark and mark[0] == tag else None


def _built_tag(log: Path) -> str | None:
    """The tag a finished build's log names on its last line; None for a failed or running one."""
    mark = _built_mark(log)
    return mark[0] if mark else None


def _built_mark(log: Path) -> tuple[str, float | None] | None:
    """(tag, seconds) from a finished build's last line."""
    try:
        with log.open("rb") as f:
            f.seek(max(0, log.stat().st_size - 4096))
            last = f.read().decode(errors="replace").rstrip("\n").rsplit("\n", 1)[-1]
    except OSError:
        return None
    if not last.startswith(BUILT_MARK):
        return None
    words = last.removeprefix(BUILT_MARK).split()
    seconds = None
    if len(words) >= 4 and words[2] == "in" and words[3].endswith("s"):
        with contextlib.suppress(ValueError):
            seconds = float(words[3][:-1])
    return words[0], seconds


def write_context(plan: BuildPlan, context: Path) -> None:
    """Make `context` hold exactly the plan's files, touching only what changed.

    Unchanged files keep their mtime, so BuildKit's incremental context transfer skips them;
    wheels are hard-linked where possible; anything left from an earlier plan is removed.
    """
    context.mkdir(parents=True, exist_ok=True)
    wanted: set[Path] = set()
    for rel, data in (("Dockerfile", plan.dockerfile.encode()), *plan.files):
        path = context / rel
        wanted.add(path)
        if not (path.is_file() and path.read_bytes() == data):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    for index in plan.indexes:  # every index's wheel dir exists, so the Dockerfile is site-independent
        (context / "stackproof" / "wheels" / index).mkdir(parents=True, exist_ok=True)
    for wheel in plan.local_wheels:
        target = context / wheel.context_path
        wanted.add(target)
        if target.is_file() and target.stat().st_ino == wheel.path.stat().st_ino:
            continue
        target.unlink(missing_ok=True)
        try:
            os.link(wheel.path, target)
        except OSError:
            shutil.copy2(wheel.path, target)
    for path in sorted(context.rglob("*"), reverse=True):  # children before their directories
        if path.is_file() and path not in wanted:
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()) and path.parent != context / "stackproof" / "wheels":
            path.rmdir()


def _write_secrets(matrix: Matrix, plan: BuildPlan, site: SiteSettings, directory: Path) -> dict[str, Path]:
    directory.mkdir(mode=0o700)
    secrets: dict[str, Path] = {}
    for index in plan.indexes:
        path = directory / f"index-{index}"
        path.touch(mode=0o600)
        path.write_text(index_options(site.index_location(matrix, index)))
        secrets[f"index-{index}"] = path
    if site.ca_bundle is not None:
        secrets["cabundle"] = site.ca_bundle
    return secrets


def index_options(where: Mirror) -> str:
    """The `index-NAME` secret: a requirements file of pip options, one per line. pip reads it with
    `-r` (images/pip-install.sh), so a URL's credentials never reach pip's argv (`ps`)."""
    if where.is_local:
        return f"--no-index\n--find-links /tmp/stackproof/wheels/{where.index}\n"
    lines = [f"--index-url {where.location}"]
    if where.location.startswith("http://"):
        lines.append(f"--trusted-host {where.location.split('/')[2].rsplit('@', 1)[-1]}")
    return "".join(line + "\n" for line in lines)
