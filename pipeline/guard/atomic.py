"""In-place edits that cannot lose the file (issue 43): the new text goes to a private temporary file
beside the target (same directory, so the same filesystem), is flushed to disk, takes the target's
mode, and replaces it with `os.replace`. A write stopped half-way (a full disk, a file-size limit,
Ctrl-C) leaves the target as it was and no temporary behind; a reader sees the old file or the new
one whole, never half of either.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

__all__ = ["replace_text"]


def replace_text(path: Path, text: str) -> None:
    """Replace `path`'s content with `text` (UTF-8) atomically; the target keeps its mode."""
    target = Path(path)
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        mode = 0o644
    fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
