"""`stackproof ci-matrix --changed-since REF`: the cells whose definition or build inputs changed
since a commit, read from git (the matrix as it was at REF, the files changed since)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from pipeline import cmd
from pipeline.errors import InputError, MatrixError
from pipeline.matrix.cimatrix import Change, changed_cells
from pipeline.matrix.model import Matrix

__all__ = ["changes_since"]


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
