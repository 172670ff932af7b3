"""Log text as people paste it, made comparable: one clean line per log record.

Real pastes carry wrappers that the serving stack never wrote: CRLF and literal `^M`, ANSI colour
codes (or their remnants once the ESC byte is lost: ` [36m`), docker compose (`vllm-1  | `) and
`docker logs --timestamps` prefixes, log viewers' `  | `, markdown quotes (`> `), terminal-UI box
borders (`│ ... │`), pytest's `E   `, a caller's own logger prefix, and the process prefix vLLM
puts on every line of a child (`(EngineCore_DP0 pid=N)`, `(Worker_TP0 pid=N)`, nested). Some
pastes are flattened onto one line. `clean_line` takes those off and says which process wrote the
line; `split_records` cuts a flattened paste back into records. Pure functions, no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["CleanLine", "clean_line", "decode", "message_of", "split_records"]

# ESC-introduced sequences, then the remnants a copy leaves when the ESC byte is dropped
# (vllm-project/vllm#2734: ` [36m(RayWorkerVllm pid=5085) [0m`), then ESC in caret notation, as a
# terminal pager or `cat -v` shows it and people paste it (`^[[1;36m(APIServer pid=1)^[[0;0m`;
# ByteDance-Seed/seed-oss#10, issue 44 fresh11).
_ANSI = re.compile(
    r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]|(?:(?<=\s)|^)\[\d{1,3}(?:;\d{1,3})*m|\^\[\[[0-9;?]*[ -/]*[@-~]"
)
# Wrappers in front of the record, tried repeatedly (a compose prefix around a timestamped line...).
_PREFIXES = (
    re.compile(r"^\s*>\s?"),  # markdown quote (leptonai/gpud#46, vllm-project/vllm#11251)
    re.compile(r"^\s*│\s?"),  # terminal UI box border (vllm-project/vllm#6976)
    re.compile(r"^\s*\|\s"),  # log viewer column (vllm-project/vllm#6042)
    re.compile(r"^[\w.-]+(?:-\d+)?\s+\|\s"),  # docker compose service prefix (syv-ai/qwen38-27b-rtx3090#147)
    re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)\s"),  # docker logs -t
    re.compile(r"^E {1,12}(?=\S|$)"),  # pytest failure lines (flashinfer-ai/flashinfer#3044)
    re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ - [\w.]+ - [A-Z]+ - "),  # a caller's logging (allenai/olmocr#105)
    re.compile(r"^kernel: "),  # journalctl -k (NVIDIA/open-gpu-kernel-modules#1150)
)
_BOX_END = re.compile(r"\s*│\s*$")
# vLLM's per-process prefix, possibly nested: `(EngineCore_0 pid=1) (VllmWorker TP0 pid=7) ...`
_PROCESS = re.compile(r"^\((?P<name>[A-Za-z][\w]*(?:[ _][\w]+)*) pid=\d+(?:, ip=[\d.]+)?\)\s?")
# The logger's own header before the message: vLLM V1 (`ERROR 05-12 01:48:42 [api_router.py:72] `),
# vLLM V0 (`ERROR 09-27 06:46:46 engine.py:157] `), a dated variant (`2024-12-19 21:40:35 ERROR 56542
# [async_llm_engine.py:64] `), SGLang (`[2024-12-07 02:54:42 TP0] `), torch.distributed (`[rank0]: `),
# FastChat (`2024-02-20 21:46:23 | ERROR | stderr | `).
_HEADER = re.compile(
    r"^(?:(?:INFO|WARNING|ERROR|DEBUG|CRITICAL):? +\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? +(?:\[[^\]]+\]|[\w.]+:\d+\])\s?"
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:,\d+)? +(?:INFO|WARNING|ERROR|DEBUG) +\d+ +\[[^\]]+\]\s?"
    r"|\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?: [\w ]+)?\]\s?"
    r"|\[rank\d+\]:\s?"
    # FastChat's workers (fastchat/utils.py build_logger: "%(asctime)s | %(levelname)s | %(name)s | %(message)s",
    # the worker's stderr re-logged as name `stderr`; netease-youdao/QAnything#128)
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| (?:INFO|WARNING|ERROR|DEBUG|CRITICAL) \| [\w.]+ \|\s?"
    r"|(?:INFO|WARNING|ERROR):\s+)"
)
# Ray's dedup suffix (vllm-project/vllm#4327)
_RAY_REPEAT = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")
# Where a flattened paste hides record starts: a vLLM level + date, a Python frame, a traceback.
_RECORD_START = re.compile(
    rb"(?<=[^)\s]) +(?=(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) \d\d-\d\d \d\d:)"  # not after a process prefix
    rb"|(?<=\S) +(?=\([A-Za-z]\w*(?:[ _]\w+)* pid=\d+\) (?:INFO|WARNING|ERROR|DEBUG|CRITICAL) \d\d-\d\d \d\d:)"
    rb"|(?<=[^\]|\s]) +(?=File \"[^\"]+\", line \d+, in )"  # not after a vLLM header's ] or FastChat's |
    rb"|(?<=\S) +(?=Traceback \(most recent call last\):)"
    # a carriage return in caret notation (`cat -v`) between two records of a paste: ESC's `^[` or a
    # letter follows it, never the end of the line (that one clean_line drops)
    rb"|\^M(?=\^\[|\S)"
)


@dataclass(frozen=True, kw_only=True)
class CleanLine:
    text: str  # the record as the program wrote it
    process: str | None  # innermost process prefix, e.g. EngineCore_DP0, Worker_TP0, VllmWorker TP1


def decode(data: bytes) -> tuple[str, int, int | None]:
    """Text, the number of byte sequences that are not UTF-8, and the offset of the first of them.

    A log with a stray latin-1 byte is still a log: the bad bytes become U+FFFD and are counted,
    so the caller can say where they are instead of refusing the file.
    """
    try:
        return data.decode(), 0, None
    except UnicodeDecodeError as exc:
        first = exc.start
    text = data.decode(errors="replace")
    return text, text.count("\ufffd") - data.decode(errors="ignore").count("\ufffd"), first


def clean_line(raw: str) -> CleanLine:
    """One line without paste wrappers, carriage returns and colour codes."""
    text = raw.replace("\r", "")
    if text.endswith("^M"):
        text = text[:-2]
    text = _ANSI.sub("", text)
    for _ in range(6):  # wrappers nest (compose around timestamps around a quote); a few passes suffice
        before = text
        for prefix in _PREFIXES:
            text = prefix.sub("", text, count=1)
        if text == before:
            break
    text = _BOX_END.sub("", text)
    process = None
    while True:
        m = _PROCESS.match(text.lstrip())
        if not m:
            break
        process = m.group("name")
        text = text.lstrip()[m.end() :].lstrip()
    text = _RAY_REPEAT.sub("", text)
    return CleanLine(text=text.rstrip(), process=process)


def message_of(text: str) -> str:
    """The message a cleaned line carries, without its logger's level, date and source header."""
    for _ in range(4):
        stripped = _PROCESS.sub("", _HEADER.sub("", text, count=1).lstrip(), count=1)
        if stripped == text:
            break
        text = stripped
    return text


def split_records(line: bytes) -> list[bytes]:
    """A flattened paste (records joined by spaces on one line) cut back into records."""
    if len(line) < 160:
        return [line]
    return [part for part in _RECORD_START.split(line) if part]
