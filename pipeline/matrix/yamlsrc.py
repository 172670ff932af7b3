"""Read YAML into plain Python values while remembering the line of every key and item.

PyYAML's composed node tree carries marks; we walk it once and record, for each path such as
`("cells", 3, "base")`, the 1-based line it starts on. Validation errors can then say
`matrix.yaml:42: cells[3].base: ...`. Duplicate mapping keys, which PyYAML silently collapses,
are reported here.
"""

from __future__ import annotations

import difflib
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pipeline.errors import InputError, MatrixError
from pipeline.guard import boundedio

__all__ = ["Path_", "YamlSource", "format_path", "known_keys", "load_site_file", "load_yaml"]

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
    digest: str = ""  # sha256 of the bytes parsed (the file is read once, through the bounded reader)

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


# Limits on what one matrix may cost (issue 16): a hostile or broken file is a clear exit 2, never
# an hour of CPU or the host's memory. A real matrix is a few hundred lines.
MAX_BYTES = 8 * 2**20
MAX_DEPTH = 64
MAX_VALUES = 1_000_000  # mappings, lists and scalars after aliases are expanded (billion laughs)


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """libyaml's parser when present (10x faster), with the implicit-tag resolution of repeated
    scalars (`base: img` ten thousand times) done once per distinct value."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._resolved: dict[tuple[Any, ...], str] = {}

    def resolve(self, kind: Any, value: Any, implicit: Any) -> str:
        if kind is not yaml.ScalarNode:
            return str(super().resolve(kind, value, implicit))
        key = (value, *implicit) if isinstance(implicit, tuple) else (value, implicit)
        tag = self._resolved.get(key)
        if tag is None:
            tag = self._resolved[key] = str(super().resolve(kind, value, implicit))
        return tag


def load_yaml(file: Path) -> YamlSource:
    data = read_source(file)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise MatrixError(
            [f"{file}:{line}: not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start})"]
        ) from None
    if "\x00" in text:
        line = text[: text.index("\x00")].count("\n") + 1
        raise MatrixError([f"{file}:{line}: a NUL byte: not a YAML text file"])
    try:
        node = yaml.compose(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        raise MatrixError([f"{file}:{line}: not valid YAML: {getattr(exc, 'problem', exc)}"]) from exc
    except RecursionError:
        raise MatrixError([f"{file}: nested too deeply to read (at most {MAX_DEPTH} levels)"]) from None
    lines: dict[Path_, int] = {}
    raw: dict[Path_, str] = {}
    problems: list[str] = []
    walk = _Walk(file=file, lines=lines, raw=raw, problems=problems)
    try:
        if node is not None:
            _refuse_expansion_bomb(file, node)
        data_ = walk.convert(node, (), ()) if node is not None else None
    except _TooBig as exc:
        raise MatrixError([str(exc)]) from None
    if problems:
        raise MatrixError(problems)
    return YamlSource(file=file, data=data_, lines=lines, raw=raw, digest="sha256:" + hashlib.sha256(data).hexdigest())


def read_source(file: Path) -> bytes:
    """The YAML file's bytes through the bounded reader: a FIFO, a device or a file past MAX_BYTES is
    a MatrixError naming it (a FIFO was a wait without end, issue 27)."""
    if not file.exists() and not file.is_symlink():
        raise MatrixError([f"{file}: cannot read: No such file or directory"])
    try:
        return boundedio.read_bytes(file, "YAML file", limit=MAX_BYTES)
    except InputError as exc:
        raise MatrixError([str(exc)]) from None


class _TooBig(Exception):
    pass


def _refuse_expansion_bomb(file: Path, root: yaml.Node) -> None:
    """Refuse a document whose aliases expand past MAX_VALUES before walking it: the sizes of the
    distinct nodes (an alias is the same node object) are summed once each, so nine lines of
    billion laughs cost microseconds here instead of a million-value walk. Depth and recursion are
    left to the walk, which names the path."""
    sizes: dict[int, int] = {}

    def size(node: yaml.Node, depth: int, open_: frozenset[int]) -> int:
        known = sizes.get(id(node))
        if known is not None:
            return known
        if depth > MAX_DEPTH or id(node) in open_:
            return 1
        inner = open_ | {id(node)}
        children: list[yaml.Node] = []
        if isinstance(node, yaml.MappingNode):
            children = [value for _, value in node.value]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        total = 1 + sum(size(child, depth + 1, inner) for child in children)
        sizes[id(node)] = total
        return total

    if size(root, 0, frozenset()) <= MAX_VALUES:
        return
    node = root
    while True:  # down to the smallest node that alone is too big: its line is the one to fix
        children = [v for _, v in node.value] if isinstance(node, yaml.MappingNode) else node.value
        bigger = [c for c in children if isinstance(c, yaml.Node) and sizes.get(id(c), 0) > MAX_VALUES]
        if not bigger:
            break
        node = bigger[0]
    raise _TooBig(
        f"{file}:{node.start_mark.line + 1}: more than {MAX_VALUES:,} values (aliases expanded): not a matrix"
    )


class _Walk:
    """One pass over the composed nodes, bounded in depth and in values (aliases count each time
    they are expanded); a recursive alias is an error, not an endless loop."""

    def __init__(self, *, file: Path, lines: dict[Path_, int], raw: dict[Path_, str], problems: list[str]) -> None:
        self.file, self.lines, self.raw, self.problems = file, lines, raw, problems
        self.values = 0
        self.loader = yaml.SafeLoader("")
        self.scalars: dict[tuple[Any, ...], Any] = {}

    def convert(self, node: yaml.Node, path: Path_, parents: tuple[int, ...]) -> Any:
        self.values += 1
        line = node.start_mark.line + 1
        if self.values > MAX_VALUES:
            raise _TooBig(f"{self.file}:{line}: more than {MAX_VALUES:,} values (aliases expanded): not a matrix")
        if len(path) > MAX_DEPTH:
            raise _TooBig(f"{self.file}:{line}: {format_path(path[:8])}...: nested deeper than {MAX_DEPTH} levels")
        if id(node) in parents:
            raise _TooBig(f"{self.file}:{line}: {format_path(path)}: a recursive alias (it contains itself)")
        self.lines[path] = line
        if isinstance(node, yaml.MappingNode):
            inner = (*parents, id(node))
            result: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                key = self.scalar(key_node) if isinstance(key_node, yaml.ScalarNode) else None
                child: Path_ = (*path, str(key))
                if not isinstance(key_node, yaml.ScalarNode):
                    self.problems.append(
                        f"{self.file}:{key_node.start_mark.line + 1}: {format_path(path)}: a key must be a plain value"
                    )
                    continue
                if key in result:
                    self.problems.append(
                        f"{self.file}:{key_node.start_mark.line + 1}: {format_path(child)}: duplicate key"
                    )
                    continue
                result[key] = self.convert(value_node, child, inner)
                self.lines[child] = key_node.start_mark.line + 1
            return result
        if isinstance(node, yaml.SequenceNode):
            inner = (*parents, id(node))
            return [self.convert(item, (*path, i), inner) for i, item in enumerate(node.value)]
        self.raw[path] = str(node.value)
        return self.scalar(node)

    def scalar(self, node: yaml.Node) -> Any:
        """Construct a scalar with YAML 1.1 safe rules (so `true`, `1`, `null` get their types),
        once per distinct (tag, text, style): a generated matrix repeats its values many times."""
        key = (node.tag, node.value, getattr(node, "style", None))
        if key in self.scalars:
            return self.scalars[key]
        try:
            value = self.loader.construct_object(node, deep=True)
        except yaml.YAMLError as exc:  # not remembered: each occurrence is its own located problem
            self.problems.append(f"{self.file}:{node.start_mark.line + 1}: {getattr(exc, 'problem', exc)}")
            return None
        self.loader.constructed_objects.clear()
        try:
            hash(value)
        except TypeError:
            value = str(node.value)
        self.scalars[key] = value
        return value


def load_site_file(path: Path, *, named: str, what: str, keys: tuple[str, ...]) -> YamlSource:
    """A site's own YAML file (runner labels, a fleet site): present, a mapping of `keys` only, at
    schema_version 1. Every refusal is an InputError naming `named` (how the user gave the path) or
    the file's line."""
    if not path.is_file():
        raise InputError(f"{named}: no such file")
    try:
        source = load_yaml(path)
    except MatrixError as exc:
        raise InputError(str(exc)) from exc
    if not isinstance(source.data, dict):
        raise InputError(f"{path}:1: {what} is a mapping ({', '.join(keys)})")
    known_keys(source, (), source.data, keys)
    if source.data.get("schema_version") != 1:
        raise InputError(f"{source.where(('schema_version',))}: schema_version must be 1")
    return source


def known_keys(source: YamlSource, at: Path_, data: dict[Any, Any], known: tuple[str, ...]) -> None:
    """Refuse a key outside `known`, naming its line and the closest known one."""
    for key in data:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f", did you mean {close[0]!r}?" if close else f" (known: {', '.join(known)})"
            raise InputError(f"{source.where((*at, key))}: unknown key{hint}")
