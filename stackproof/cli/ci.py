"""`stackproof ci-matrix`: the GitHub Actions matrix of the cells, all of them or those changed since a commit.

The matrix logic is pure (`pipeline.matrix.cimatrix`); this module is its edge: it reads the matrix as
it was at the older commit and the files changed since, through git (`pipeline.cmd.run`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from pipeline import cmd
from pipeline.errors import InputError, MatrixError
from pipeline.matrix.cimatrix import Change, changed_cells, github_matrix, include_entries
from pipeline.matrix.model import Matrix
from stackproof.cli.common import Command, arg

__all__ = ["COMMANDS", "changes_since"]


def _ci_matrix(args: argparse.Namespace) -> int:
    from pipeline.matrix.read import load_matrix

    images = args.images or args.matrix.parent / "images"
    matrix = load_matrix(args.matrix, images_dir=images)
    ids = [matrix.cell(c).id for c in args.cells] if args.cells else [c.id for c in matrix.cells]
    reasons: dict[str, tuple[str, ...]] = {}
    if args.changed_since is not None:
        reasons = {c.cell: c.reasons for c in changes_since(matrix, images, args.changed_since)}
        ids = [i for i in ids if i in reasons]
    from pipeline.matrix.runners import load_runner_labels

    # Only the label mapping of the site settings: the plan job has no mirrors or CA bundle to check.
    labels_file = os.environ.get("STACKPROOF_RUNNER_LABELS")
    entries = include_entries(matrix, ids, load_runner_labels(Path(labels_file), matrix) if labels_file else None)

    if args.json:
        for entry in entries:
            if entry.cell in reasons:
                print(f"ci-matrix: {entry.cell}: {'; '.join(reasons[entry.cell])}", file=sys.stderr)
        print(json.dumps(github_matrix(entries), indent=2))
        return 0
    rows = [
        (e.cell, e.arch, e.platform, ",".join(e.runs_on), e.expect or "-", "; ".join(reasons.get(e.cell, ())))
        for e in entries
    ]
    header = ("cell", "arch", "platform", "runs-on", "expect", "why" if args.changed_since is not None else "")
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    for row in (header, *rows) if rows else ():
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    since = f", changed since {args.changed_since}" if args.changed_since is not None else ""
    print(f"{len(entries)} of {len(matrix.cells)} cells selected{since}")
    return 0


def changes_since(matrix: Matrix, images_dir: Path, ref: str) -> tuple[Change, ...]:
    """The cells of `matrix` changed since commit `ref` of the git repository the matrix file is in.

    The working tree counts as it is (uncommitted and untracked files too). The matrix at `ref` is
    loaded from a temporary tree where every file of `ref` under the matrix's folder exists (empty:
    loading only checks that recipes and question files are there), so it resolves exactly as it
    did then; the contents of locks, templates and recipes are compared through `git diff`.
    """
    matrix_file = matrix.file.resolve()
    top = _git(["rev-parse", "--show-toplevel"], matrix_file.parent)
    if top.returncode != 0:
        raise InputError(f"--changed-since {ref}: {matrix_file.parent} is not in a git repository")
    root = Path(top.stdout.strip()).resolve()
    if ref.startswith("-"):
        raise InputError(f"--changed-since {ref}: not a commit")
    found = _git(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], root)
    if found.returncode != 0:
        raise InputError(
            f"--changed-since {ref}: no such commit in {root} (a shallow clone needs the history: fetch-depth: 0)"
        )
    commit = found.stdout.strip()
    old = _matrix_at(commit, root, matrix_file, images_dir.resolve())
    diff = _git(["diff", "--name-only", "--no-renames", "-z", commit, "--"], root, check=True)
    untracked = _git(["ls-files", "--others", "--exclude-standard", "-z"], root, check=True)
    changed = [root / name for name in (diff.stdout + untracked.stdout).split("\0") if name]
    return changed_cells(old, matrix, changed, images_dir)


def _matrix_at(commit: str, root: Path, matrix_file: Path, images_dir: Path) -> Matrix | None:
    """The matrix as it was at `commit`; None when it did not exist there or does not load."""
    from pipeline.matrix.read import load_matrix

    rel = matrix_file.relative_to(root)
    if _git(["cat-file", "-e", f"{commit}:{rel.as_posix()}"], root).returncode != 0:
        print(f"ci-matrix: no {rel} at {commit[:12]}: every cell counts as changed", file=sys.stderr)
        return None
    text = _git(["show", f"{commit}:{rel.as_posix()}"], root, check=True).stdout
    folder = rel.parent.as_posix()
    listing = _git(["ls-tree", "-r", "-z", "--name-only", "--full-name", commit, "--", folder], root, check=True)
    with tempfile.TemporaryDirectory(prefix="stackproof-ci-matrix-") as tmp:
        tree = Path(tmp).resolve()
        for name in listing.stdout.split("\0"):
            if name:
                (tree / name).parent.mkdir(parents=True, exist_ok=True)
                (tree / name).touch()
        (tree / rel).write_text(text, encoding="utf-8")
        try:
            old_images = tree / images_dir.relative_to(root)
        except ValueError:  # templates outside the repository: the same at both ends
            old_images = images_dir
        try:
            return load_matrix(tree / rel, images_dir=old_images)
        except MatrixError as exc:
            print(
                f"ci-matrix: {rel} at {commit[:12]} does not load ({len(exc.problems)} problem(s)): "
                "every cell counts as changed",
                file=sys.stderr,
            )
            return None


def _git(argv: list[str], cwd: Path, *, check: bool = False) -> cmd.CommandResult:
    return cmd.run(["git", *argv], cwd=cwd, check=check, quiet=True, timeout=120)


COMMANDS = (
    Command(
        path=("ci-matrix",),
        help="the GitHub Actions matrix ({include: [...]}) of the cells to verify",
        handler=_ci_matrix,
        args=(
            arg("cells", nargs="*", help="only these cells (default: every cell)"),
            arg(
                "--changed-since",
                metavar="REF",
                default=None,
                help="only cells whose resolved definition or build inputs changed since the commit REF",
            ),
        ),
    ),
)
