"""Read a JSON file the tool did not write itself (a lock, a cache, a receipt, a reporter's doctor
output): every way it can be wrong is an `InputError` naming the file, and the line where JSON
says, never a traceback (issue 16: non-UTF-8, 100,000-deep nesting, a list where an object belongs).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import InputError
from pipeline.guard.boundedio import read_bytes

__all__ = ["MAX_JSON_BYTES", "jsonable", "parse_json", "read_json", "write_json_read_back"]

MAX_JSON_BYTES = 256 * 2**20


def read_json(path: Path, what: str, *, mapping: bool = True, hint: str = "", strict: bool = False) -> Any:
    """The document in `path`; `mapping`: it must be a JSON object. `what` names it in messages.
    `strict`: NaN and Infinity (Python's extension, not JSON) are refused."""
    tail = f": {hint}" if hint else ""
    try:
        data = read_bytes(path, what, limit=MAX_JSON_BYTES)
    except InputError as exc:
        raise InputError(f"{exc}{tail}") from None
    return parse_json(data, f"{path}", what, mapping=mapping, hint=hint, strict=strict)


def write_json_read_back(path: Path, document: Any, what: str) -> Any:
    """Write `document` to `path` (strict JSON, indented) and return it as read back from the file.

    `path` lies in a directory the user names (`--out`): whatever is there already (a FIFO, a
    symlink to /dev/zero or elsewhere) is replaced, not written through (a private file beside it,
    then `os.replace`), and the read-back goes through the bounded reader. Before (issue 27), a
    FIFO there made the write wait without end and a symlink to /dev/zero made the read-back endless.
    """
    text = json.dumps(document, indent=2, allow_nan=False) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return read_json(path, what, mapping=False)


def parse_json(
    data: bytes | str, where: str, what: str, *, mapping: bool = True, hint: str = "", strict: bool = False
) -> Any:
    tail = f": {hint}" if hint else ""
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = data[: exc.start].count(b"\n") + 1
            raise InputError(f"{where}:{line}: the {what} is not UTF-8 text (offset {exc.start}){tail}") from None
    else:
        text = data
    try:
        document = json.loads(text, parse_constant=_no_constant if strict else None)
    except json.JSONDecodeError as exc:
        raise InputError(f"{where}:{exc.lineno}: the {what} is not JSON: {exc.msg}{tail}") from None
    except _NotStrict as exc:
        raise InputError(f"{where}: the {what} is not strict JSON: {exc} is not a JSON number{tail}") from None
    except RecursionError:
        raise InputError(f"{where}: the {what} is nested too deeply to read{tail}") from None
    if mapping and not isinstance(document, dict):
        raise InputError(f"{where}: the {what} must be a JSON object, got {_kind(document)}{tail}")
    return document


class _NotStrict(ValueError):
    pass


def _no_constant(name: str) -> Any:
    """NaN and Infinity are Python's extension, not JSON: a file holding them is not one we wrote."""
    raise _NotStrict(name)


def _kind(value: Any) -> str:
    return {list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(type(value), "a number")


def jsonable(value: Any) -> Any:
    """Dataclasses, tuples and paths as JSON values; NaN and infinity as null (strict JSON)."""
    if is_dataclass(value) and not isinstance(value, type):
        return jsonable(asdict(value))
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
