"""Log rules and known failure signatures, applied to a server log, a kernel log or any file.

Data, not code: the catalog of signatures lives in `signatures.yaml` and the built-in rule sets in
`logrules.yaml`, both beside this file. Scanning is pure (`scan` takes bytes and returns matches);
each pattern is pre-filtered by a literal it must contain, found with `bytes.find`, so a big log
is read at close to memory speed and only candidate lines meet the regex engine.
"""

from __future__ import annotations

import mmap
import os
import re
import re._constants as sre_c  # type: ignore[import-not-found]
import re._parser as sre_parse  # type: ignore[import-not-found]
import stat
import sys
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, BinaryIO

from pipeline.errors import InputError
from pipeline.guard.boundedio import open_input
from pipeline.matrix.model import LogRule
from pipeline.result import CheckResult, Status
from verify.logs.catalog import Facts, Signature, load_catalog, rules_for, rulesets_for

# Facts, load_catalog, rules_for and rulesets_for live in verify/logs/catalog.py; they are named here too
# because the commands and the audit import them from the scanner.
__all__ = [
    "Facts",
    "Log",
    "LogMatch",
    "LogWatcher",
    "judge",
    "load_catalog",
    "open_log",
    "rules_for",
    "rulesets_for",
    "scan",
]

Log = bytes | mmap.mmap  # what scan() reads: file bytes, or the file mapped into memory


# -- data ------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class LogMatch:
    id: str
    kind: str  # signature | expect | forbid | evidence
    line_no: int  # 1-based; for a window, the `first` line
    line: str
    groups: dict[str, str] = field(default_factory=dict)
    severity: str = ""
    title: str = ""
    refs: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        document = {"id": self.id, "kind": self.kind, "line": self.line_no, "text": self.line}
        if self.groups:
            document["groups"] = self.groups
        if self.kind == "signature":
            document |= {"severity": self.severity, "title": self.title, "refs": list(self.refs)}
        return document


# -- scanning --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Pattern:
    """One regex with the literals one of which every match contains (None: no usable literal)."""

    regex: re.Pattern[bytes]
    anchors: tuple[bytes, ...] | None


@cache
def _compile(pattern: str) -> tuple[re.Pattern[bytes], tuple[bytes, ...] | None]:
    regex = re.compile(pattern.encode())
    found = _anchors(pattern)
    return regex, (tuple(a.encode() for a in found) if found else None)


def _anchors(pattern: str) -> list[str] | None:
    """Literal strings at least one of which every match of `pattern` contains, or None."""
    try:
        parsed = sre_parse.parse(pattern)
    except re.error:
        return None
    if parsed.state.flags & re.IGNORECASE:
        return None
    return _sequence_anchors(list(parsed))


def _sequence_anchors(items: list[tuple[Any, Any]]) -> list[str] | None:
    if len(items) == 1 and items[0][0] is sre_c.BRANCH:
        found: list[str] = []
        for branch in items[0][1][1]:
            sub = _sequence_anchors(list(branch))
            if sub is None:
                return None
            found += sub
        return found
    best, run, groups = "", "", []
    for op, av in items:
        if op is sre_c.LITERAL:
            run += chr(av)
            continue
        best, run = max(best, run, key=len), ""
        if op is sre_c.SUBPATTERN:
            if not av[1] & re.IGNORECASE:  # a scoped (?i:...) group's letters match in either case
                groups.append(list(av[-1]))
        elif op is sre_c.BRANCH:  # a non-capturing (?:a|b) is parsed inline, as a bare branch
            groups.append([(op, av)])
    best = max(best, run, key=len)
    if len(best) >= 3:
        return [best]
    for group in groups:  # a mandatory group, e.g. (?:a|b), whose alternatives all have literals
        sub = _sequence_anchors(group)
        if sub and all(len(a) >= 3 for a in sub):
            return sub
    return None


def _line_bounds(data: Log, pos: int) -> tuple[int, int]:
    start = data.rfind(b"\n", 0, pos) + 1
    end = data.find(b"\n", pos)
    return start, len(data) if end < 0 else end


