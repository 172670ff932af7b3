"""`stackproof matrix propose` and `stackproof matrix pins refresh`: keeping up with vLLM releases.

`propose --new` asks the declared indexes which watched releases are newer than the matrix's
(stackproof/releasewatch.py), proposes and audits each new vLLM's cells as below, and writes a patch
and a pull-request body (--out); .github/workflows/releases.yml runs it on a schedule.

`pins refresh vllm==X.Y.Z` reads the release's wheel metadata (vllm's and its torch's Requires-Dist,
both platforms of the official image) from the `pypi` index (its site mirror when one is set) and,
with `--dockerfile FILE`, the release Dockerfile's overrides and CUDA version, and writes the entry
of the release-pin table (pipeline/releases/release_pins.json). `propose` refreshes the table when the
release is missing from it (or a Dockerfile is given), writes candidate cells next to the previous
release's (pipeline/releases/propose.py), validates the file and audits the new cells.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path
from typing import Any

from pipeline.errors import InputError, MatrixError
from pipeline.guard import boundedio
from pipeline.guard.atomic import replace_text
from pipeline.matrix.model import Matrix
from pipeline.matrix.yamlsrc import MAX_BYTES
from pipeline.releases.pins import ReleaseLookup
from pipeline.releases.table import Release
from stackproof.auditjob import release_lookup
from stackproof.cli.common import Command, arg, emit, load

__all__ = ["COMMANDS"]


def _refresh(args: argparse.Namespace) -> int:
    from pipeline.releases.propose import parse_specs

    matrix, _ = load(args)
    versions = [parse_specs([spec]).vllm for spec in args.specs]
    if args.image_override and not args.because:
        raise InputError("--image-override needs --because: the release Dockerfile's lines it rests on")
    if (args.dockerfile or args.image_override) and len(versions) > 1:
        raise InputError("--dockerfile and --image-override describe one release: give one vllm==X.Y.Z")
    written = [_refresh_one(matrix, v, args.dockerfile, args.image_override, args.because) for v in versions]
    rows = [_summary(r) for r in written]
    emit(args, {"refreshed": rows}, "\n".join(f"release-pin table: vllm {r['version']}: {r['summary']}" for r in rows))
    return 0


def _refresh_one(
    matrix: Matrix, version: str, dockerfile: Path | None, image_overrides: list[str], because: str | None
) -> Release:
    from packaging.utils import canonicalize_name

    from pipeline.releases.dockerfile import read_dockerfile
    from pipeline.releases.pins import fetch_release
    from pipeline.releases.table import PLATFORMS, TABLE, DockerfileFacts, load_table, write_release

    # The user's inputs first (issue 43): a Dockerfile or override that is bad input is exit 2
    # before any index is asked.
    given: DockerfileFacts | None = None
    if dockerfile is not None:
        given = read_dockerfile(dockerfile)
    elif image_overrides:
        pairs = []
        for spec in image_overrides:
            name, sep, pinned = spec.partition("==")
            if not sep or not name or not pinned:
                raise InputError(f"--image-override {spec!r}: write NAME==VERSION")
            pairs.append((str(canonicalize_name(name)), pinned))
        given = DockerfileFacts(source=str(because), overrides=tuple(sorted(pairs)))
    lookup = release_lookup(matrix)
    known = load_table().get(version) if TABLE.exists() else None
    print(f"reading vllm {version} and its torch's wheel metadata ({', '.join(PLATFORMS)})", file=sys.stderr)
    release = fetch_release(version, PLATFORMS, lookup.fetch)
    facts = given if given is not None else (known.dockerfile if known else None)
    release = dataclasses.replace(release, dockerfile=facts, indexes=_carriers(matrix, release))
    write_release(release)
    return release


def _carriers(matrix: Matrix, release: Release) -> tuple[tuple[str, str, str], ...]:
    """Which declared index carries the FlashInfer the release pins, when `pypi` does not: asked
    in the matrix's order; an index that cannot be read is said so, never taken as carrying it."""
    from pipeline.errors import InfraError
    from pipeline.matrix.site import load_site
    from pipeline.releases.pins import FI_PYTHON, derive
    from pipeline.releases.simpleindex import list_versions

    version = derive(release, "linux/amd64").get(FI_PYTHON)
    if version is None:
        return ()
    site = load_site(matrix)
    candidates = [i.name for i in matrix.indexes if i.name == "pypi" or i.name == "flashinfer"]
    unreachable: list[str] = []
    for index in candidates:
        try:
            listed = list_versions(site.index_location(matrix, index), FI_PYTHON, python="3.12", machine="x86_64")
        except InfraError as exc:
            unreachable.append(index)
            print(f"{FI_PYTHON} {version}: index {index} not read ({str(exc).splitlines()[0]})", file=sys.stderr)
            continue
        if any(str(v) == version for v in listed):
            print(f"{FI_PYTHON} {version}: from index {index}", file=sys.stderr)
            return () if index == "pypi" else ((FI_PYTHON, index, f"listed by {index}"),)
    fallback = next((i for i in unreachable if i != "pypi"), None)
    if fallback is None:
        return ()
    how = f"not listed by pypi; {fallback} could not be read to confirm it"
    print(f"{FI_PYTHON} {version}: from index {fallback} ({how})", file=sys.stderr)
    return ((FI_PYTHON, fallback, how),)


