"""jinja2 rendering of the templates in images/, with StrictUndefined so a typo fails loudly."""

from __future__ import annotations

import json
import os
import shlex
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
from jinja2.loaders import split_template_path

from pipeline.guard import boundedio

__all__ = ["IMAGES_FILE_LIMIT", "image_file", "render_template", "template_text"]

IMAGES_FILE_LIMIT = 16 * 2**20  # a template or a recipe's file in --images: all of images/ is 80 KB


def image_file(path: Path) -> bytes:
    """A file of the images directory (`--images`, a directory the user names), through the bounded
    reader: a FIFO, a device or a file past the cap there is exit 2 naming it (issue 27)."""
    return boundedio.read_bytes(path, "images file", limit=IMAGES_FILE_LIMIT)


class _BoundedLoader(jinja2.FileSystemLoader):
    """jinja2's file loader, reading each template through `image_file` (its own `open` waited on a
    FIFO and read /dev/zero whole)."""

    def get_source(self, environment: jinja2.Environment, template: str) -> tuple[str, str, Any]:
        pieces = split_template_path(template)
        for searchpath in self.searchpath:
            path = Path(searchpath, *pieces)
            if os.path.lexists(path) and not path.is_dir():
                text = image_file(path).decode(self.encoding)
                return text, str(path), _unchanged(path, path.stat().st_mtime)
        raise jinja2.TemplateNotFound(template)


def _unchanged(path: Path, mtime: float) -> Any:
    return lambda: path.is_file() and path.stat().st_mtime == mtime


def _dquote(value: str) -> str:
    """A Dockerfile double-quoted value: JSON string escaping, and `$` kept literal. Non-ASCII
    stays as written (Docker does not read `\\u00e9`: `café` would land as `caf\\u00e9`)."""
    return json.dumps(str(value), ensure_ascii=False).replace("$", "\\$")


@cache
def _environment(images_dir: Path) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=_BoundedLoader(str(images_dir)),
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
    return image_file(images_dir / name).decode("utf-8")