def _find_all(data: Log, anchors: Iterable[bytes]) -> dict[bytes, list[int]]:
    """Every position of every anchor, in one pass where Hyperscan is available.

    Hyperscan matches all anchors in a single pass at memory speed; without it, `bytes.find` runs
    once per anchor (correct, a few times slower on big logs). Both give the same positions.
    """
    anchors = sorted(set(anchors))
    found: dict[bytes, list[int]] = {a: [] for a in anchors}
    if not anchors:
        return found
    database = _hyperscan_database(tuple(anchors))
    if database is not None:

        def on_match(index: int, start: int, end: int, flags: int, context: object) -> None:
            anchor = anchors[index]
            found[anchor].append(end - len(anchor))

        database.scan(data, match_event_handler=on_match)
        return found
    for anchor in anchors:
        pos = data.find(anchor)
        while pos >= 0:
            found[anchor].append(pos)
            pos = data.find(anchor, pos + 1)
    return found


@cache
def _hyperscan_database(anchors: tuple[bytes, ...]) -> Any:
    if os.environ.get("STACKPROOF_NO_HYPERSCAN"):
        return None
    try:
        import hyperscan  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        return None
    try:
        database = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        database.compile(
            expressions=[re.escape(a) for a in anchors], ids=list(range(len(anchors))), elements=len(anchors)
        )
    except Exception:  # an unsupported CPU or build: fall back to bytes.find
        return None
    return database


# A rule or signature is matched against the first MAX_MATCH_LINE bytes of a line only. Python's
# `re` has no timeout, and a catalog regex with two unbounded parts (`(?P<shapes>.*?); ... (\S+)`)
# is cubic on a pathological line: a 4,000-fold repeat of its own prefix took 6.5 s, a 10 MB line
# would never end. A log line of vLLM or FlashInfer that says something is far shorter than this.
MAX_MATCH_LINE = 16 << 10


def _candidate_lines(data: Log, pattern: _Pattern, positions: dict[bytes, list[int]]) -> Iterable[tuple[int, int]]:
    """(start, end) of each line that may match, in order; `end` at most MAX_MATCH_LINE past `start`."""
    if pattern.anchors is None:
        for m in pattern.regex.finditer(data):
            yield _capped(*_line_bounds(data, m.start()))
        return
    for start in _line_starts(data, sorted({pos for anchor in pattern.anchors for pos in positions[anchor]})):
        yield _capped(*_line_bounds(data, start))


def _line_starts(data: Log, offsets: list[int]) -> list[int]:
    """The start of the line of each sorted offset, each line once; linear in the data (a search back
    from every offset was quadratic on one long line holding an anchor 200,000 times)."""
    starts: list[int] = []
    previous, start = 0, 0
    for offset in offsets:
        newline = data.rfind(b"\n", previous, offset)
        if newline >= 0:
            start = newline + 1
        previous = offset
        if not starts or starts[-1] != start:
            starts.append(start)
    return starts


def _capped(start: int, end: int) -> tuple[int, int]:
    return start, min(end, start + MAX_MATCH_LINE)


class _LineNumbers:
    """Line numbers for increasing byte offsets, counting newlines once."""

    CHUNK = 16 << 20

    def __init__(self, data: Log) -> None:
        self.data, self.pos, self.line = data, 0, 1

    def at(self, offset: int) -> int:
        if offset < self.pos:
            self.pos, self.line = 0, 1
        if isinstance(self.data, bytes):
            self.line += self.data.count(b"\n", self.pos, offset)
        else:  # an mmap has no count(): count slice by slice, a chunk in memory at a time
            for start in range(self.pos, offset, self.CHUNK):
                self.line += self.data[start : min(offset, start + self.CHUNK)].count(b"\n")
        self.pos = offset
        return self.line


@contextmanager
def open_log(path: Path, *, stdin: BinaryIO | None = None) -> Iterator[Log]:
    """The log's bytes: a regular file mapped into memory (no copy: a 200 MB log costs no read).

    `-` is standard input. Anything that is not a regular file with a size (a pipe, `/dev/stdin`,
    `<(...)`, a FIFO, a procfs file, which reports size 0) is read to its end as a stream: its
    size says nothing about its content, so judging it by its size would pass a log never read.
    """
    if str(path) == "-":
        yield _read_stream((stdin or sys.stdin.buffer).read(MAX_STREAM_LOG + 1), "stdin")
        return
    # boundedio: a device is refused, a FIFO without a writer is an empty log (no wait without end).
    with open_input(path, "log", stream_ok=True) as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size == 0:
            yield _read_stream(f.read(MAX_STREAM_LOG + 1), str(path))
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            yield mapped


