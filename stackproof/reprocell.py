"""`stackproof repro --write`: append a reproduced cell (and any base or index it needs that the
matrix lacks) to matrix.yaml, keeping the file's own layout, and only when the result validates."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.errors import InputError, MatrixError
from pipeline.guard import boundedio
from pipeline.guard.atomic import replace_text
from pipeline.guard.redact import redact
from pipeline.matrix.yamlsrc import MAX_BYTES

if TYPE_CHECKING:
    from pipeline.repro import ReproCell

__all__ = ["write_cell"]


def write_cell(matrix_file: Path, cell: ReproCell, *, images_dir: Path) -> Path:
    """Append `cell` (a `ReproCell`) and any new index and base to `matrix_file` as text, keeping
    every comment; then load the file. When it does not load, put the original back and raise."""
    from pipeline.matrix.read import load_matrix

    original = boundedio.read_text(matrix_file, "matrix", limit=MAX_BYTES)
    if re.search(rf"^\s*-\s+id:\s*['\"]?{re.escape(cell.id)}['\"]?\s*$", original, re.MULTILINE):
        raise InputError(f"{matrix_file}: a cell {cell.id!r} exists already: pass another --id")
    text = original
    for key in ("indexes", "bases", "cells"):
        indent = _indent_of(text, key)
        # The file is a line that leaves the process too: the same redaction as stdout and stderr
        # (a pip-freeze line's `user:password@` or VCS token is quoted in the cell's comments).
        sections = {name: redact(text) for name, text in cell.sections(indent)}
        if key in sections:
            text = _insert(text, key, ("\n" if key == "cells" else "") + sections[key], matrix_file)
    replace_text(matrix_file, text)
    try:
        load_matrix(matrix_file, images_dir=images_dir)
    except MatrixError as exc:
        replace_text(matrix_file, original)
        raise MatrixError([*exc.problems, f"{matrix_file}: restored unchanged; cell {cell.id} was not added"]) from exc
    return matrix_file


def _indent_of(text: str, key: str) -> str:
    """The indentation of the first entry under top-level `key` (two spaces when there is none)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if re.match(rf"^{key}:\s*(#.*)?$", line)), None)
    if start is None:
        return "  "
    for line in lines[start + 1 :]:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line[0].isspace() and not line.startswith("- "):
            break
        match = re.match(r"^(\s*)", line)
        return match.group(1) if match else "  "
    return "  "


def _insert(text: str, key: str, entries: str, file: Path) -> str:
    """`entries` at the end of top-level block `key:` (a new block before `cells:` when absent)."""
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    start = next((i for i, line in enumerate(lines) if re.match(rf"^{key}:\s*(#.*)?$", line)), None)
    if start is None:
        if any(re.match(rf"^{key}:", line) for line in lines):
            raise InputError(f"{file}: `{key}:` is written in flow style ({{...}}): add the new entries by hand")
        at = next((i for i, line in enumerate(lines) if re.match(r"^cells:", line)), len(lines))
        return "".join([*lines[:at], f"{key}:\n", entries, "\n", *lines[at:]])
    end = next((i for i in range(start + 1, len(lines)) if re.match(r"^[^\s#]", lines[i])), len(lines))
    if end < len(lines):  # comments and blank lines just above the next key belong to it
        while end > start + 1 and (not lines[end - 1].strip() or lines[end - 1].startswith("#")):
            end -= 1
    return "".join([*lines[:end], entries, *lines[end:]])


# -- doctor -----------------------------------------------------------------------------------------
