"""Mechanisms that generalise past the catalog's wordings (issue 44, diag4).

Five batches of fresh pastes each brought wordings no pattern had met; most of what they missed were
lines whose *component* says what failed (nvidia-container-cli, a Jinja template, NCCL, a CUDA kernel's
assert) or a process that died without an error word. Two answers that need no new wording:

- `component_class`: an error no pattern classified is given the family class of the component that
  wrote it (the line's head: its binary, logger or exception type; the stack frames below it; the last
  exception's frames), from each class's `components` in failure_classes.yaml.
- `with_exit`: an unclassified error that ends in a process's death quotes the exit (a signal, a
  non-zero status) beside the line, and a bare exit quotes the last line before it that is not INFO.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from verify.logs.logscan import Log, LogMatch
from verify.logs.logtext import clean_line, message_of, split_records
from verify.logs.tracebacks import _QUIET_LEVEL, LastException, _context_before

if TYPE_CHECKING:
    from verify.logs.classes import ClassCatalog, FailureClass
    from verify.logs.diagnosis import ClassHit

# A stack frame below an error line: Node/JS ("    at f (file.js:1:2)"), Python ('  File "..."'),
# gdb/backtrace ("#3 0x... in f"), Windows' c10 frames ("00007FF... c10.dll!...").
_FRAME_LINE = re.compile(r'^\s+(?:at |File ")|^\s*#\d+ |^[0-9A-F]{16}')
_FRAMES_AFTER = 40
_TRACEBACK = "Traceback (most recent call last)"
_FRAME_TEXT = re.compile(r'File "[^"\n]+", line \d+, in \S+')
# One token a message starts with that names its writer: a bracketed tag, a level word, or `name:` (no space).
_HEAD_TOKEN = re.compile(r"\s*(?:\[(?P<tag>[^\]\s]+)\]|(?P<level>ERROR|ERRO|CRITICAL|FATAL|E)\s|(?P<name>\S+?):\s)")
# A process's death as a supervisor or shell reports it (the extractor's own patterns say where each comes from).
_EXIT = re.compile(
    r"^\s*(?:Killed|Aborted|Bus error|Illegal instruction|Floating point exception|Segmentation fault)"
    r"(?: \(core dumped\))?\s*$"
    r"|(?i:\bexited with code [1-9]\d*\b)|didn't complete successfully: exit [1-9]"
    r"|\bexit (?:status|code):? -?[1-9]\d*\b"
    r"|(?i:\b(?:killed|terminated|signaled)(?: to shutdown)? (?:by|with) signal\b)"
)


def component_text(data: Log, found: LogMatch, last: LastException | None) -> str:
    """What wrote an error line: its head (before the message), the frames below it, the exception's frames."""
    parts = _head(clean_line(found.line).text.strip())
    parts += [f for f in _lines_after(data, found.line_no) if _FRAME_LINE.match(f)]
    parts += _frames_on_the_line(found.line)
    if last is not None:
        parts.append(last.type)
        parts += [f.file for f in (last.frame, last.package_frame) if f is not None]
    return "\n".join(parts)


def component_class(classes: ClassCatalog, text: str) -> FailureClass | None:
    """The failing class whose `components` name what wrote the error, the most specific first."""
    found = [c for c in classes.classes if c.severity == "fail" and any(re.search(p, text) for p in c.components)]
    return min(found, key=lambda c: c.priority) if found else None


def by_component(
    classes: ClassCatalog, hit: ClassHit, data: Log, last: LastException | None, found: LogMatch | None
) -> ClassHit:
    """An unclassified error (or Python exception) given the class of its component, when one has it."""
    if found is None:
        return hit
    mapped = component_class(classes, component_text(data, found, last))
    if mapped is None:
        return hit
    return replace(hit, id=mapped.id, title=mapped.title, what=mapped.what, next=mapped.next)


def with_exit(hit: ClassHit, data: Log, extractor: Sequence[LogMatch]) -> ClassHit:
    """An unclassified error line with the process's exit after it, or a bare exit with the line before it."""
    exits = [m for m in extractor if _EXIT.search(clean_line(m.line).text)]
    if not exits:
        return hit
    end = max(exits, key=lambda m: m.line_no)
    end_text = clean_line(end.line).text.strip()
    if end.line_no > hit.line_no:
        return replace(hit, text=f"{hit.text} (then, line {end.line_no}: {end_text[:120]})")
    if end.line_no == hit.line_no:
        before = [t for t in (clean_line(r).text.strip() for r in _context_before(data, end.line, last=False)) if t]
        cause = next((t for t in reversed(before) if not _QUIET_LEVEL.match(t)), None)
        if cause:
            return replace(hit, text=f"{hit.text} (the last line before it: {cause[:200]})")
    return hit


def _frames_on_the_line(line: str) -> list[str]:
    """The frames a flattened paste put on the error's own line, after it (records joined by spaces or a
    `^M`): a traceback cut off before its exception names what raised only there (issue 44, fresh11)."""
    records = split_records(line.encode(errors="replace"))[1:]
    return [m.group(0) for r in records if (m := _FRAME_TEXT.search(r.decode(errors="replace")))]


def _head(text: str) -> list[str]:
    """The words before an error line's message that name its writer: the logger's header, then the
    bracketed tags and the `name:` tokens the message starts with ("nvidia-container-cli:", "[TensorRT-LLM]",
    "zmq.error.ZMQError:", "../aten/src/ATen/native/cuda/IndexKernel.cu:92:"), each on its own line."""
    message = message_of(text)
    parts = [text[: len(text) - len(message)].strip()]
    rest = message
    for _ in range(6):
        found = _HEAD_TOKEN.match(rest)
        if not found:
            break
        parts.append(found.group("tag") or found.group("level") or found.group("name"))
        rest = rest[found.end() :]
    return [p[:200] for p in parts if p]


def _lines_after(data: Log, line_no: int) -> list[str]:
    """The frames below line `line_no` (1-based, as the scan counts newlines) up to the next record that is
    neither a frame nor a traceback's indented source line. Found by its number, not its text: a line logged
    twice (each rank's, each retry's) has different frames under each copy, and the next copy's frames are
    not this one's. A frame is judged on its message, so a traceback each of whose lines carries the
    logger's header (vLLM logs an exception line by line: `ERROR ... [serving_chat.py:250]   File ...`)
    or that a paste flattened (records joined by `^M`) keeps its frames (issue 44, fresh11)."""
    pos = 0
    for _ in range(line_no):
        pos = data.find(b"\n", pos) + 1
        if pos == 0:
            return []
    below = bytes(data[pos : pos + (1 << 14)]).decode(errors="replace").splitlines()[:_FRAMES_AFTER]
    frames: list[str] = []
    for physical in below:
        for record in split_records(physical.encode(errors="replace")):
            text = record.decode(errors="replace")
            if _FRAME_LINE.match(text):
                frames.append(text)
                continue
            message, indented = _message_indented(text)
            if indented and _FRAME_LINE.match(f" {message}"):
                frames.append(f"  {message}")
            elif text[:1].strip() and message and not indented and not message.startswith(_TRACEBACK):
                return frames
    return frames


def _message_indented(text: str) -> tuple[str, bool]:
    """A record's message, and whether the message was indented under its logger's header (a traceback's
    frame or source line, logged line by line: the header, one space, then the traceback's own indent)."""
    cleaned = clean_line(text).text
    message = message_of(cleaned)
    at = cleaned.rfind(message) if message else -1
    return message, at >= 2 and cleaned[at - 2 : at] == "  "