# A log read as a stream (a pipe, stdin, procfs) is held in memory: at most this much of it.
MAX_STREAM_LOG = 1 << 30


def _read_stream(data: bytes, name: str) -> bytes:
    if len(data) > MAX_STREAM_LOG:
        raise InputError(f"{name}: a streamed log larger than {MAX_STREAM_LOG >> 20} MiB: save it to a file first")
    return data


def scan(data: Log, rules: Sequence[LogRule], signatures: Sequence[Signature]) -> list[LogMatch]:
    """Every rule and signature match in `data`, in log order."""
    found: list[tuple[int, LogMatch]] = []
    wanted = [_compile(r.pattern)[1] for r in rules] + [_compile(s.match or s.first or "")[1] for s in signatures]
    positions = _find_all(data, (a for anchors in wanted if anchors for a in anchors))
    for rule in rules:
        regex, anchors = _compile(rule.pattern)
        pattern = _Pattern(regex, anchors)
        for start, end in _candidate_lines(data, pattern, positions):
            m = regex.search(data, start, end)
            if m:
                found.append((start, _match(rule.id, rule.kind, data[start:end], m)))
                if rule.kind == "expect":
                    break  # one sighting proves an expect rule
    for sig in signatures:
        found += [(start, match) for start, match in _scan_signature(data, sig, positions)]
    numbers = _LineNumbers(data)
    ordered = sorted(found, key=lambda item: item[0])
    return [_with_line(match, numbers.at(start)) for start, match in ordered]


def _scan_signature(data: Log, sig: Signature, positions: dict[bytes, list[int]]) -> Iterable[tuple[int, LogMatch]]:
    regex, anchors = _compile(sig.match or sig.first or "")
    pattern = _Pattern(regex, anchors)
    for start, end in _candidate_lines(data, pattern, positions):
        m = regex.search(data, start, end)
        if not m:
            continue
        if sig.match is not None:
            yield start, _signature_match(sig, data[start:end], m)
            continue
        then, _ = _compile(sig.then or "")
        window_end = end
        for _ in range(sig.within):
            nxt = data.find(b"\n", window_end + 1)
            window_end = len(data) if nxt < 0 else nxt
            if window_end >= len(data):
                break
        hit = then.search(data, end, min(window_end, end + (sig.within + 1) * MAX_MATCH_LINE))
        if hit:
            yield start, _signature_match(sig, data[start:end], hit)


def _match(rule_id: str, kind: str, line: bytes, m: re.Match[bytes]) -> LogMatch:
    groups = {k: v.decode(errors="replace") for k, v in m.groupdict().items() if v is not None}
    return LogMatch(id=rule_id, kind=kind, line_no=0, line=line.decode(errors="replace"), groups=groups)


def _signature_match(sig: Signature, line: bytes, m: re.Match[bytes]) -> LogMatch:
    groups = {k: v.decode(errors="replace") for k, v in m.groupdict().items() if v is not None}
    return LogMatch(
        id=sig.id,
        kind="signature",
        line_no=0,
        line=line.decode(errors="replace"),
        groups=groups,
        severity=sig.severity,
        title=sig.title,
        refs=sig.refs,
    )


def _with_line(match: LogMatch, line_no: int) -> LogMatch:
    return LogMatch(**{**match.__dict__, "line_no": line_no})


# -- judging ---------------------------------------------------------------------------------------


def judge(
    matches: Sequence[LogMatch], rules: Sequence[LogRule], *, source: str = "the server log"
) -> list[CheckResult]:
    """Rule verdicts, evidence captures and signature matches as checks."""
    checks = []
    for rule in rules:
        hits = [m for m in matches if m.kind == rule.kind and m.id == rule.id]
        if rule.kind in ("expect", "forbid"):
            checks.append(_rule_check(rule, hits, source))
    if any(r.kind == "evidence" for r in rules):
        checks.append(_evidence_check(matches))
    checks.append(_signatures_check([m for m in matches if m.kind == "signature"], source))
    return checks


