"""Write a rendered site into its directory: page by page atomically, and without the pages of an
earlier report that this one no longer has."""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["SITE_MANIFEST", "write_site"]


SITE_MANIFEST = ".stackproof-site.json"  # the files the last report wrote into --out


def write_site(files: dict[str, bytes], out: Path) -> None:
    """Each page written atomically (a temporary file renamed over it: a reader never sees half a
    page), then the pages a previous report wrote into `out` that this one does not have are
    removed, so two reports into one --out never mix (a cell gone from the matrix leaves no page)."""
    out.mkdir(parents=True, exist_ok=True)
    previous = _previous_pages(out)
    for relative, data in files.items():
        _write_atomic(out / relative, data)
    for stale in sorted(previous - files.keys()):
        path = out / stale
        if ".." not in Path(stale).parts and path.is_file() and not path.is_symlink():
            path.unlink()
    _write_atomic(out / SITE_MANIFEST, (json.dumps(sorted(files), indent=0) + "\n").encode())


def _previous_pages(out: Path) -> set[str]:
    try:
        listed = json.loads((out / SITE_MANIFEST).read_text())
    except (OSError, ValueError):
        return set()
    return {str(p) for p in listed} if isinstance(listed, list) else set()


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        temporary.write_bytes(data)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
