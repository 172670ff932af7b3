"""One streamed chat completion, timed and classified: the load stage's traffic to the model.

Every wait is bounded: the first chunk by `ttft_timeout`, each later one by `chunk_timeout`, so a
hung stream ends on its own and never blocks the run. Metric definitions follow `vllm bench serve`
(TTFT to the first chunk that carries output, ITL = gaps between chunks, TPOT = (E2EL - TTFT) /
(tokens - 1)); token counts come from the server's own usage block (`include_usage`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

import httpx

__all__ = ["ErrorClass", "RequestRecord", "Timeouts", "stream_chat"]


class ErrorClass(StrEnum):
    CONNECT = "connect"  # refused or no connection within the connect timeout
    HTTP_4XX = "http_4xx"
    HTTP_5XX = "http_5xx"
    TTFT_TIMEOUT = "ttft_timeout"  # no first chunk within ttft_timeout
    CHUNK_TIMEOUT = "chunk_timeout"  # the stream went silent for chunk_timeout
    STREAM_TRUNCATED = "stream_truncated"  # the stream ended without a finish reason or [DONE]
    ENGINE_DEAD = "engine_dead"  # HTTP 503 or an EngineDeadError in the stream
    ABORTED = "aborted"  # cancelled because the run ended (a stall verdict, the duration, Ctrl-C)


@dataclass(frozen=True, kw_only=True)
class Timeouts:
    connect: float = 5.0
    ttft: float = 120.0
    chunk: float = 30.0


@dataclass(kw_only=True)
class RequestRecord:
    """One request, as written to requests.jsonl. Times are seconds from the run's start."""

    question_id: str
    turn: int
    kind: str = "load"  # load | determinism
    start: float = 0.0
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    e2el: float | None = None
    prompt_tokens: int | None = None
    output_tokens: int = 0  # the server's usage count; the chunk count when usage never came
    chunks: int = 0
    finish_reason: str | None = None
    status_code: int | None = None
    error_class: ErrorClass | None = None
    error: str | None = None
    text: str = ""  # content and reasoning pieces, in arrival order
    reasoning: str = ""  # the reasoning pieces alone: an answer with no content has text == reasoning

    @property
    def ok(self) -> bool:
        return self.error_class is None

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.e2el is None or self.output_tokens < 2:
            return None
        return (self.e2el - self.ttft) / (self.output_tokens - 1)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["tpot"] = self.tpot
        data["itl"] = [round(x, 6) for x in self.itl]
        return data


_DEAD_MARKERS = ("EngineDeadError", "EngineCore encountered an issue", "engine is dead")


async def stream_chat(
    client: httpx.AsyncClient,
    *,
    model: str,
    messages: list[dict[str, str]],
    max_tokens: int,
    ignore_eos: bool,
    timeouts: Timeouts,
    record: RequestRecord,
    clock: Callable[[], float],
    on_chunk: Callable[[], None],
) -> RequestRecord:
    """Send one streamed chat completion and fill `record`; never raises for server trouble."""
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if ignore_eos:
        body["ignore_eos"] = True  # vLLM's extension: fixed output lengths
    record.start = started = clock()
    try:
        done = await _read_stream(client, body, timeouts, record, clock, on_chunk)
    except asyncio.CancelledError:
        record.error_class = ErrorClass.ABORTED
        record.error = "cancelled: the run ended while this request was in flight"
        raise
    except httpx.ConnectError as exc:
        record.error_class, record.error = ErrorClass.CONNECT, f"connect: {exc}"
        return record
    except httpx.TimeoutException as exc:  # connect/write/pool timeouts; reads are bounded in _read_stream
        cls = (
            ErrorClass.CONNECT
            if isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout)
            else ErrorClass.CHUNK_TIMEOUT
        )
        record.error_class, record.error = cls, f"{type(exc).__name__}: {exc}"
        return record
    except (httpx.TransportError, httpx.StreamError) as exc:  # the server hung up mid-stream
        record.error_class, record.error = ErrorClass.STREAM_TRUNCATED, f"{type(exc).__name__}: {exc}"
        return record
    except (ValueError, AttributeError, TypeError) as exc:  # JSONDecodeError is a ValueError
        record.error_class, record.error = ErrorClass.STREAM_TRUNCATED, f"unreadable stream data: {exc}"
        return record
    finally:
        record.e2el = clock() - started
    if done is None:  # the server said what went wrong: recorded already
        return record
    if record.output_tokens == 0:
        record.output_tokens = record.chunks
    if not done or record.finish_reason is None:
        record.error_class = ErrorClass.STREAM_TRUNCATED
        record.error = (
            f"the stream ended without {'[DONE]' if not done else 'a finish reason'} after {record.chunks} chunks"
        )
    return record


