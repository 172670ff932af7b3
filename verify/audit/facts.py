"""The facts an index holds: messages (literal text and typed holes), classes, and one wheel's whole.

Split from `index.py` so the readers (`pysource.py`, `store.py`) and the builder share one model.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["ClassInfo", "FileFacts", "Hole", "Message", "PackageIndex", "Segment", "iter_holes", "merge_segments"]


@dataclass(frozen=True)
class Hole:
    """A place in a message that the program fills at runtime."""

    kind: str  # free | num | name
    expr: str = ""
    refs: tuple[str, ...] = ()  # name holes: CamelCase names the enclosing function refers to


Segment = str | Hole


@dataclass(frozen=True)
class Message:
    file: str
    line: int
    kind: str  # log | warn | print | raise | str (__str__/__repr__) | assigned (a message variable) | cxx
    segments: tuple[Segment, ...]

    @property
    def literal(self) -> str:
        return "".join(s for s in self.segments if isinstance(s, str))

    def render(self) -> str:
        """The text with each hole shown as `{…}` (the evidence a report prints)."""
        return "".join(s if isinstance(s, str) else "{" + (s.expr or s.kind) + "}" for s in self.segments)


@dataclass(frozen=True)
class ClassInfo:
    name: str
    file: str
    line: int
    bases: tuple[str, ...]
    capability: tuple[tuple[str, str, int, int], ...] = ()  # (method, call, N, line)


@dataclass(frozen=True)
class PackageIndex:
    """Everything one wheel can print, the env vars it reads and the classes it defines."""

    name: str
    version: str
    wheel: str
    sha256: str
    messages: tuple[Message, ...]
    env: dict[str, tuple[str, int]] = field(default_factory=dict)
    classes: dict[str, ClassInfo] = field(default_factory=dict)
    files: int = 0

    def ancestors(self, name: str) -> set[str]:
        seen: set[str] = set()
        todo = [name]
        while todo:
            info = self.classes.get(todo.pop())
            for base in info.bases if info else ():
                if base not in seen:
                    seen.add(base)
                    todo.append(base)
        return seen


@dataclass
class FileFacts:
    file: str
    crc: int = 0
    size: int = 0
    messages: list[Message] = field(default_factory=list)
    env: dict[str, tuple[str, int]] = field(default_factory=dict)
    classes: list[ClassInfo] = field(default_factory=list)


def merge_segments(segments: list[Segment]) -> tuple[Segment, ...]:
    out: list[Segment] = []
    for s in segments:
        if isinstance(s, str) and out and isinstance(out[-1], str):
            out[-1] = out[-1] + s
        elif s != "":
            out.append(s)
    return tuple(out)


def iter_holes(message: Message) -> Iterator[Hole]:
    return (s for s in message.segments if isinstance(s, Hole))
