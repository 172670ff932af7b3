"""A fake OpenAI-compatible model server for the fake-backed unit tests (not an integration test).

It speaks a serving driver's dialect (default vLLM's): the driver's paths and metric names, its
dead-engine marker. A stdlib `ThreadingHTTPServer` on 127.0.0.1 (a free port), one thread per
connection, HTTP/1.0 (each response ends by closing the connection, so streams need no chunked
encoding). It answers what `verify.load.run.run_load` asks: the models, health and metrics paths
(Prometheus text whose counters move as it serves), the chat path (SSE, as vLLM streams it, with a
usage block) and the completions path (greedy tokens as `token_id:N` with top-2 logprobs). `hang=True` makes
every chat stream stop after its first content chunk while the rest keeps answering with frozen
counters: the wedged-engine picture of vllm-project/vllm#61007; `dead=True` answers 503 as a server
whose EngineCore died does.
"""

from __future__ import annotations

import json
import threading
import zlib
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from verify.serving import DRIVERS, ServingDriver

MODEL = "fake/tiny-model"
PROCESS_START = 1.7e9


@dataclass
class Counters:
    generated: int = 0  # the driver's generated-token counter
    prompt: int = 0
    steps: int = 0  # engine steps, where the driver has such a counter
    step_tokens: int = 0
    running: int = 0


@dataclass
class FakeServer:
    driver: ServingDriver = field(default_factory=lambda: DRIVERS["vllm"])
    hang: bool = False  # chat streams go silent after their first content chunk
    chunk_delay_s: float = 0.002  # between streamed chunks
    dead: bool = False  # the engine died: chat and completions answer 503 and /health 503, /metrics still 200
    # How a dead engine answers a request (vLLM 0.33+: 500 and a body naming no engine) and /health
    # (200 here: a plain server error, not a death); the engine dies after this many chat requests.
    dead_status: int = 503
    dead_message: str | None = None  # None: the driver's first two dead markers
    dead_health: int = 503
    dies_after: int | None = None
    counters: Counters = field(default_factory=Counters)
    chat_requests: list[dict[str, Any]] = field(default_factory=list)
    completion_requests: list[dict[str, Any]] = field(default_factory=list)
    # What the answers say (the degeneration and canary tests): chat stream pieces, cycled (None:
    # "w0 ", "w1 ", ...); sent as reasoning_content instead of content; finish with "stop" after
    # this many tokens (None: "length" at max_tokens); the top-1/top-2 gap of every greedy token;
    # non-streamed chat answers by the user's prompt (default: "I do not know").
    pieces: tuple[str, ...] | None = None
    reasoning: bool = False
    stop_after: int | None = None
    gap_nats: float = 2.45
    answers: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    release: threading.Event = field(default_factory=threading.Event)  # frees hung streams at shutdown

    def __post_init__(self) -> None:
        fake = self

        class Handler(_Handler):
            server_fake = fake

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._server.handle_error = lambda request, client_address: None  # type: ignore[method-assign]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.release.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what the endpoints serve --------------------------------------------------------------------

    def metrics(self) -> str:
        with self.lock:
            c = Counters(**vars(self.counters))
        names = self.driver.metric_names(None)
        labels = f'{{engine="0",model_name="{MODEL}"}}'
        text = (
            "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n"
            "# TYPE process_start_time_seconds gauge\n"
            f"process_start_time_seconds {PROCESS_START}\n"
        )
        for name, kind, value in (
            (names.running, "gauge", c.running),
            (names.waiting, "gauge", 0),
            (names.prompt, "counter", c.prompt),
            (names.generated, "counter", c.generated),
        ):
            family = name.removesuffix("_total") if kind == "counter" else name
            text += f"# TYPE {family} {kind}\n{name}{labels} {float(value)}\n"
        if names.steps:  # a histogram: _count is engine steps, _sum the tokens they carried
            family = names.steps.removesuffix("_count")
            text += (
                f"# TYPE {family} histogram\n"
                f'{family}_bucket{{engine="0",le="+Inf",model_name="{MODEL}"}} {float(c.steps)}\n'
                f"{family}_count{labels} {float(c.steps)}\n"
                f"{family}_sum{labels} {float(c.step_tokens)}\n"
            )
        return text

    def count(self, *, prompt: int = 0, generated: int = 0) -> None:
        """One engine step that prefilled `prompt` and generated `generated` tokens."""
        with self.lock:
            self.counters.prompt += prompt
            self.counters.generated += generated
            self.counters.steps += 1
            self.counters.step_tokens += prompt + generated


