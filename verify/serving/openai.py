"""The one OpenAI-compatible HTTP client to a model server: what every check sends it.

`ServerAPI` (async: the load, the watchdog, determinism) and `ServerCalls` (blocking: readiness,
the one completion of the startup stage, the canaries) speak the paths a driver names
(`Endpoints`): health, models, completions with logprobs, streamed chat, the metrics scrape. Nothing
else under verify/ opens a connection to the server.

`stream_chat` is one streamed chat completion, timed and classified. Every wait is bounded: the
first chunk by `ttft_timeout`, each later one by `chunk_timeout`, so a hung stream ends on its
own and never blocks the run. Every answer is bounded too (issue 27): a stream ends as OVERRUN
past `max_tokens` + `CHUNK_SLACK` content chunks (each carries at least one token), past
`stream_cap(max_tokens)` bytes or at a line longer than `MAX_LINE`; every other body (models,
metrics, completions, an error answer) is read under a byte cap and a total deadline, so a server
that answers without end costs a bounded wait and bounded memory. Metric definitions follow vLLM's serving benchmark
(TTFT to the first chunk that carries output, ITL = gaps between chunks, TPOT = (E2EL - TTFT) /
(tokens - 1)); token counts come from the server's own usage block (`include_usage`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any

import httpx

from pipeline.errors import CheckFailed, InfraError
from pipeline.guard.httppolicy import HttpPolicy, fetch
from verify.serving.driver import Endpoints, ServingDriver
from verify.serving.lanes import Lanes

__all__ = [
    "Answer",
    "ErrorClass",
    "ModelNotNamed",
    "RequestRecord",
    "ServerAPI",
    "ServerCalls",
    "Status",
    "Timeouts",
    "stream_chat",
]


class ErrorClass(StrEnum):
    CONNECT = "connect"  # refused or no connection within the connect timeout
    HTTP_4XX = "http_4xx"
    HTTP_5XX = "http_5xx"
    TTFT_TIMEOUT = "ttft_timeout"  # no first chunk within ttft_timeout
    CHUNK_TIMEOUT = "chunk_timeout"  # the stream went silent for chunk_timeout
    STREAM_TRUNCATED = "stream_truncated"  # the stream ended without a finish reason or [DONE]
    ENGINE_DEAD = "engine_dead"  # HTTP 503 or a dead-engine marker of the driver in the stream
    ABORTED = "aborted"  # cancelled because the run ended (a stall verdict, the duration, Ctrl-C)
    OVERRUN = "overrun"  # the stream went past max_tokens or its byte cap: the server ignores the request's bound


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
        # The fields by hand, not dataclasses.asdict: asdict deep-copies every value (the itl list
        # included) and was the client's largest cost per request (benchmarks/client_ceiling.py).
        data = {f.name: getattr(self, f.name) for f in _RECORD_FIELDS}
        data["tpot"] = self.tpot
        data["itl"] = [round(x, 6) for x in self.itl]
        return data


_RECORD_FIELDS = fields(RequestRecord)


PROBE_TIMEOUT_S = 5.0
# Byte caps on what a server answers. A real vLLM /metrics page is tens of KB (about 600 lines for
# one model); 8 MiB and 100,000 lines leave room for many engines and adapters, and keep one scrape's
# parse (pure Python, in the event loop) well under a second.
MAX_METRICS_BYTES = 8 * 2**20
MAX_METRICS_LINES = 100_000
MAX_BODY_BYTES = 16 * 2**20  # a models list, one completion with logprobs
MAX_ERROR_BYTES = 64 * 2**10  # an error answer: 500 characters of it are kept
MAX_LINE = 2**20  # one SSE line: a chunk is a few hundred bytes
CHUNK_SLACK = 8  # content chunks past max_tokens before the stream is an overrun (role and finish chunks carry none)


def stream_cap(max_tokens: int) -> int:
    """Bytes one stream may carry: 4 KiB per allowed chunk (a chunk is a few hundred bytes) plus 64 KiB."""
    return 64 * 2**10 + (max_tokens + CHUNK_SLACK) * 4 * 2**10


class Overrun(Exception):
    """An answer past its cap: the server ignored the bound the request set."""


async def capped_body(response: httpx.Response, cap: int, what: str) -> bytes:
    """The body of a streamed response, refused (Overrun) past `cap` bytes, checked while reading."""
    parts, size = [], 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > cap:
            raise Overrun(f"{what}: the answer is larger than {cap:,} bytes: refused while reading")
        parts.append(chunk)
    return b"".join(parts)


async def _bounded_lines(response: httpx.Response, *, max_line: int, max_bytes: int) -> AsyncIterator[str]:
    """The lines of a streamed answer, none longer than `max_line`, `max_bytes` in all (Overrun past either)."""
    pending, size = b"", 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > max_bytes:
            raise Overrun(f"the stream carried more than {max_bytes:,} bytes")
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            # The blank line after every SSE event carries nothing: skipped here, not one more turn
            # of this generator and the reader's timeout per token.
            if line and line != b"\r":
                yield line.rstrip(b"\r").decode("utf-8", errors="replace")
        if len(pending) > max_line:
            raise Overrun(f"a stream line longer than {max_line:,} bytes")
    if pending:
        yield pending.decode("utf-8", errors="replace")


# Bodies that answer "which model": a bad one (HTML, {"data": "x"}) is the server's fault, not ours.
_UNREADABLE = (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError)


class ModelNotNamed(CheckFailed):
    """The models endpoint did not name a model."""


@dataclass(frozen=True, kw_only=True)
class Status:
    """Answers of health, models and metrics at one moment: an HTTP status, 0 = refused, None = timed out."""

    health: int | None
    models: int | None
    metrics: int | None


@dataclass(frozen=True, kw_only=True)
class Answer:
    """One non-streamed request: the HTTP status (None when no answer came), its JSON body, or why not."""

    status: int | None
    body: Any = None
    error: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None


def _model_of(base_url: str, path: str, body: Any) -> str:
    try:
        model = body["data"][0]["id"]
    except _UNREADABLE as exc:
        raise ModelNotNamed(f"{base_url}{path} did not name a model: {type(exc).__name__}: {exc}") from exc
    if not isinstance(model, str) or not model or len(model) > 1000:
        raise ModelNotNamed(f"{base_url}{path} did not name a model: id {str(model)[:80]!r}")
    return model


class ServerAPI:
    """The async client: its own connection pools per instance (the load's, the watchdog's); the
    load's streams are spread over pools of at most 32 connections (verify/serving/lanes.py)."""

    def __init__(
        self,
        base_url: str,
        driver: ServingDriver,
        *,
        timeout: float | httpx.Timeout = 10.0,
        max_connections: int | None = None,
        transport: httpx.AsyncBaseTransport | None = None,  # a stand-in server in unit tests
    ) -> None:
        self.base_url = base_url
        self.driver = driver
        self.paths: Endpoints = driver.endpoints
        # A plain-HTTP server needs no certificates: httpx would load the CA bundle for every client
        # (0.1-0.13 s of CPU each, two per load run, so two per A/B slice); https keeps verification.
        verify = not base_url.startswith("http://")
        # Every call, streamed or one-off, takes the least busy pool (lanes.py says why).
        self.lanes = Lanes.of(max_connections, base_url=base_url, timeout=timeout, transport=transport, verify=verify)

    async def __aenter__(self) -> ServerAPI:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.lanes.aclose()

    async def get_capped(self, path: str, *, cap: int, timeout: float) -> tuple[int, bytes]:
        """(status, body) of GET path, the body capped at `cap` bytes and the whole answer at `timeout`
        seconds (TimeoutError); httpx's own timeout bounds each read, not a dribble."""
        async with (
            asyncio.timeout(timeout),
            self.lanes.take() as client,
            client.stream("GET", path, timeout=timeout) as response,
        ):
            return response.status_code, await capped_body(response, cap, f"{self.base_url}{path}")

    async def model_id(self) -> str:
        """The first model the server lists; ModelNotNamed when it names none."""
        try:
            _, data = await self.get_capped(self.paths.models, cap=MAX_BODY_BYTES, timeout=10)
            body = json.loads(data)
        except (httpx.HTTPError, TimeoutError, Overrun, *_UNREADABLE) as exc:
            raise ModelNotNamed(
                f"{self.base_url}{self.paths.models} did not name a model: {type(exc).__name__}: {exc}"
            ) from exc
        return _model_of(self.base_url, self.paths.models, body)

    async def metrics_text(self) -> tuple[str | None, str | None]:
        """(the Prometheus exposition, None) or (None, why not): a failed scrape is unknown, never idle."""
        try:
            status, data = await self.get_capped(self.paths.metrics, cap=MAX_METRICS_BYTES, timeout=PROBE_TIMEOUT_S)
        except TimeoutError:
            return None, f"the /metrics answer took longer than {PROBE_TIMEOUT_S:g}s"
        except (httpx.HTTPError, Overrun) as exc:
            return None, f"{type(exc).__name__}: {exc}"
        if status != 200:
            return None, f"HTTP {status}"
        if (lines := data.count(b"\n")) > MAX_METRICS_LINES:
            return None, f"the /metrics answer has {lines:,} lines, more than {MAX_METRICS_LINES:,}: not parsed"
        return data.decode("utf-8", errors="replace"), None

    async def status(self, path: str) -> int | None:
        """The HTTP status of GET path: 0 when refused, None when it timed out."""
        try:  # the status line only: a body (a million-series /metrics, one without end) is never read
            async with (
                asyncio.timeout(PROBE_TIMEOUT_S),
                self.lanes.take() as client,
                client.stream("GET", path, timeout=PROBE_TIMEOUT_S) as response,
            ):
                return response.status_code
        except (httpx.TimeoutException, TimeoutError):
            return None
        except httpx.TransportError:
            return 0

    async def probe(self) -> Status:
        """Health, models and metrics at once."""
        paths = self.paths
        health, models, metrics = await asyncio.gather(
            self.status(paths.health), self.status(paths.models), self.status(paths.metrics)
        )
        return Status(health=health, models=models, metrics=metrics)

    async def complete(self, body: dict[str, Any], *, timeout: float) -> Answer:
        """One completion; never raises for server trouble."""
        try:
            async with (
                asyncio.timeout(timeout),
                self.lanes.take() as client,
                client.stream("POST", self.paths.completions, json=body, timeout=timeout) as response,
            ):
                data = await capped_body(response, MAX_BODY_BYTES, f"{self.base_url}{self.paths.completions}")
        except TimeoutError:
            return Answer(status=None, error=f"no whole answer within {timeout:g}s")
        except (httpx.HTTPError, Overrun) as exc:
            return Answer(status=None, error=f"{type(exc).__name__}: {exc}")
        return _answer(httpx.Response(response.status_code, content=data, headers=response.headers))

    async def stream_chat(self, **kwargs: Any) -> RequestRecord:
        """`stream_chat` on this server's chat path, with the driver's dead markers and extensions, on
        the least busy connection pool."""
        async with self.lanes.take() as client:
            return await stream_chat(
                client,
                path=self.paths.chat,
                dead_markers=self.driver.dead_markers,
                ignore_eos_field=self.driver.ignore_eos_field,
                **kwargs,
            )


