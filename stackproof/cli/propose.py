"""`stackproof matrix propose` and `stackproof matrix pins refresh`: keeping up with vLLM releases.

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
    release = dataclasses.replace(release, dockerfile=facts)
    write_release(release)
    return release


def _summary(release: Release) -> dict[str, Any]:
    from pipeline.releases.pins import derive

    pins = derive(release, "linux/amd64")
    keys = ("flashinfer-python", "torch", "nvidia-cudnn-cu13", "nvidia-nccl-cu13")
    shown = ", ".join(f"{k} {pins[k]}" for k in keys if k in pins)
    docker = release.dockerfile
    extra = "; Dockerfile not read" if docker is None else f"; Dockerfile overrides {dict(docker.overrides) or 'none'}"
    return {"version": release.version, "pins": pins, "summary": shown + extra}


def _propose(args: argparse.Namespace) -> int:
    from pipeline.releases.propose import insert, parse_specs, plan_proposal
    from pipeline.releases.table import load_table

    wanted = parse_specs(args.specs)
    matrix, images = load(args)
    if args.dockerfile is not None and not args.dockerfile.is_file():
        raise InputError(f"--dockerfile {args.dockerfile}: no such file")
    if not args.dry_run and (wanted.vllm not in load_table() or args.dockerfile is not None):
        _refresh_one(matrix, wanted.vllm, args.dockerfile, [], None)
        print(f"release-pin table: vllm {wanted.vllm} written (pipeline/releases/release_pins.json)", file=sys.stderr)
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
        "audit": audit,
    }
    shown = proposal.base_yaml + proposal.cells_yaml
    verb = "would add" if args.dry_run else "added"
    emit(args, document, f"{shown}\n{matrix.file}: {verb} base {proposal.base_name} and {len(proposal.cell_ids)} cells")
    return code


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
            arg("specs", nargs="+", metavar="SPEC", help="vllm==X.Y.Z [flashinfer-python==V]"),
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
