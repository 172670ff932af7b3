"""The cached index of one wheel: `index-<sha256[:16]>.json` beside it, read back once per process.

Format (INDEX_VERSION 9), compact because a warm audit is mostly this read: one table of files, one
of distinct holes (a hole such as `{name}` recurs thousands of times; it is decoded once), and the
messages, variables and classes as rows that name their file and holes by number. The per-file
grouping the builder reuses (a file shared by two wheels is parsed once) is rebuilt only on a cold
index, from the file numbers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from verify.audit.facts import ClassInfo, FileFacts, Hole, Message, PackageIndex, Segment

__all__ = ["INDEX_VERSION", "file_facts", "read_document", "to_index", "write_document"]

# 9: compact rows (file and hole tables); 8: SGLang's `class Envs: NAME = EnvStr(...)` variables;
# 7: f-string branches both texts
INDEX_VERSION = 9


def read_document(store: Path, sha256: str | None) -> dict[str, Any] | None:
    """The stored document when it is this index version and this wheel's (any wheel's for None:
    a donor), else None (rebuild)."""
    try:
        document = json.loads(store.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(document, dict) or document.get("index_version") != INDEX_VERSION:
        return None
    return document if sha256 is None or document.get("sha256") == sha256 else None


def write_document(store: Path, name: str, version: str, wheel: str, sha256: str, files: list[FileFacts]) -> None:
    holes: dict[Hole, int] = {}

    def seg(s: Segment) -> str | int:
        return s if isinstance(s, str) else holes.setdefault(s, len(holes))

    rows = [[i, m.line, m.kind, [seg(s) for s in m.segments]] for i, f in enumerate(files) for m in f.messages]
    document = {
        "index_version": INDEX_VERSION,
        "name": name,
        "version": version,
        "wheel": wheel,
        "sha256": sha256,
        "files": [[f.file, f.crc, f.size] for f in files],
        "holes": [[h.kind, h.expr, list(h.refs)] for h in holes],
        "messages": rows,
        "env": [[var, i, line] for i, f in enumerate(files) for var, (_, line) in f.env.items()],
        "classes": [
            [c.name, i, c.line, list(c.bases), [list(x) for x in c.capability]]
            for i, f in enumerate(files)
            for c in f.classes
        ],
    }
    tmp = store.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(document, separators=(",", ":")))
    tmp.replace(store)


def to_index(document: dict[str, Any], wheel: str) -> PackageIndex | None:
    """The merged index a document holds (None when it is malformed: rebuild)."""
    try:
        paths = [row[0] for row in document["files"]]
        holes = [Hole(kind, expr, tuple(refs)) for kind, expr, refs in document["holes"]]
        messages = tuple(
            Message(paths[i], line, kind, tuple(s if isinstance(s, str) else holes[s] for s in segs))
            for i, line, kind, segs in document["messages"]
        )
        env: dict[str, tuple[str, int]] = {}
        for var, i, line in document["env"]:
            env.setdefault(var, (paths[i], line))
        classes: dict[str, ClassInfo] = {}
        for name, i, line, bases, cap in document["classes"]:
            classes.setdefault(name, ClassInfo(name, paths[i], line, tuple(bases), tuple(map(tuple, cap))))
        return PackageIndex(
            name=str(document["name"]),
            version=str(document["version"]),
            wheel=wheel,
            sha256=str(document["sha256"]),
            messages=messages,
            env=env,
            classes=classes,
            files=len(paths),
        )
    except (KeyError, TypeError, ValueError, IndexError):
        return None


def file_facts(document: dict[str, Any]) -> list[FileFacts]:
    """The per-file facts of a document (a donor for a new wheel's shared files); [] when malformed."""
    index = to_index(document, "")
    if index is None:
        return []
    try:
        out = [FileFacts(path, crc, size) for path, crc, size in document["files"]]
        # to_index keeps the stored order, so each message pairs with its row's file number
        for row, message in zip(document["messages"], index.messages, strict=True):
            out[row[0]].messages.append(message)
        for var, i, line in document["env"]:
            out[i].env.setdefault(var, (out[i].file, line))
        for name, i, line, bases, cap in document["classes"]:
            out[i].classes.append(ClassInfo(name, out[i].file, line, tuple(bases), tuple(map(tuple, cap))))
    except (TypeError, ValueError, IndexError):
        return []
    return out