class ServerCalls:
    """The blocking client, for readiness, the startup stage's one completion and the canaries."""

    def __init__(self, base_url: str, driver: ServingDriver, *, timeout: float = 120.0) -> None:
        self.base_url = base_url
        self.driver = driver
        self.paths = driver.endpoints
        self.client = httpx.Client(base_url=base_url, timeout=httpx.Timeout(timeout, connect=5.0))

    def __enter__(self) -> ServerCalls:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()

    def healthy(self) -> bool:
        """The health path answers 200 (False while it refuses, times out or answers otherwise)."""
        try:
            with self.client.stream("GET", self.paths.health, timeout=5.0) as response:  # the status, no body
                return response.status_code == 200
        except httpx.HTTPError:
            return False

    def _get(self, path: str, *, timeout: float, cap: int) -> httpx.Response:
        """GET path, its body read under the HTTP policy: `cap` bytes and `timeout` seconds in all."""
        policy = HttpPolicy(connect_s=5.0, read_s=timeout, total_s=timeout, max_body=cap)
        return fetch(self.client, self.client.build_request("GET", path), policy=policy, what=f"{self.base_url}{path}")

    def model_id(self) -> str:
        try:
            body = self._get(self.paths.models, timeout=10.0, cap=MAX_BODY_BYTES).json()
        except (httpx.HTTPError, InfraError, *_UNREADABLE) as exc:
            raise ModelNotNamed(
                f"{self.base_url}{self.paths.models} did not name a model: {type(exc).__name__}: {exc}"
            ) from exc
        return _model_of(self.base_url, self.paths.models, body)

    def complete(self, body: dict[str, Any]) -> Answer:
        return self._post(self.paths.completions, body)

    def chat(self, body: dict[str, Any]) -> Answer:
        return self._post(self.paths.chat, body)

    def _post(self, path: str, body: dict[str, Any]) -> Answer:
        started = time.monotonic()
        timeout = self.client.timeout.read or 120.0
        policy = HttpPolicy(connect_s=5.0, read_s=timeout, total_s=timeout, max_body=MAX_BODY_BYTES)
        try:
            request = self.client.build_request("POST", path, json=body)
            response = fetch(self.client, request, policy=policy, what=f"{self.base_url}{path}")
        except httpx.TimeoutException as exc:
            return Answer(status=None, error=f"timed out: {type(exc).__name__}: {exc}")
        except (httpx.HTTPError, InfraError) as exc:
            return Answer(status=None, error=f"{type(exc).__name__}: {exc}")
        return dataclasses.replace(_answer(response), seconds=round(time.monotonic() - started, 2))


