"""Read YAML into plain Python values while remembering the line of every key and item.

PyYAML's composed node tree carries marks; we walk it once and record, for each path such as
`("cells", 3, "base")`, the 1-based line it starts on. Validation errors can then say
`matrix.yaml:42: cells[3].base: ...`. Duplicate mapping keys, which PyYAML silently collapses,
are reported here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pipeline.errors import MatrixError

__all__ = ["Path_", "YamlSource", "format_path", "load_yaml"]

Path_ = tuple[str | int, ...]


def format_path(path: Path_) -> str:
    """`("cells", 3, "base")` -> `cells[3].base`."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text or "(top level)"


@dataclass(frozen=True)
class YamlSource:
    """The parsed document plus where each path came from."""

    file: Path
    data: Any
    lines: dict[Path_, int] = field(default_factory=dict)
    raw: dict[Path_, str] = field(default_factory=dict)

    def text_of(self, path: Path_) -> str | None:
        """The scalar exactly as written (so `version: 0.10` stays "0.10", not the float 0.1)."""
        return self.raw.get(path)

    def line_of(self, path: Path_) -> int:
        """Line of `path`, or of its nearest located ancestor (a missing key points at its parent)."""
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.lines.get((), 1)

    def where(self, path: Path_) -> str:
        return f"{self.file}:{self.line_of(path)}: {format_path(path)}"


def load_yaml(file: Path) -> YamlSource:
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise MatrixError([f"{file}: cannot read: {exc.strerror}"]) from exc
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        raise MatrixError([f"{file}:{line}: not valid YAML: {getattr(exc, 'problem', exc)}"]) from exc
    lines: dict[Path_, int] = {}
    raw: dict[Path_, str] = {}
    problems: list[str] = []
    data = _convert(node, (), lines, raw, problems, file) if node is not None else None
    if problems:
        raise MatrixError(problems)
    return YamlSource(file=file, data=data, lines=lines, raw=raw)


def _convert(
    node: yaml.Node,
    path: Path_,
    lines: dict[Path_, int],
    raw: dict[Path_, str],
    problems: list[str],
    file: Path,
) -> Any:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = _scalar(key_node)
            child: Path_ = (*path, str(key))
            if key in result:
                problems.append(f"{file}:{key_node.start_mark.line + 1}: {format_path(child)}: duplicate key")
                continue
            result[key] = _convert(value_node, child, lines, raw, problems, file)
            lines[child] = key_node.start_mark.line + 1
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_convert(item, (*path, i), lines, raw, problems, file) for i, item in enumerate(node.value)]
    raw[path] = str(node.value)
    return _scalar(node)


def _scalar(node: yaml.Node) -> Any:
    """Construct a scalar with YAML 1.1 safe rules (so `true`, `1`, `null` get their types)."""
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)
    finally:
        loader.dispose()
