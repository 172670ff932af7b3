"""`stackproof doctor`'s jobs: fingerprint a cell's built image (after the host checks judged for
it), and find the cells and the verified receipts that match a fingerprint."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.errors import InfraError, InputError
from pipeline.matrix.model import Cell, Matrix

if TYPE_CHECKING:
    from stackproof.doctor import Fingerprint

__all__ = ["find_matches", "fingerprint_cell"]


def fingerprint_cell(
    matrix: Matrix, cell: Cell, images: Path, *, python: str, imports: bool, gpus: str | None, preflight: bool
) -> tuple[dict[str, Any], list[Any], Any, list[str]]:
    """`doctor --cell`: the fingerprint of the cell's built image (this host's, with no docker), the
    host checks judged for it (GPU cells, with `preflight`), the facts they were judged on, and
    notes for the report. Exit 3 (PreflightFailed) when the image is not built and a check failed."""
    from pipeline.build.plan import plan_cell
    from pipeline.host.preflight import PreflightFailed, connect, gather_facts, judge_preflight
    from pipeline.matrix.site import load_site
    from stackproof.doctor import doctor_host, doctor_image  # looked up at call time: tests replace them

    items: list[Any] = []
    facts = None
    notes: list[str] = []
    tag = plan_cell(matrix, cell, load_site(matrix), images).tag
    # Host checks first: a host without docker still hears whether it can run this cell at all.
    docker, docker_error = connect()
    built = docker is not None and docker.image(tag) is not None
    if cell.is_gpu and preflight:
        # The rules are judged below on the fingerprinted document: the image's view, inside it.
        facts = gather_facts(
            matrix, cell, docker=docker, docker_error=docker_error, image_bytes=0 if built else None, rules=False
        )
        items = judge_preflight(cell, facts, docker_required=False)
    failed = [i for i in items if i.status == "FAIL"]
    if docker is None and not cell.is_gpu:
        raise InfraError(docker_error or "docker not available")
    if docker is None:
        # No image to fingerprint: this host's facts, which the preflight verdicts are about.
        document = doctor_host(python, imports=imports)
        notes.append(f"docker not available ({docker_error}): fingerprinted this host, not {tag}")
    elif not built:
        if failed:
            from pipeline.host.preflight import preflight_lines

            print("\n".join(preflight_lines(items)), file=sys.stderr)
            raise PreflightFailed(cell.id, items)
        raise InputError(f"{cell.id}: image {tag} is not built: run `stackproof build {cell.id}`")
    else:
        env = {**dict(cell.env), **cell.serve_env()}
        document = doctor_image(
            docker,
            tag,
            python=matrix.python_of(cell),
            env=env,
            gpus=gpus or (cell.serve.gpus if cell.serve else None),
            imports=imports,
        )
        document["stackproof"] = {"cell": cell.id, "image": tag}
    return document, items, facts, notes


def find_matches(
    matrix: Matrix | None, fp: Fingerprint, lookup: Any, *, receipts: Path | None, registry: str | None
) -> tuple[list[Any], list[Any]]:
    """The cells of `matrix` whose stack matches the fingerprint, and the verified receipts of those
    cells (from the `receipts` directory and the `registry`)."""
    from pipeline.matrix.site import load_site
    from stackproof.doctor import match_cells, match_receipts, match_registry, registry_fetcher

    matches = match_cells(matrix, fp, lookup) if matrix is not None else []
    matching = [m.cell for m in matches if m.match]
    found = match_receipts(receipts, fp, set(matching)) if receipts else []
    if registry and matching:
        assert matrix is not None
        site = load_site(matrix)
        fetch, client = registry_fetcher(registry, ca_bundle=str(site.ca_bundle) if site.ca_bundle else None)
        with client:
            found += match_registry(fetch, fp, matching)
    return matches, found
