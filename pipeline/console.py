"""The terminal a person reads: one live line per phase, the tools' whole output in files.

A long job is a few phases (bootstrap, build, server start, load). Each shows one line: its name,
the elapsed time, the counts that matter (build steps, questions done) and, underneath, the last
line of the tool doing the work. On a terminal the phase's lines are rewritten in place; elsewhere
(CI logs, a pipe) a phase prints its line at most every `every_s` seconds. What debootstrap, the
image build and the server print goes to the run's files (bootstrap-*.log, build-*.log,
server.log) and, with `-v`, to the terminal as well, above the live line: a server line never
overwrites the load's progress line. A phase that fails prints its tool's last 30 lines and the
file holding the rest.

The formatting is pure functions (`elapsed`, `clip`, `phase_line`, `tool_line`, `done_line`,
`failure_lines`); `Console` is the one writer, shared by every thread of the process (`console()`).
"""

from __future__ import annotations

import re
import shutil
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TextIO

__all__ = [
    "Console",
    "Phase",
    "clip",
    "console",
    "done_line",
    "elapsed",
    "failure_lines",
    "phase_line",
    "tool_line",
]

TAIL_LINES = 30  # what a failure shows of its tool's output; the file has the rest
EVERY_S = 20.0  # a phase's line, when the output is not a terminal
_REDRAW_S = 0.1  # a terminal is redrawn at most this often: a build prints thousands of lines
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


# -- formatting (pure) -----------------------------------------------------------------------------


def elapsed(seconds: float) -> str:
    """9s, 1m05s, 1h02m: short enough to sit at the front of a line."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def clip(text: str, width: int, *, collapse: bool = True) -> str:
    """`text` as one printable line of at most `width` characters: colours, carriage returns and
    tabs removed (a tool's progress bars), whitespace collapsed (unless not `collapse`: our own
    lines space their columns), the end cut with an ellipsis."""
    shown = [part for part in text.split("\r") if part.strip()]  # a progress bar redrawn with \r: its last state
    text = _CONTROL.sub(" ", _ANSI.sub("", shown[-1] if shown else ""))
    text = " ".join(text.split()) if collapse else text.strip()
    if width <= 1:
        return text[: max(width, 0)]
    return text if len(text) <= width else text[: width - 1] + "…"


def phase_line(name: str, label: str, seconds: float, counts: str, width: int = 160) -> str:
    """`build cpu-tiny  1m05s  step 7/12`."""
    return clip(f"{name} {label}  {elapsed(seconds)}  {counts}", width, collapse=False)


def tool_line(last: str, width: int = 160) -> str:
    """The tool's last line, indented under its phase's line."""
    return "  > " + clip(last, max(width - 4, 1))


def done_line(name: str, label: str, seconds: float, summary: str, *, ok: bool = True, width: int = 160) -> str:
    """The line a phase leaves behind when it ends."""
    verb = "done" if ok else "FAILED"
    return clip(f"{name} {label}: {verb} in {elapsed(seconds)}" + (f": {summary}" if summary else ""), width)


def failure_lines(name: str, label: str, tail: list[str], log: Path | None, width: int = 160) -> list[str]:
    """What a failed phase prints: its tool's last lines, then the file that holds all of them."""
    if not tail:
        lines = [f"{name} {label}: its tool printed nothing"]
    else:
        lines = [f"{name} {label}: the last {len(tail)} lines of its output:"]
        lines += ["  | " + clip(line, max(width - 4, 1)) for line in tail]
    if log is not None:
        lines.append(f"{name} {label}: the whole output is in {log}")
    return lines


# -- the writer -------------------------------------------------------------------------------------


class Phase:
    """One phase's live line. Made by `Console.phase`; a context manager that ends it (`done`, or on
    an exception the failure lines)."""

    def __init__(self, writer: Console, name: str, label: str, log: Path | None) -> None:
        self.writer = writer
        self.name = name
        self.label = label
        self.log = log
        self.started = writer.clock()
        self.counts = ""
        self.last = ""
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.lines = 0  # the tool's lines so far
        self.printed_at = self.started  # non-terminal output: when its line was last printed
        self.ended = False

    @property
    def seconds(self) -> float:
        return self.writer.clock() - self.started

    def update(self, counts: str) -> None:
        """New counts (`step 7/12`, `questions 40 done, 40 clean`)."""
        self.counts = counts
        self.writer._changed(self)

    def tool(self, line: str) -> None:
        """A line of the tool's output: kept for a failure, shown under the phase, streamed with -v."""
        line = line.rstrip("\n")
        self.tail.append(line)
        self.lines += 1
        if line.strip():
            self.last = line
        self.writer._tool(self, line)

    def done(self, summary: str = "") -> None:
        if not self.ended:
            self.ended = True
            self.writer._end(self, [done_line(self.name, self.label, self.seconds, summary, width=self.writer.width)])

    def fail(self, why: str = "") -> None:
        """End the phase as failed: why, the tool's last lines and the file with all of them."""
        if self.ended:
            return
        self.ended = True
        width = self.writer.width
        lines = [done_line(self.name, self.label, self.seconds, why, ok=False, width=width)]
        lines += failure_lines(self.name, self.label, list(self.tail), self.log, width=width)
        self.writer._end(self, lines)

    def __enter__(self) -> Phase:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.done()
        elif issubclass(exc_type, KeyboardInterrupt):
            self.done("interrupted")  # the CLI says what was cleaned up; no log dump over it
        else:
            message = str(exc).strip() if exc is not None else ""
            self.fail(message.splitlines()[0][:200] if message else exc_type.__name__)
            if exc is not None and hasattr(exc, "output_tail"):
                exc.tail_shown = True  # type: ignore[attr-defined]  # the CLI then prints its first line only


