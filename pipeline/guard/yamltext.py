"""YAML text the tool writes into a user's file (issue 43): values by the emitter, never by pasting.

`matrix propose` and `matrix audit --fix` edit matrix.yaml as text to keep its comments and layout.
What they put there comes partly from outside (a file name, a Dockerfile's ARG, a package's log
message), so a value is written by PyYAML's emitter on one line (`scalar`), and a comment, which no
emitter writes, has every line break and control character replaced (`comment`): a name holding a
newline can no longer start a `digest:` line of its own.
"""

from __future__ import annotations

import re

import yaml

__all__ = ["comment", "scalar"]

# Every character YAML or a terminal takes as a line break, and the other controls.
_BREAKS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def scalar(value: str) -> str:
    """`value` as a one-line YAML scalar, written by the emitter: single-quoted when that stays on
    one line, else double-quoted with escapes (a newline is `\\n`, never a fold)."""
    for style in ("'", '"'):
        out = yaml.safe_dump(value, default_style=style, width=float("inf"), allow_unicode=False)
        out = out.removesuffix("\n").removesuffix("\n...").rstrip("\n")
        if "\n" not in out:
            return out
    raise ValueError(f"{value!r} cannot be written on one line")  # pragma: no cover - double quotes always can


def comment(text: str) -> str:
    """`text` fit to follow a `# ` on one line: line breaks and controls become spaces."""
    return _BREAKS.sub(" ", text)
