"""Run many CLI cases in this one process, each under an alarm, and write what each did as JSON.

Started by tests/unit/test_fuzz.py in a child process with a memory cap (RLIMIT_AS), so a case that
would eat the host dies here instead. A hostile OpenAI-compatible server runs on 127.0.0.1 in a
thread: `http://127.0.0.1:{PORT}/MODE` answers according to MODE. Usage: fuzz_driver.py CASES OUT
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


class _Hang(Exception):
    pass


def _alarm(signum: int, frame: object) -> None:
    raise _Hang


_CHUNK = b'data: {"choices": [{"index": 0, "delta": {"content": "w "}, "finish_reason": null}]}\n\n'


_MILLION: list[bytes] = []


def million_series() -> list[bytes]:
    """A /metrics page of a million series (about 24 MB), in 100 pieces of 10,000 lines, made once."""
    if not _MILLION:
        for start in range(0, 1_000_000, 10_000):
            _MILLION.append(b"".join(b'vllm:x{i="%d"} 1\n' % i for i in range(start, start + 10_000)))
    return _MILLION


class Hostile(BaseHTTPRequestHandler):
    """Bad answers a server could give: HTML, the wrong JSON shapes, garbage streams, bad usage,
    answers without end (issue 27): a stream that ignores max_tokens (`forever`), one chunk a second
    for ever (`dribble`), a stream line that never ends (`long-line`), a /metrics page of a million
    series (`million-series`), a models answer and an error answer without end."""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        mode, _, rest = self.path.lstrip("/").partition("/")
        if mode == "v2":  # issue 43: a registry answering one byte a second, whatever is asked
            return self._endless(b"", b"{", 1.0)
        if mode == "status-500" and rest != "v1/models":  # an index mirror that cannot answer
            return self._send(500, b"oops", "text/plain")
        if rest == "v1/models":
            bodies = {
                "html": (200, b"<html><body>Welcome to nginx</body></html>", "text/html"),
                "data-string": (200, b'{"data": "x"}', "application/json"),
                "data-empty": (200, b'{"data": []}', "application/json"),
                "id-list": (200, b'{"data": [{"id": ["a"]}]}', "application/json"),
                "nested": (200, b"[" * 100_000 + b"]" * 100_000, "application/json"),
                "status-500": (500, b"oops", "text/plain"),
                "list": (200, b"[1, 2, 3]", "application/json"),
            }
            if mode == "endless-models":
                return self._endless(b'{"data": [{"id": "' + b"m" * 65536)
            status, body, kind = bodies.get(mode, (200, b'{"data": [{"id": "hostile/model"}]}', "application/json"))
            self._send(status, body, kind)
        elif rest == "metrics" and mode == "million-series":
            self._pieces(iter(million_series()))
        elif rest == "metrics":
            self._send(200, b"vllm:generation_tokens_total NaN\nnot a metric line {{{\n", "text/plain")
        else:
            self._send(404, b"{}")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        mode = self.path.lstrip("/").partition("/")[0]
        endless = {
            "forever": (b"", _CHUNK, 0.0),
            "dribble": (b"", _CHUNK, 0.5),
            "long-line": (b"data: ", b"x" * 65536, 0.0),
        }
        if mode in endless:
            return self._endless(*endless[mode], kind="text/event-stream")
        if mode == "endless-error":
            return self._endless(b"", b"e" * 65536, 0.0, status=500)
        events = {
            "bad-usage": [
                {"choices": [{"delta": {"content": "hi"}, "finish_reason": None}]},
                {"choices": [{"delta": {}, "finish_reason": "length"}], "usage": {"completion_tokens": "many"}},
            ],
            "garbage": ["not json at all"],
            "list-event": [[1, 2]],
            "huge-usage": [
                {
                    "choices": [{"delta": {"content": "x"}, "finish_reason": "length"}],
                    "usage": {"completion_tokens": 10**30},
                }
            ],
        }.get(mode, [{"choices": [{"delta": {"content": "ok"}, "finish_reason": "length"}]}])
        body = b"".join(
            b"data: " + (e.encode() if isinstance(e, str) else json.dumps(e).encode()) + b"\n\n" for e in events
        )
        self._send(200, body + b"data: [DONE]\n\n", "text/event-stream")

    def _endless(
        self,
        head: bytes,
        piece: bytes = b"m" * 65536,
        pause: float = 0.0,
        *,
        status: int = 200,
        kind: str = "application/json",
    ) -> None:
        """An answer without end (HTTP/1.0, no length): `piece` after `piece` until the client hangs up."""
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.end_headers()
        try:
            self.wfile.write(head)
            while True:
                self.wfile.write(piece)
                self.wfile.flush()
                if pause:
                    time.sleep(pause)
        except OSError:
            return

    def _pieces(self, pieces: Iterator[bytes]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        with contextlib.suppress(OSError):
            for piece in pieces:
                self.wfile.write(piece)


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up mid-answer: the server's business, not the case's stderr


def main() -> int:
    cases = json.loads(Path(sys.argv[1]).read_text())
    server = QuietServer(("127.0.0.1", 0), Hostile)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    port = server.server_address[1]
    from stackproof.cli import main as cli

    signal.signal(signal.SIGALRM, _alarm)
    results = {}
    for case in cases:
        argv = [a.replace("{PORT}", str(port)) for a in case["argv"]]
        out, err = io.StringIO(), io.StringIO()
        started = time.monotonic()
        result: dict[str, Any] = {"code": None, "traceback": None, "hang": False}
        signal.alarm(int(case.get("timeout", 30)))
        env = {k: v.replace("{PORT}", str(port)) for k, v in case.get("env", {}).items()}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            stdin = io.TextIOWrapper(io.BytesIO(case.get("stdin", "").encode()))
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                old_stdin, sys.stdin = sys.stdin, stdin
                try:
                    result["code"] = cli(argv)
                finally:
                    sys.stdin = old_stdin
        except SystemExit as exc:  # argparse usage errors
            result["code"] = exc.code if isinstance(exc.code, int) else 2
        except _Hang:
            result["hang"] = True
        except BaseException:
            result["traceback"] = traceback.format_exc()[-4000:]
        finally:
            signal.alarm(0)
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        result.update(
            stdout=out.getvalue()[-20000:], stderr=err.getvalue()[-20000:], seconds=time.monotonic() - started
        )
        results[case["id"]] = result
    server.shutdown()
    Path(sys.argv[2]).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