def prompt_tokens(text: str) -> int:
    return len(text.split())


def greedy_tokens(prompt: str, n: int) -> list[str]:
    """Deterministic 'greedy' token ids for a prompt, as `return_tokens_as_token_ids` spells them."""
    seed = zlib.crc32(prompt.encode())
    return [f"token_id:{(seed + 7 * i) % 32000}" for i in range(n)]


class _Handler(BaseHTTPRequestHandler):
    server_fake: FakeServer
    protocol_version = "HTTP/1.0"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: no access log on stderr
        pass

    def _json(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _text(self, status: int, text: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        fake = self.server_fake
        paths = fake.driver.endpoints
        if self.path == paths.models:
            self._json(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        elif self.path == paths.health:
            self._text(fake.dead_health if fake.dead else 200, "")
        elif self.path == paths.metrics:
            self._text(200, fake.metrics())
        else:
            self._json(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        fake = self.server_fake
        paths = fake.driver.endpoints
        if fake.dies_after is not None and self.path == paths.chat:
            with fake.lock:
                fake.dead = fake.dead or len(fake.chat_requests) >= fake.dies_after
        if fake.dead:
            message = fake.dead_message or ": ".join(fake.driver.dead_markers[:2])
            self._json(fake.dead_status, {"object": "error", "message": message})
        elif self.path == paths.chat:
            self._chat(body)
        elif self.path == paths.completions:
            self._completion(body)
        else:
            self._json(404, {"error": {"message": f"no route {self.path}"}})

    def _completion(self, body: dict[str, Any]) -> None:
        fake = self.server_fake
        with fake.lock:
            fake.completion_requests.append(body)
        n = int(body["max_tokens"])
        tokens = greedy_tokens(body["prompt"], n)
        p = prompt_tokens(body["prompt"])
        fake.count(prompt=p, generated=n)
        top = [{tok: -0.05, f"token_id:{i}": -0.05 - fake.gap_nats} for i, tok in enumerate(tokens)]
        self._json(
            200,
            {
                "id": "cmpl-1",
                "object": "text_completion",
                "model": MODEL,
                "choices": [
                    {
                        "index": 0,
                        "text": "".join(t[-2:] for t in tokens),
                        "logprobs": {"tokens": tokens, "token_logprobs": [-0.05] * n, "top_logprobs": top},
                        "finish_reason": "length",
                    }
                ],
                "usage": {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n},
            },
        )

    def _chat(self, body: dict[str, Any]) -> None:
        fake = self.server_fake
        if not body.get("stream"):
            self._chat_answer(body)
            return
        with fake.lock:
            fake.chat_requests.append(body)
            fake.counters.running += 1
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            n = int(body["max_tokens"])
            if fake.stop_after is not None and not body.get("ignore_eos"):
                n = min(n, fake.stop_after)
            finish = "length" if n == int(body["max_tokens"]) else "stop"
            p = sum(prompt_tokens(m["content"]) for m in body["messages"])
            self._event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
            key = "reasoning_content" if fake.reasoning else "content"
            for i in range(n):
                fake.count(prompt=p if i == 0 else 0, generated=1)
                piece = fake.pieces[i % len(fake.pieces)] if fake.pieces else f"w{i} "
                self._event({"choices": [{"index": 0, "delta": {key: piece}, "finish_reason": None}]})
                if fake.hang:
                    fake.release.wait(timeout=60)  # silent: the engine no longer steps
                    return
                fake.release.wait(timeout=fake.chunk_delay_s)
            self._event({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
            self._event({"choices": [], "usage": {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n}})
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except OSError:
            pass  # the client went away (a cancelled request)
        finally:
            with fake.lock:
                fake.counters.running -= 1

    def _chat_answer(self, body: dict[str, Any]) -> None:
        """A non-streamed chat completion (the canaries): the answer the test set for the prompt."""
        prompt = body["messages"][-1]["content"]
        content = self.server_fake.answers.get(prompt, "I do not know")
        choice = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        self._json(200, {"id": "chatcmpl-2", "object": "chat.completion", "model": MODEL, "choices": [choice]})

    def _event(self, payload: dict[str, Any]) -> None:
        data = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": MODEL, **payload}
        self.wfile.write(f"data: {json.dumps(data)}\n\n".encode())
        self.wfile.flush()


FakeVllm = FakeServer  # the vLLM dialect, the default