def _rule_check(rule: LogRule, hits: list[LogMatch], source: str) -> CheckResult:
    """An expect rule passes when the log shows its pattern, a forbid rule when it never does."""
    where = ", ".join(f"line {m.line_no}" for m in hits[:5])
    if rule.kind == "expect":
        if hits:
            return CheckResult(
                name=f"expect:{rule.id}",
                status=Status.PASS,
                message=f"{source} shows /{rule.pattern}/ ({where})",
                evidence={"line": hits[0].line_no, "text": hits[0].line},
            )
        status = Status.INCONCLUSIVE if rule.if_absent == "inconclusive" else Status.FAIL
        return CheckResult(name=f"expect:{rule.id}", status=status, message=f"{source} never shows /{rule.pattern}/")
    if hits:
        return CheckResult(
            name=f"forbid:{rule.id}",
            status=Status.FAIL,
            message=f"{source} shows forbidden /{rule.pattern}/ at {where}: {hits[0].line.strip()[:300]}",
            evidence={"matches": [m.to_json() for m in hits[:20]]},
        )
    return CheckResult(name=f"forbid:{rule.id}", status=Status.PASS, message=f"{source} never shows /{rule.pattern}/")


def _evidence_check(matches: Sequence[LogMatch]) -> CheckResult:
    """What the evidence rules captured: up to 20 distinct values each."""
    captured: dict[str, list[Any]] = {}
    for m in matches:
        if m.kind == "evidence":
            values = captured.setdefault(m.id, [])
            value = m.groups or m.line.strip()
            if value not in values and len(values) < 20:
                values.append(value)
    return CheckResult(
        name="evidence",
        status=Status.PASS,
        message=f"captured {', '.join(captured) or 'nothing'}",
        evidence=captured,
    )


def _signatures_check(signatures: list[LogMatch], source: str) -> CheckResult:
    """The first failing signature fails the check; warnings are named on a pass."""
    failing = [m for m in signatures if m.severity == "fail"]
    listing = [m.to_json() for m in signatures[:50]]
    if failing:
        first = failing[0]
        refs = f" ({', '.join(first.refs)})" if first.refs else ""
        return CheckResult(
            name="signatures",
            status=Status.FAIL,
            message=f"{first.id}: {first.title}{refs}, {source} line {first.line_no}",
            evidence={"matches": listing},
        )
    warned = sorted({m.id for m in signatures})
    return CheckResult(
        name="signatures",
        status=Status.PASS,
        message=f"no failure signature in {source}" + (f"; warnings: {', '.join(warned)}" if warned else ""),
        evidence={"matches": listing},
    )


# -- the live log ----------------------------------------------------------------------------------


class LogWatcher:
    """Fed the server log line by line as it streams; remembers the first failure signature.

    The readiness wait polls `fatal`, so a known-fatal line ends the wait at once instead of at the
    timeout (an engine can die while the API process keeps the container up).
    """

    def __init__(self, signatures: Sequence[Signature]) -> None:
        self.signatures = [s for s in signatures if s.source == "server" and s.severity == "fail"]
        self.recent: deque[str] = deque(maxlen=max((s.within for s in self.signatures), default=1) + 1)
        self.count = 0
        self.fatal: LogMatch | None = None

    def feed(self, line: str) -> None:
        line = line[:MAX_MATCH_LINE]  # the same bound as a scan: no regex sees more of one line
        self.count += 1
        self.recent.append(line)
        if self.fatal is not None:
            return
        for sig in self.signatures:
            if sig.match is not None:
                m = _compile(sig.match)[0].search(line.encode(errors="replace"))
                if m:
                    self.fatal = _with_line(_signature_match(sig, line.encode(), m), self.count)
                    return
            elif re.search(sig.then or "", line):
                first = _compile(sig.first or "")[0]
                window = list(self.recent)[-(sig.within + 1) : -1]
                for offset, earlier in enumerate(window):
                    if first.search(earlier.encode(errors="replace")):
                        line_no = self.count - len(window) + offset
                        self.fatal = LogMatch(
                            id=sig.id,
                            kind="signature",
                            line_no=line_no,
                            line=earlier,
                            severity=sig.severity,
                            title=sig.title,
                            refs=sig.refs,
                        )
                        return
