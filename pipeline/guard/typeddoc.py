"""A document the tool wrote once and reads back from a user's directory (issue 43: the A/B, sweep
and bisect reports `report` reads), read as strictly as it was written: strict JSON (no NaN or
Infinity, no number past a float's range, no integer of more than MAX_INT_DIGITS digits: a 5,000
digit one made `int()` raise), then, once the producer's typed reader took it, checked against its
published schema (docs/*.schema.json), so a string where a count belongs is refused too. Every way
it is wrong is an `InputError` naming the file, and the line (JSON) or the field (schema).
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Any

from pipeline.errors import InputError
from pipeline.guard.boundedio import read_bytes

__all__ = ["MAX_INT_DIGITS", "check_schema", "read_strict_json"]

MAX_INT_DIGITS = 30  # a count, a seed, a byte total: far past any; the interpreter refuses past 4,300
SCHEMAS = Path(__file__).resolve().parents[2] / "docs"


class _Refused(ValueError):
    pass


def _constant(name: str) -> Any:
    raise _Refused(f"{name} is not a JSON number")


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _Refused(f"an integer of {len(text.lstrip('-')):,} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"{text[:40]} is past a number's range")
    return value


def read_strict_json(path: Path, what: str, *, limit: int) -> Any:
    """The document in `path`, strictly parsed; InputError naming the file (and line) otherwise."""
    data = read_bytes(path, what, limit=limit)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not text (byte {exc.start})") from None
    try:
        return json.loads(text, parse_constant=_constant, parse_int=_int, parse_float=_float)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{exc.lineno}:{exc.colno}: not JSON: {exc.msg}") from None
    except _Refused as exc:
        raise InputError(f"{path}: not strict JSON: {exc}") from None
    except RecursionError:
        raise InputError(f"{path}: nested too deeply to read") from None


@functools.cache
def _validator(schema_name: str) -> Any:
    import jsonschema  # type: ignore[import-untyped]

    schema = json.loads((SCHEMAS / schema_name).read_text())
    return jsonschema.Draft202012Validator(schema)


def check_schema(document: Any, path: Path | str, what: str, schema_name: str) -> None:
    """`document` against docs/`schema_name`: InputError naming the first field that departs."""
    errors = sorted(_validator(schema_name).iter_errors(document), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        error = errors[0]
        field = ".".join(str(p) for p in error.absolute_path) or "(the document)"
        message = error.message if len(error.message) <= 300 else error.message[:300] + "..."
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise InputError(f"{path}: {field}: {message}: not a {what} as docs/{schema_name} describes{more}")
