"""Write a rendered site into its directory: page by page atomically, and without the pages of an
earlier report that this one no longer has."""

from __future__ import annotations

import json
import os
from pathlib import Path, PurePosixPath

from pipeline.errors import InputError
from pipeline.guard.boundedio import read_bytes

__all__ = ["SITE_MANIFEST", "write_site"]


SITE_MANIFEST = ".stackproof-site.json"  # the files the last report wrote into --out
MANIFEST_LIMIT = 16 * 2**20


def write_site(files: dict[str, bytes], out: Path) -> None:
    """Each page written atomically (a temporary file renamed over it: a reader never sees half a
    page), then the pages a previous report wrote into `out` that this one does not have are
    removed, so two reports into one --out never mix (a cell gone from the matrix leaves no page)."""
    out.mkdir(parents=True, exist_ok=True)
    previous = _previous_pages(out)
    for relative, data in files.items():
        _write_atomic(out / relative, data)
    for stale in sorted(previous - files.keys()):
        path = _own_page(out, stale)
        if path is not None:
            path.unlink()
    _write_atomic(out / SITE_MANIFEST, (json.dumps(sorted(files), indent=0) + "\n").encode())


def _previous_pages(out: Path) -> set[str]:
    """What the manifest in `out` lists; nothing when it is missing, not a regular file (a FIFO
    would wait for ever), too large, or not a list: then no earlier page is removed."""
    try:
        listed = json.loads(read_bytes(out / SITE_MANIFEST, "site manifest", limit=MANIFEST_LIMIT))
    except (InputError, ValueError, RecursionError):
        return set()
    return {p for p in listed if isinstance(p, str)} if isinstance(listed, list) else set()


def _own_page(out: Path, relative: str) -> Path | None:
    """The regular file `relative` names under `out`, or None where it could lie outside: an
    absolute path (`out / "/x"` is `/x`), a `..`, or a symlink anywhere on the way. The manifest
    comes from a directory this report did not necessarily write (a CI artifact, another user's)."""
    pure = PurePosixPath(relative)
    if pure.is_absolute() or not pure.parts or ".." in pure.parts:
        return None
    current = out
    for part in pure.parts:
        current = current / part
        if current.is_symlink():
            return None
    return current if current.is_file() else None


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        temporary.write_bytes(data)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
