"""Reading a log's last exception: its type and message, the frames above it, the process that raised it
and the startup phase it happened in; and their JSON for the diagnosis.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from verify.logs.logscan import Log, LogMatch
from verify.logs.logtext import clean_line, message_of, split_records

_CONTEXT_LINES = 80  # how far above an exception its frames are looked for


SERVING_PACKAGES = ("vllm", "sglang", "flashinfer", "tensorrt_llm", "lmcache", "vllm_ascend")
# A bare `Error` is no Python raise line: Python has no builtin of that name (a module's `Error` is printed
# qualified, `shutil.Error`), while Rust's main returning an error prints `Error: <its Debug>` and Go's and
# Node's CLIs `Error: <message>` (TGI's launcher "Error: WebserverFailed", huggingface/text-generation-inference#2828;
# issue 44: a non-Python engine's error is not "A Python exception"). `Exception: ...` alone is Python's.
_EXCEPTION = re.compile(
    r"^(?P<type>(?:[A-Za-z_]\w*\.)*(?:\w+Error|\w*(?:Exception|OutOfResources|Exit))|(?:[A-Za-z_]\w*\.)+Error)"
    r"(?::\s*(?P<message>.*))?$"
)
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)')
_PROCESS_ANYWHERE = re.compile(r"\((?P<name>[A-Za-z]\w*(?:[ _]\w+)*) pid=\d+(?:, ip=[\d.]+)?\)")
# Frames that say which startup phase an out-of-memory happened in (vLLM V0/V1 and SGLang names).
_PHASE_FRAMES = (
    (
        "cuda-graph-capture",
        re.compile(r"capture_model|capture_end|torch\.cuda\.graph|cuda_graph_runner|_capture\b|capture\("),
    ),
    (
        "kv-profiling",
        re.compile(r"profile_run|determine_available_memory|determine_num_available_blocks|_dummy_run|profile_"),
    ),
    ("weight-load", re.compile(r"load_model|load_weights|create_weights|get_model|initialize_model|weight")),
    # The engine's step loop and the request path: an allocation that fails while serving
    # (vllm/v1/engine/core.py run_busy_loop/step, the scheduler's event loop, the API's handlers).
    (
        "serving",
        re.compile(
            r"execute_model|run_busy_loop|_process_engine_step|\bstep\(|sampler|sample\(|event_loop"
            r"|forward_batch_generation|serving_chat|serving_completion|_continuation_prefill"
            r"|Engine loop is not running|EngineDeadError"
        ),
    ),
)
# A logger header below error level (vLLM, SGLang's caller, Rust tracing, uvicorn): what such a line
# says about errors ("... can cause fd limit errors like `OSError: ...`") is not an error.
_QUIET_LEVEL = re.compile(
    # Python logging and Rust's tracing, whose timestamp is followed by two spaces before WARN/INFO
    # (what is left once the timestamp is taken off starts with a space: issue 44)
    r"^\s*(?:\S+\s+)?(?:INFO|WARNING|WARN|DEBUG|TRACE|NOTICE)\b"
    # glog (nvidia-container-cli -d: "I1128 17:35:08.651661 1737 nvc.c:376]", "W1128 ...")
    r"|^[IWD]\d{4} \d\d:\d\d:\d\d"
    # logfmt: Go's slog, logrus, dockerd ("time=... level=INFO source=server.go:168 msg=...")
    r"|\blevel=(?:info|warn|warning|debug|INFO|WARN|WARNING|DEBUG)\b"
    # a logger that brackets its level after a timestamp or its own tags (issue 44, diag5, tuned on fresh7):
    # TensorRT-LLM's "[TensorRT-LLM][WARNING]" and "[TRT-LLM] [W]" (cpp/include/tensorrt_llm/common/logger.h,
    # tensorrt_llm/logger.py), onnxruntime's "[W:onnxruntime:..." (core/common/logging/sinks: severity letter first)
    r"|^\s*(?:(?!ERROR|CRITICAL|FATAL)\S+\s+){0,2}(?:\[[^\]]*\]\s*)*?\[(?:W|I|D|V|WARNING|WARN|INFO|DEBUG)[:\]]"
    # a line that calls itself a warning, whatever its logger (SGLang's "... To silence this warning, specify
    # --disable-custom-all-reduce explicitly", sglang 0.5 srt/distributed/device_communicators; issue 44, diag4)
    r"|.*\b(?:[Tt]o silence this warning|[Tt]his warning can be (?:safely )?ignored)\b"
)


@dataclass(frozen=True, kw_only=True)
class Frame:
    file: str
    line: int
    function: str
    package: str | None


@dataclass(frozen=True, kw_only=True)
class LastException:
    type: str
    message: str
    line_no: int
    process: str | None
    frame: Frame | None  # innermost frame
    package_frame: Frame | None  # innermost frame in a serving package, when the innermost is not


def _clean_record(raw: str, patterns: Sequence[str]) -> str:
    """The record (of a possibly flattened line) that matched, without paste wrappers."""
    records = split_records(raw.encode(errors="replace"))
    for record in records:
        text = record.decode(errors="replace")
        if any(re.search(p, text) for p in patterns):
            return message_of(clean_line(text).text)
    return message_of(clean_line(raw).text)


def _process(raw: str) -> str | None:
    cleaned = clean_line(raw)
    if cleaned.process:
        return cleaned.process
    m = _PROCESS_ANYWHERE.search(raw)
    if m:
        return m.group("name")
    sglang = re.search(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d (?P<rank>(?:TP|DP|PP|EP)\d+[\w ]*)\]", raw)
    return sglang.group("rank") if sglang else None


def _phase_at(data: Log, hit: LogMatch, phases: dict[str, int]) -> str | None:
    """Where in startup a phased failure happened: its traceback's frames first, else the phase line above."""
    context = _context_before(data, hit.line, last=False)
    for phase, frames in _PHASE_FRAMES:
        if any(frames.search(line) for line in context if "File " in line or "in " in line) or frames.search(hit.line):
            return phase
    before = [p for p, line in phases.items() if line <= hit.line_no]
    if not before:
        return None
    return "serving" if before[-1] == "engine-ready" else before[-1]


