"""jinja2 rendering of the templates in images/, with StrictUndefined so a typo fails loudly."""

from __future__ import annotations

import json
import shlex
from functools import cache
from pathlib import Path
from typing import Any

import jinja2

__all__ = ["render_template", "template_text"]


def _dquote(value: str) -> str:
    """A Dockerfile double-quoted value: JSON string escaping, and `$` kept literal. Non-ASCII
    stays as written (Docker does not read `\\u00e9`: `café` would land as `caf\\u00e9`)."""
    return json.dumps(str(value), ensure_ascii=False).replace("$", "\\$")


@cache
def _environment(images_dir: Path) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(images_dir)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,  # Dockerfiles and shell, not HTML
    )
    env.filters["dquote"] = _dquote
    env.filters["shquote"] = lambda value: shlex.quote(str(value))
    return env


def render_template(images_dir: Path, name: str, **context: Any) -> str:
    return _environment(images_dir.resolve()).get_template(name).render(**context)


def template_text(images_dir: Path, name: str) -> str:
    return (images_dir / name).read_text()