def _answer(response: httpx.Response) -> Answer:
    if response.status_code != 200:
        return Answer(status=response.status_code, error=f"HTTP {response.status_code}: {response.text[:500]}")
    try:
        return Answer(status=200, body=response.json())
    except ValueError as exc:
        return Answer(status=200, error=f"not JSON: {exc}")


async def stream_chat(
    client: httpx.AsyncClient,
    *,
    path: str = "/v1/chat/completions",
    dead_markers: tuple[str, ...] = (),
    ignore_eos_field: str | None = "ignore_eos",
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
    if ignore_eos and ignore_eos_field:
        body[ignore_eos_field] = True  # the engine's extension: fixed output lengths
    record.start = started = clock()
    stream = _Stream(path=path, dead_markers=dead_markers, max_tokens=max_tokens)
    try:
        done = await _read_stream(client, stream, body, timeouts, record, clock, on_chunk)
    except asyncio.CancelledError:
        record.error_class = ErrorClass.ABORTED
        record.error = "cancelled: the run ended while this request was in flight"
        raise
    except httpx.ConnectError as exc:
        record.error_class, record.error = ErrorClass.CONNECT, f"connect: {exc}"
        return record
    except Overrun as exc:
        record.error_class, record.error = ErrorClass.OVERRUN, f"stream cut after {record.chunks} chunks: {exc}"
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


@dataclass(frozen=True, kw_only=True)
class _Stream:
    path: str
    dead_markers: tuple[str, ...]
    max_tokens: int


async def _read_stream(
    client: httpx.AsyncClient,
    stream: _Stream,
    body: dict[str, Any],
    timeouts: Timeouts,
    record: RequestRecord,
    clock: Callable[[], float],
    on_chunk: Callable[[], None],
) -> bool | None:
    """Read the SSE stream into `record`: True when it ended with [DONE], False when it just ended,
    None when the server answered an error (an HTTP status, an error payload, a silent stream)."""
    async with client.stream("POST", stream.path, json=body) as response:
        record.status_code = response.status_code
        if response.status_code != 200:
            try:
                text = (await capped_body(response, MAX_ERROR_BYTES, "the error answer")).decode(errors="replace")[:500]
            except Overrun:
                text = "(an error answer larger than 64 KiB, not read)"
            record.error = f"HTTP {response.status_code}: {text}"
            record.error_class = _http_class(response.status_code, text, stream.dead_markers)
            return None
        lines = _bounded_lines(response, max_line=MAX_LINE, max_bytes=stream_cap(stream.max_tokens))
        silence = _Silence(timeouts)
        try:
            async with asyncio.timeout(None) as bound:
                return await _read_lines(lines, stream, bound, silence, record, clock, on_chunk)
        except TimeoutError:
            record.error_class = ErrorClass.CHUNK_TIMEOUT if record.chunks else ErrorClass.TTFT_TIMEOUT
            record.error = f"no stream data for {silence.limit(record.chunks):g}s after {record.chunks} chunks"
            return None


async def _read_lines(
    lines: AsyncIterator[str],
    stream: _Stream,
    bound: asyncio.Timeout,
    silence: _Silence,
    record: RequestRecord,
    clock: Callable[[], float],
    on_chunk: Callable[[], None],
) -> bool | None:
    """The SSE lines into `record`, under `bound` (moved by `silence`): as `_read_stream` says."""
    last = record.start
    while True:
        silence.extend(bound, record.chunks)
        line = await anext(lines, None)
        if line is None:
            return False
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return True
        took = _take_payload(
            json.loads(data), record, clock=clock, last=last, on_chunk=on_chunk, dead_markers=stream.dead_markers
        )
        if took is None:
            return None
        last = took
        if record.chunks > stream.max_tokens + CHUNK_SLACK:
            raise Overrun(f"{record.chunks} content chunks for max_tokens {stream.max_tokens}: the server ignores it")


class _Silence:
    """The bound on a stream's silence (`ttft` before its first chunk, `chunk` after) as one timeout
    over the whole read, moved forward lazily. A new `asyncio.timeout` per line (as before), or a
    reschedule per line, cost a timer-heap push and a cancel per token: the client's largest cost per
    chunk after the JSON. Here the deadline moves to now + limit + slack only once less than `limit`
    is left (and at the first chunk, when the limit changes), so it is never earlier than `limit`
    after the last data and at most `slack` (5% of the limit, at most 1 s) later."""

    def __init__(self, timeouts: Timeouts) -> None:
        self.timeouts = timeouts
        self.loop = asyncio.get_running_loop()
        self.started = False  # the limit in force is `chunk` (a chunk has come)

    def limit(self, chunks: int) -> float:
        return self.timeouts.chunk if chunks else self.timeouts.ttft

    def extend(self, bound: asyncio.Timeout, chunks: int) -> None:
        limit, now = self.limit(chunks), self.loop.time()
        when = bound.when()
        if when is None or (chunks and not self.started) or when - now < limit:
            self.started = bool(chunks)
            bound.reschedule(now + limit + min(1.0, 0.05 * limit))


def _take_payload(
    payload: Any,
    record: RequestRecord,
    *,
    clock: Callable[[], float],
    last: float,
    on_chunk: Callable[[], None],
    dead_markers: tuple[str, ...],
) -> float | None:
    """One SSE payload into `record`: usage, text pieces and their timing, the finish reason. The
    time of the last chunk so far; None when the payload was an error (recorded)."""
    error = payload.get("error") or (payload if payload.get("object") == "error" else None)
    if error:
        message = str(error.get("message", error)) if isinstance(error, dict) else str(error)
        record.error = f"error in stream: {message[:500]}"
        dead = any(marker in message for marker in dead_markers)
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


def _http_class(status: int, text: str, dead_markers: tuple[str, ...]) -> ErrorClass:
    if status == 503 or any(marker in text for marker in dead_markers):
        return ErrorClass.ENGINE_DEAD
    return ErrorClass.HTTP_4XX if 400 <= status < 500 else ErrorClass.HTTP_5XX