def _summary(release: Release) -> dict[str, Any]:
    from pipeline.releases.pins import derive

    pins = derive(release, "linux/amd64")
    keys = ("flashinfer-python", "torch", "nvidia-cudnn-cu13", "nvidia-nccl-cu13")
    shown = ", ".join(f"{k} {pins[k]}" for k in keys if k in pins)
    docker = release.dockerfile
    extra = "; Dockerfile not read" if docker is None else f"; Dockerfile overrides {dict(docker.overrides) or 'none'}"
    came = "".join(f"; {name} from index {index} ({how})" for name, index, how in release.indexes)
    return {"version": release.version, "pins": pins, "summary": shown + extra + came}


def _propose(args: argparse.Namespace) -> int:
    from pipeline.releases.propose import parse_specs

    if args.new:
        if args.specs:
            raise InputError("--new finds the releases itself: give no vllm==X.Y.Z with it")
        return _propose_new(args)
    if not args.specs:
        raise InputError("give vllm==X.Y.Z [flashinfer-python==V], or --new")
    matrix, images = load(args)
    if args.dockerfile is not None and not args.dockerfile.is_file():
        raise InputError(f"--dockerfile {args.dockerfile}: no such file")
    code, document, shown = _propose_one(matrix, images, parse_specs(args.specs), args)
    emit(args, document, shown)
    return code


def _propose_one(
    matrix: Matrix, images: Path, wanted: Any, args: argparse.Namespace
) -> tuple[int, dict[str, Any], str]:
    """One release's cells: refresh its pins when missing, insert, validate, write, audit."""
    from pipeline.releases.propose import insert, plan_proposal
    from pipeline.releases.table import TABLE, load_table

    dockerfile = getattr(args, "dockerfile", None)
    if not args.dry_run and (wanted.vllm not in load_table() or dockerfile is not None):
        _refresh_one(matrix, wanted.vllm, dockerfile, [], None)
        print(f"release-pin table: vllm {wanted.vllm} written ({TABLE})", file=sys.stderr)
    lookup = release_lookup(matrix)
    pins, source = lookup(wanted.vllm, "linux/amd64")
    if pins is None:
        raise InputError(f"vllm=={wanted.vllm}: {source}")
    release = load_table().get(wanted.vllm)
    docker = release.dockerfile if release else None
    cuda = None
    if docker is not None and docker.require_cuda:
        cuda = (docker.require_cuda, f"From ARG CUDA_VERSION of {docker.source}.")
    proposal = plan_proposal(matrix, wanted, pins, require_cuda=cuda)
    text = insert(boundedio.read_text(matrix.file, "matrix", limit=MAX_BYTES), proposal)
    new = _validated(matrix.file, text, images)
    if not args.dry_run:
        replace_text(matrix.file, text)
    code, audit = 0, None
    if not args.no_audit:
        code, audit = _audit(new, proposal.cell_ids, lookup)
    document = {
        "version": wanted.vllm,
        "previous": proposal.previous,
        "base": proposal.base_name,
        "cells": list(proposal.cell_ids),
        "written": not args.dry_run,
        "pins_source": source,
        "indexes": dict(pins.indexes),
        "audit": audit,
    }
    shown = proposal.base_yaml + proposal.cells_yaml
    verb = "would add" if args.dry_run else "added"
    return (
        code,
        document,
        f"{shown}\n{matrix.file}: {verb} base {proposal.base_name} and {len(proposal.cell_ids)} cells",
    )