class Console:
    """The process's one writer to the terminal (stderr). `verbose` streams the tools' output."""

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        tty: bool | None = None,
        verbose: bool = False,
        every_s: float = EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        width: int | None = None,
    ) -> None:
        self._stream = stream
        self._tty = tty
        self.verbose = verbose
        self.every_s = every_s
        self.clock = clock
        self._width = width
        self._lock = threading.RLock()
        self._phases: list[Phase] = []  # live ones, innermost last: the one drawn
        self._drawn = 0  # lines of the live block on the terminal now
        self._drawn_at = -1e9

    @property
    def stream(self) -> TextIO:
        return self._stream or sys.stderr  # looked up late: tests and the CLI swap sys.stderr

    @property
    def tty(self) -> bool:
        if self._tty is not None:
            return self._tty
        try:
            return self.stream.isatty()
        except (AttributeError, ValueError):
            return False

    @property
    def width(self) -> int:
        if self._width is not None:
            return self._width
        return max(40, shutil.get_terminal_size((160, 24)).columns - 1) if self.tty else 160

    def say(self, text: str) -> None:
        """A line of this tool's own (a stage's verdict, where the receipt is): always shown."""
        with self._lock:
            self._clear()
            self.stream.write(text + "\n")
            self._draw(force=True)
            self.stream.flush()

    def command(self, text: str) -> None:
        """`+ argv` of a command about to run: shown with -v only (a failure names its command)."""
        if self.verbose:
            self.say(f"+ {text}")

    def feed(self, name: str, label: str, line: str) -> None:
        """A tool line for the live phase `name label`, from a thread that does not hold the phase
        (the server's log follower). No such phase live (the server answers, the load runs): the
        line is in the tool's file only, and on the terminal with -v."""
        with self._lock:
            phase = next((p for p in self._phases if (p.name, p.label) == (name, label)), None)
        if phase is not None:
            phase.tool(line)
        elif self.verbose:
            self.say(f"[{name} {label}] {line}")

    def phase(self, name: str, label: str, *, log: Path | None = None) -> Phase:
        phase = Phase(self, name, label, log)
        with self._lock:
            self._phases.append(phase)
            self._changed(phase)
        return phase

    # -- what phases tell it --------------------------------------------------------------------

    def _changed(self, phase: Phase) -> None:
        with self._lock:
            if phase.ended:
                return
            if self.tty:
                if phase is self._current():
                    self._draw()
                return
            now = self.clock()
            if now - phase.printed_at >= self.every_s:
                phase.printed_at = now
                line = phase_line(phase.name, phase.label, phase.seconds, phase.counts, self.width)
                if phase.last and not self.verbose:  # with -v the tool's lines are printed anyway
                    line = clip(f"{line}  | {clip(phase.last, self.width)}", self.width, collapse=False)
                self.stream.write(line + "\n")
                self.stream.flush()

    def _tool(self, phase: Phase, line: str) -> None:
        if self.verbose:
            self.say(f"[{phase.name} {phase.label}] {line}")
        else:
            self._changed(phase)

    def _end(self, phase: Phase, lines: list[str]) -> None:
        with self._lock:
            self._clear()
            if phase in self._phases:
                self._phases.remove(phase)
            self.stream.write("".join(line + "\n" for line in lines))
            self._draw(force=True)
            self.stream.flush()

    # -- the terminal's live block ----------------------------------------------------------------

    def _current(self) -> Phase | None:
        return self._phases[-1] if self._phases else None

    def _clear(self) -> None:
        if self._drawn:
            sequence = "\r" + "\x1b[1A" * (self._drawn - 1) + "\x1b[J"
            getattr(self.stream, "write_control", self.stream.write)(sequence)  # the CLI's stream neutralises escapes
            self._drawn = 0

    def _draw(self, *, force: bool = False) -> None:
        phase = self._current()
        if not self.tty or phase is None:
            return
        now = self.clock()
        if not force and now - self._drawn_at < _REDRAW_S:
            return
        self._clear()
        block = [phase_line(phase.name, phase.label, phase.seconds, phase.counts, self.width)]
        if phase.last:
            block.append(tool_line(phase.last, self.width))
        self.stream.write("\n".join(block))  # no newline: the cursor stays on the block to rewrite it
        self.stream.flush()
        self._drawn, self._drawn_at = len(block), now


_CONSOLE = Console()


def console() -> Console:
    """The process's writer (the CLI sets `verbose` from -v)."""
    return _CONSOLE
