"""One streamed chat completion against fake servers: the metrics it times and the way it classifies failure.

Two fakes, both in-process: `SseApp`, a raw ASGI app behind `httpx.ASGITransport` (which delivers the
whole body at once, so it serves content, not timing), and `ScriptedTransport`, an httpx transport whose
body is a script of byte chunks, pauses and exceptions (so a stream can go silent after a chunk).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, MutableMapping
from typing import Any

import httpx
import pytest

from verify.serving import DRIVERS
from verify.serving.lanes import LANE_CONNECTIONS, lanes_for
from verify.serving.openai import ErrorClass, RequestRecord, ServerAPI, Timeouts, stream_chat

MESSAGES = [{"role": "user", "content": "Why is the sky blue?"}]
GENEROUS = Timeouts(ttft=5.0, chunk=5.0)


def sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n".encode()


def delta(content: str | None = None, finish: str | None = None, **extra: str) -> bytes:
    d: dict[str, str] = {**extra} if content is None else {"content": content, **extra}
    return sse({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": d, "finish_reason": finish}]})


ROLE = delta("", role="assistant")
USAGE = sse({"object": "chat.completion.chunk", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 5}})
DONE = sse("[DONE]")
GOOD = [
    ROLE,
    b": keep-alive comment\n\n",
    delta("Hel"),
    delta("lo"),
    delta(" world"),
    delta(finish="stop"),
    USAGE,
    DONE,
]


class SseApp:
    """A raw ASGI app answering every request with `status` and `body` chunks; keeps the JSON bodies it got."""

    def __init__(self, chunks: list[bytes], status: int = 200, content_type: bytes = b"text/event-stream") -> None:
        self.chunks, self.status, self.content_type = chunks, status, content_type
        self.requests: list[tuple[str, str, dict[str, Any]]] = []

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
        send: Callable[[MutableMapping[str, Any]], Awaitable[None]],
    ) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.requests.append((scope["method"], scope["path"], json.loads(body)))
        await send(
            {"type": "http.response.start", "status": self.status, "headers": [(b"content-type", self.content_type)]}
        )
        for chunk in self.chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


Step = bytes | float | Exception  # a chunk to send, seconds of silence, or an error raised mid-body


class ScriptedBody(httpx.AsyncByteStream):
    def __init__(self, steps: list[Step]) -> None:
        self.steps = steps

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for step in self.steps:
            if isinstance(step, Exception):
                raise step
            if isinstance(step, float):
                await asyncio.sleep(step)
            else:
                yield step


class ScriptedTransport(httpx.AsyncBaseTransport):
    """Headers at once, then the body as scripted: chunks really arrive over time."""

    def __init__(self, steps: list[Step], status: int = 200) -> None:
        self.steps, self.status = steps, status

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            self.status, headers={"content-type": "text/event-stream"}, stream=ScriptedBody(self.steps)
        )


class Refusing(httpx.AsyncBaseTransport):
    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        raise self.exc


class TickClock:
    """Each call is 10 ms later than the one before: timings become exact."""

    def __init__(self) -> None:
        self.now = -0.01

    def __call__(self) -> float:
        self.now += 0.01
        return round(self.now, 6)


def run(coro: Coroutine[Any, Any, RequestRecord]) -> RequestRecord:
    return asyncio.run(coro)


async def chat(
    transport: httpx.AsyncBaseTransport,
    *,
    timeouts: Timeouts = GENEROUS,
    clock: Callable[[], float] = time.monotonic,
    ignore_eos: bool = False,
    chunks_seen: list[float] | None = None,
) -> RequestRecord:
    record = RequestRecord(question_id="q1", turn=0)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        return await stream_chat(
            client,
            dead_markers=DRIVERS["vllm"].dead_markers,
            model="m",
            messages=MESSAGES,
            max_tokens=8,
            ignore_eos=ignore_eos,
            timeouts=timeouts,
            record=record,
            clock=clock,
            on_chunk=(lambda: chunks_seen.append(time.monotonic())) if chunks_seen is not None else (lambda: None),
        )


# -- a good stream --------------------------------------------------------------------------------------


def test_good_stream_is_ok_and_timed_like_vllm_bench_serve() -> None:
    app, seen = SseApp(GOOD), list[float]()
    record = run(chat(httpx.ASGITransport(app=app), clock=TickClock(), chunks_seen=seen))
    assert record.ok, record.error
    assert (record.status_code, record.finish_reason, record.text) == (200, "stop", "Hello world")
    assert record.chunks == 3 and len(seen) == 3  # the role chunk carries no output; on_chunk per content chunk
    assert (record.prompt_tokens, record.output_tokens) == (7, 5)  # the usage block, not the chunk count
    # clock calls: start 0.00, chunks at 0.01/0.02/0.03, end 0.04
    assert record.start == 0.0
    assert record.ttft == pytest.approx(0.01)
    assert record.itl == pytest.approx([0.01, 0.01])
    assert record.e2el == pytest.approx(0.04)
    assert record.tpot == pytest.approx((0.04 - 0.01) / (5 - 1))


def test_request_body_asks_for_a_greedy_stream_with_usage() -> None:
    app = SseApp(GOOD)
    run(chat(httpx.ASGITransport(app=app), ignore_eos=True))
    run(chat(httpx.ASGITransport(app=app), ignore_eos=False))
    (method, path, body), (_, _, plain) = app.requests
    assert (method, path) == ("POST", "/v1/chat/completions")
    assert body == {
        "model": "m",
        "messages": MESSAGES,
        "max_tokens": 8,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    assert "ignore_eos" not in plain


def test_without_usage_the_chunk_count_stands_in_for_output_tokens() -> None:
    app = SseApp([ROLE, delta("a"), delta("b", finish="length"), DONE])
    record = run(chat(httpx.ASGITransport(app=app), clock=TickClock()))
    assert record.ok and record.finish_reason == "length"
    assert (record.output_tokens, record.prompt_tokens) == (2, None)
    assert record.tpot == pytest.approx((0.03 - 0.01) / 1)


def test_reasoning_content_counts_as_output() -> None:
    app = SseApp([ROLE, delta(None, reasoning_content="hmm"), delta("yes"), delta(finish="stop"), DONE])
    record = run(chat(httpx.ASGITransport(app=app)))
    assert record.ok and record.chunks == 2 and record.text == "hmmyes"


def test_record_to_json_has_tpot_and_rounded_itl() -> None:
    record = RequestRecord(question_id="q", turn=1, ttft=0.5, itl=[0.1234567891], e2el=1.5, output_tokens=3)
    data = record.to_json()
    assert data["tpot"] == pytest.approx(0.5) and data["itl"] == [0.123457]
    assert json.loads(json.dumps(data))["question_id"] == "q"
    failed = RequestRecord(question_id="q", turn=0, error_class=ErrorClass.CHUNK_TIMEOUT)
    assert json.loads(json.dumps(failed.to_json()))["error_class"] == "chunk_timeout"
    assert failed.tpot is None and not failed.ok


# -- timeouts: every wait is bounded ----------------------------------------------------------------------


def test_a_stream_silent_after_its_first_chunk_ends_at_the_chunk_timeout() -> None:
    transport = ScriptedTransport([ROLE, delta("Hel"), 30.0, delta("lo"), DONE])
    started = time.monotonic()
    record = run(chat(transport, timeouts=Timeouts(ttft=5.0, chunk=0.2)))
    elapsed = time.monotonic() - started
    assert record.error_class is ErrorClass.CHUNK_TIMEOUT
    assert record.chunks == 1 and record.ttft is not None
    assert "after 1 chunks" in (record.error or "")
    assert 0.2 <= elapsed < 2.0
    assert record.e2el is not None and 0.2 <= record.e2el < 2.0


def test_no_first_chunk_is_a_ttft_timeout() -> None:
    transport = ScriptedTransport([30.0, delta("late"), DONE])
    started = time.monotonic()
    record = run(chat(transport, timeouts=Timeouts(ttft=0.2, chunk=5.0)))
    assert record.error_class is ErrorClass.TTFT_TIMEOUT
    assert record.chunks == 0 and record.ttft is None
    assert 0.2 <= time.monotonic() - started < 2.0


def test_a_role_chunk_is_not_a_first_token_so_the_ttft_bound_still_applies() -> None:
    """The role chunk carries no output: silence after it is measured against ttft, not the (shorter) chunk bound."""
    transport = ScriptedTransport([ROLE, 30.0, DONE])
    started = time.monotonic()
    record = run(chat(transport, timeouts=Timeouts(ttft=0.4, chunk=0.05)))
    assert record.error_class is ErrorClass.TTFT_TIMEOUT
    assert 0.4 <= time.monotonic() - started < 2.0


def test_timed_stream_measures_real_gaps() -> None:
    transport = ScriptedTransport([ROLE, 0.1, delta("a"), 0.05, delta("b"), delta(finish="stop"), USAGE, DONE])
    record = run(chat(transport))
    assert record.ok
    assert record.ttft is not None and 0.1 <= record.ttft < 1.0
    assert len(record.itl) == 1 and 0.05 <= record.itl[0] < 1.0
    assert record.e2el is not None and record.e2el >= record.ttft + record.itl[0]


# -- how a stream ends badly --------------------------------------------------------------------------------


def test_stream_ending_without_done_is_truncated() -> None:
    app = SseApp([ROLE, delta("a"), delta("b")])
    record = run(chat(httpx.ASGITransport(app=app)))
    assert record.error_class is ErrorClass.STREAM_TRUNCATED
    assert record.error == "the stream ended without [DONE] after 2 chunks"
    assert record.output_tokens == 2 and record.e2el is not None


def test_done_without_a_finish_reason_is_truncated() -> None:
    app = SseApp([ROLE, delta("a"), USAGE, DONE])
    record = run(chat(httpx.ASGITransport(app=app)))
    assert record.error_class is ErrorClass.STREAM_TRUNCATED
    assert record.error == "the stream ended without a finish reason after 1 chunks"


def test_the_server_hanging_up_mid_stream_is_truncated() -> None:
    transport = ScriptedTransport([ROLE, delta("a"), httpx.RemoteProtocolError("peer closed connection")])
    record = run(chat(transport))
    assert record.error_class is ErrorClass.STREAM_TRUNCATED
    assert (record.error or "").startswith("RemoteProtocolError: ")


def test_unreadable_stream_data_is_truncated() -> None:
    app = SseApp([ROLE, b"data: {not json\n\n"])
    record = run(chat(httpx.ASGITransport(app=app)))
    assert record.error_class is ErrorClass.STREAM_TRUNCATED
    assert (record.error or "").startswith("unreadable stream data: ")


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (503, b'{"object": "error", "message": "Service Unavailable"}', ErrorClass.ENGINE_DEAD),
        (400, b'{"object": "error", "message": "max_tokens is too large"}', ErrorClass.HTTP_4XX),
        (429, b"too many requests", ErrorClass.HTTP_4XX),
        (500, b'{"object": "error", "message": "Internal Server Error"}', ErrorClass.HTTP_5XX),
        (500, b'{"message": "EngineDeadError: EngineCore encountered an issue"}', ErrorClass.ENGINE_DEAD),
    ],
)
def test_http_errors_are_classified(status: int, body: bytes, expected: ErrorClass) -> None:
    app = SseApp([body], status=status, content_type=b"application/json")
    record = run(chat(httpx.ASGITransport(app=app)))
    assert record.error_class is expected
    assert record.status_code == status
    assert record.error == f"HTTP {status}: {body.decode()}"
    assert record.chunks == 0 and record.e2el is not None


def test_an_engine_dead_error_in_the_stream_is_engine_dead() -> None:
    error = {"error": {"message": "EngineDeadError: EngineCore encountered an issue.", "type": "InternalServerError"}}
    app = SseApp([ROLE, delta("a"), sse(error), DONE])
    record = run(chat(httpx.ASGITransport(app=app)))
    assert record.error_class is ErrorClass.ENGINE_DEAD
    assert record.error == "error in stream: EngineDeadError: EngineCore encountered an issue."


def test_another_error_object_in_the_stream_is_a_server_error() -> None:
    app = SseApp([ROLE, sse({"object": "error", "message": "CUDA out of memory", "code": 500}), DONE])
    record = run(chat(httpx.ASGITransport(app=app)))
    assert record.error_class is ErrorClass.HTTP_5XX
    assert "CUDA out of memory" in (record.error or "")


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (httpx.ConnectError("[Errno 111] Connection refused"), ErrorClass.CONNECT),
        (httpx.ConnectTimeout("timed out"), ErrorClass.CONNECT),
        (httpx.PoolTimeout("no free connection"), ErrorClass.CONNECT),
        (httpx.ReadTimeout("read timed out"), ErrorClass.CHUNK_TIMEOUT),
    ],
)
def test_transport_failures_are_classified(exc: Exception, expected: ErrorClass) -> None:
    record = run(chat(Refusing(exc)))
    assert record.error_class is expected
    assert record.status_code is None and record.e2el is not None
    assert str(exc) in (record.error or "")


def test_cancellation_marks_the_request_aborted_and_propagates() -> None:
    record = RequestRecord(question_id="q1", turn=0)

    async def main() -> None:
        async with httpx.AsyncClient(transport=ScriptedTransport([ROLE, delta("a"), 30.0]), base_url="http://t") as c:
            task = asyncio.create_task(
                stream_chat(
                    c,
                    model="m",
                    messages=MESSAGES,
                    max_tokens=8,
                    ignore_eos=False,
                    timeouts=GENEROUS,
                    record=record,
                    clock=time.monotonic,
                    on_chunk=lambda: None,
                )
            )
            while record.chunks == 0:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(main())
    assert record.error_class is ErrorClass.ABORTED
    assert record.chunks == 1 and record.e2el is not None


def test_lanes_hold_at_most_lane_connections_each_and_one_pool_below_it() -> None:
    assert lanes_for(None) == (1, None)
    assert lanes_for(8) == (1, 8) and lanes_for(LANE_CONNECTIONS) == (1, LANE_CONNECTIONS)
    assert lanes_for(LANE_CONNECTIONS + 1) == (2, 17)
    assert lanes_for(260) == (9, 29)
    for total in range(1, 600):
        count, per = lanes_for(total)
        assert per is not None and per <= LANE_CONNECTIONS and count * per >= total > (count - 1) * per


def test_the_load_spreads_its_streams_evenly_over_the_lanes_and_frees_them() -> None:
    """64 streams held open at once on a client of 68 connections: three lanes of 23, the streams 22,
    21, 21 (never more than a lane's connections); a completion sent meanwhile (the determinism check
    under load) takes the least busy lane too, not a fixed one that could be full; every one completed,
    nothing counted in flight after."""
    full, gate, arrived, seen = asyncio.Event(), asyncio.Event(), [0], []

    async def app(scope: MutableMapping[str, Any], receive: Callable[[], Awaitable[Any]], send: Any) -> None:
        await receive()
        if scope["path"] == "/v1/completions":
            seen.append(list(api.lanes.in_flight))
            await send(
                {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}
            )
            await send({"type": "http.response.body", "body": b'{"choices": []}', "more_body": False})
            return
        arrived[0] += 1
        if arrived[0] == 64:
            seen.append(list(api.lanes.in_flight))
            full.set()
        await gate.wait()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for chunk in GOOD:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def main() -> list[RequestRecord]:
        async with api:
            streams = asyncio.gather(*(
                api.stream_chat(model="m", messages=MESSAGES, max_tokens=8, ignore_eos=False, timeouts=GENEROUS,
                                record=RequestRecord(question_id=i, turn=0), clock=time.monotonic,
                                on_chunk=lambda: None)
                for i in range(64)
            ))  # fmt: skip
            await full.wait()
            answer = await api.complete({"model": "m", "prompt": "x"}, timeout=5)
            assert answer.status == 200, answer
            gate.set()
            return await streams

    api = ServerAPI("http://fake", DRIVERS["vllm"], max_connections=68, transport=httpx.ASGITransport(app=app))
    records = asyncio.run(main())
    assert len(api.lanes.clients) == 3 and seen == [[22, 21, 21], [22, 22, 21]]
    assert all(r.ok and r.text == "Hello world" for r in records) and api.lanes.in_flight == [0, 0, 0]