def _propose_new(args: argparse.Namespace) -> int:
    """Every watched release newer than the matrix's: proposed and audited cells (vLLM), a patch and
    a pull-request body under --out (stackproof/releasewatch.py)."""
    import difflib
    import time

    from packaging.version import Version

    from pipeline.matrix.site import load_site
    from pipeline.releases.propose import Wanted
    from pipeline.releases.simpleindex import list_versions
    from pipeline.releases.table import TABLE
    from stackproof.releasewatch import pr_body, scan

    started = time.monotonic()
    matrix, images = load(args)
    site = load_site(matrix)

    def lister(index: str, package: str) -> tuple[Version, ...]:
        return list_versions(site.index_location(matrix, index), package, python="3.12", machine="x86_64")

    found = scan(matrix, lister)
    before = {
        matrix.file: boundedio.read_text(matrix.file, "matrix", limit=MAX_BYTES),
        TABLE: boundedio.read_text(TABLE, "release-pin table") if TABLE.exists() else "",
    }
    proposals, code = [], 0
    for release in [r for r in found.new if r.package == "vllm"]:
        matrix, images = load(args)  # the file as the previous proposal left it
        one, document, _ = _propose_one(matrix, images, Wanted(vllm=release.version), args)
        code = max(code, one)
        proposals.append(_with_audit_summary(document))
    seconds = time.monotonic() - started
    body = pr_body(found, proposals, seconds=seconds)
    patch = "".join(
        "".join(
            difflib.unified_diff(
                old.splitlines(True),
                boundedio.read_text(path, "proposed file", limit=MAX_BYTES).splitlines(True),
                f"a/{_rel(path)}",
                f"b/{_rel(path)}",
            )
        )
        for path, old in before.items()
        if path.exists()
    )
    out = args.out
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "pr-body.md").write_text(body)
        (out / "proposal.patch").write_text(patch)
    document = {
        "new": [dataclasses.asdict(r) for r in found.new],
        "newest_in_matrix": found.newest,
        "unreadable": list(found.unreadable),
        "proposals": proposals,
        "seconds": round(seconds, 1),
        "out": str(out) if out else None,
    }
    emit(args, document, body)
    return code


def _with_audit_summary(document: dict[str, Any]) -> dict[str, Any]:
    audit = document.get("audit")
    if isinstance(audit, dict):
        errors = [
            f"{cell.get('cell')}: {f.get('subject')}: {f.get('message', '')[:200]}"
            for cell in audit.get("cells", [])
            for f in cell.get("findings", [])
            if f.get("status") == "ERROR"
        ]
        document = {**document, "audit": {"errors": len(errors), "error_findings": errors[:20]}}
    return document


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return path.name


def _validated(file: Path, text: str, images: Path) -> Matrix:
    """The matrix `text` would be, loaded from a copy beside `file` (locks resolve as in it)."""
    from pipeline.matrix.read import load_matrix

    with tempfile.NamedTemporaryFile("w", dir=file.parent, prefix=".propose-", suffix=".yaml", delete=False) as out:
        out.write(text)
    copy = Path(out.name)
    try:
        matrix = load_matrix(copy, images_dir=images)
    except MatrixError as exc:
        problems = [p.replace(str(copy), f"{file} (as proposed)") for p in exc.problems]
        raise MatrixError([*problems, f"{file}: unchanged; the proposal does not validate"]) from None
    finally:
        copy.unlink(missing_ok=True)
    return dataclasses.replace(matrix, file=file)


def _audit(matrix: Matrix, cell_ids: tuple[str, ...], lookup: ReleaseLookup) -> tuple[int, Any]:
    from stackproof.auditjob import audit_cells

    report = audit_cells(matrix, [matrix.cell(c) for c in cell_ids], lookup)
    from verify.audit.report import render_json, render_text

    print(render_text(report), file=sys.stderr)
    return (1 if report.errors else 0), render_json(report)


DOCKERFILE_HELP = "the release's docker/Dockerfile (ARGs, overrides)"

COMMANDS = (
    Command(
        path=("matrix", "propose"),
        help="candidate cells for a new vLLM release, validated and audited",
        handler=_propose,
        args=(
            arg("specs", nargs="*", metavar="SPEC", help="vllm==X.Y.Z [flashinfer-python==V]"),
            arg("--new", action="store_true", help="propose every watched release newer than the matrix's"),
            arg("--out", type=Path, default=None, help="with --new: write proposal.patch and pr-body.md here"),
            arg("--dockerfile", type=Path, default=None, help=DOCKERFILE_HELP),
            arg("--dry-run", action="store_true", help="print the cells; change neither the matrix nor the table"),
            arg("--no-audit", action="store_true", help="validate only; do not audit the new cells"),
        ),
    ),
    Command(
        path=("matrix", "pins", "refresh"),
        help="read a release's pins from its wheels' metadata",
        handler=_refresh,
        args=(
            arg("specs", nargs="+", metavar="SPEC", help="vllm==X.Y.Z ..."),
            arg("--dockerfile", type=Path, default=None, help=DOCKERFILE_HELP),
            arg(
                "--image-override",
                action="append",
                default=[],
                metavar="NAME==VERSION",
                help="what the release Dockerfile installs, when the file itself is not at hand (needs --because)",
            ),
            arg("--because", default=None, help="with --image-override: the Dockerfile lines it rests on"),
        ),
    ),
)