async def _read_stream(
    client: httpx.AsyncClient,
    body: dict[str, Any],
    timeouts: Timeouts,
    record: RequestRecord,
    clock: Callable[[], float],
    on_chunk: Callable[[], None],
) -> bool | None:
    """Read the SSE stream into `record`: True when it ended with [DONE], False when it just ended,
    None when the server answered an error (an HTTP status, an error payload, a silent stream)."""
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        record.status_code = response.status_code
        if response.status_code != 200:
            text = (await response.aread()).decode(errors="replace")[:500]
            record.error = f"HTTP {response.status_code}: {text}"
            record.error_class = _http_class(response.status_code, text)
            return None
        lines = response.aiter_lines()
        last = record.start
        while True:
            limit, on_timeout = (
                (timeouts.chunk, ErrorClass.CHUNK_TIMEOUT)
                if record.chunks
                else (timeouts.ttft, ErrorClass.TTFT_TIMEOUT)
            )
            try:
                async with asyncio.timeout(limit):  # no task per line, unlike wait_for
                    line = await anext(lines, None)
            except TimeoutError:
                record.error_class = on_timeout
                record.error = f"no stream data for {limit:g}s after {record.chunks} chunks"
                return None
            if line is None:
                return False
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return True
            took = _take_payload(json.loads(data), record, clock=clock, last=last, on_chunk=on_chunk)
            if took is None:
                return None
            last = took


def _take_payload(
    payload: Any, record: RequestRecord, *, clock: Callable[[], float], last: float, on_chunk: Callable[[], None]
) -> float | None:
    """One SSE payload into `record`: usage, text pieces and their timing, the finish reason. The
    time of the last chunk so far; None when the payload was an error (recorded)."""
    error = payload.get("error") or (payload if payload.get("object") == "error" else None)
    if error:
        message = str(error.get("message", error)) if isinstance(error, dict) else str(error)
        record.error = f"error in stream: {message[:500]}"
        dead = any(marker in message for marker in _DEAD_MARKERS)
        record.error_class = ErrorClass.ENGINE_DEAD if dead else ErrorClass.HTTP_5XX
        return None
    if usage := payload.get("usage"):
        record.prompt_tokens = usage.get("prompt_tokens")
        record.output_tokens = _count(usage.get("completion_tokens"))
    for choice in payload.get("choices") or ():
        delta = choice.get("delta") or {}
        content = delta.get("content") or ""
        piece = content or delta.get("reasoning_content") or ""
        if piece or (choice.get("finish_reason") and not record.chunks):
            now = clock()
            if record.chunks == 0:
                record.ttft = now - record.start
            else:
                record.itl.append(now - last)
            last = now
            record.chunks += 1
            record.text += piece
            if not content:
                record.reasoning += piece
            on_chunk()
        if choice.get("finish_reason"):
            record.finish_reason = choice["finish_reason"]
    return last


def _count(value: object) -> int:
    """A usage count from the server: a non-negative integer, else the stream is unreadable."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"usage count {str(value)[:40]!r} is not a non-negative integer")
    return value


def _http_class(status: int, text: str) -> ErrorClass:
    if status == 503 or any(marker in text for marker in _DEAD_MARKERS):
        return ErrorClass.ENGINE_DEAD
    return ErrorClass.HTTP_4XX if 400 <= status < 500 else ErrorClass.HTTP_5XX