def _context_before(data: Log, line: str, *, last: bool) -> list[str]:
    """Up to _CONTEXT_LINES lines above `line` in the log (its first or last occurrence)."""
    needle = line.encode(errors="replace")
    pos = data.rfind(needle) if last else data.find(needle)
    if pos < 0:
        return []
    start = pos
    for _ in range(_CONTEXT_LINES):
        nl = data.rfind(b"\n", 0, max(start - 1, 0))
        if nl < 0:
            start = 0
            break
        start = nl + 1
    chunk = bytes(data[start:pos])
    lines: list[str] = []
    for raw in chunk.decode(errors="replace").splitlines():
        lines += [r.decode(errors="replace") for r in split_records(raw.encode(errors="replace"))]
    return lines


def _last_exception(data: Log, candidates: Sequence[LogMatch]) -> LastException | None:
    """The last raise line in the log: its type and message, its innermost frame, its process."""
    # The newest first; a log of millions of such lines is answered from its last few thousand.
    for m in sorted(candidates, key=lambda m: m.line_no, reverse=True)[:5000]:
        records = split_records(m.line.encode(errors="replace"))
        for index in range(len(records) - 1, -1, -1):
            cleaned = clean_line(records[index].decode(errors="replace"))
            found = _EXCEPTION.match(message_of(cleaned.text).strip())
            if not found:
                continue
            above = [r.decode(errors="replace") for r in records[:index]]
            frames = [f for f in (_frame(line) for line in [*_context_before(data, m.line, last=True), *above]) if f]
            frame = frames[-1] if frames else None
            package_frame = next((f for f in reversed(frames) if f.package in SERVING_PACKAGES), None)
            return LastException(
                type=found.group("type"),
                message=(found.group("message") or "").strip()[:500],
                line_no=m.line_no,
                process=cleaned.process or _process(m.line),
                frame=frame,
                package_frame=package_frame if package_frame != frame else None,
            )
    return None


def _frame(line: str) -> Frame | None:
    m = _FRAME.search(line)
    if not m:
        return None
    path = m.group("file")
    package = None
    site = re.search(r"(?:site|dist)-packages/([\w.]+)", path)
    if site:
        package = site.group(1).split(".")[0]
    else:
        parts = [p for p in re.split(r"[/\\]", path) if p]
        package = next((p for p in reversed(parts[:-1]) if p in SERVING_PACKAGES or p in ("torch", "triton")), None)
    return Frame(file=path, line=int(m.group("line")), function=m.group("function"), package=package)


def _exception_text(e: LastException) -> str:
    where = f" at {e.frame.file}:{e.frame.line} in {e.frame.function}" if e.frame else ""
    return f"{e.type}: {e.message}"[:300] + where


def _frame_json(f: Frame | None) -> dict[str, Any] | None:
    return None if f is None else {"file": f.file, "line": f.line, "function": f.function, "package": f.package}


def _exception_json(e: LastException) -> dict[str, Any]:
    return {
        "type": e.type,
        "message": e.message,
        "line": e.line_no,
        "process": e.process,
        "frame": _frame_json(e.frame),
        "package_frame": _frame_json(e.package_frame),
    }
