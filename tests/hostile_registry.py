"""A hostile registry (issue 27, classes 3 and 4), one for both tiers: `handler` answers as an
`httpx.MockTransport` would (bodies are generators, read lazily as a socket's would be), and
`serve(handler)` puts the same handler behind a real HTTP server on 127.0.0.1 for the CLI.

What it does: a blob without end, a dribbling answer, a tag list without end (and honest answers
of the same shapes, for the other way); `challenging(realm)` wraps a handler so every /v2/ call
wants a Bearer token from `realm` (another origin: it must not get the user's Basic credentials).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

from pipeline.registry.oci import sha256_digest

GOOD_BLOB = b"x" * 1000
Handler = Callable[[httpx.Request], httpx.Response]


def endless() -> Iterator[bytes]:
    for _ in itertools.count():
        yield b"\0" * 65536


def dribble() -> Iterator[bytes]:
    for _ in itertools.count():
        time.sleep(0.1)
        yield b"{"


def handler(request: httpx.Request) -> httpx.Response:
    path = request.url.path
    if path.endswith(f"/blobs/{sha256_digest(GOOD_BLOB)}"):
        return httpx.Response(200, content=GOOD_BLOB)
    if "/blobs/" in path:
        return httpx.Response(200, content=endless())
    if path == "/v2/":
        return httpx.Response(200, json={})
    if path.endswith("/manifests/dribble-verified") or path == "/v2/dribble/tags/list":
        return httpx.Response(200, content=dribble())
    if path.endswith("/manifests/endless-verified"):
        return httpx.Response(
            200, headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"}, content=endless()
        )
    if path == "/v2/many/tags/list":
        return httpx.Response(200, json={"name": "many", "tags": [f"t{i}" for i in range(100_000)]})
    if path == "/v2/few/tags/list":
        return httpx.Response(200, json={"name": "few", "tags": ["a", "b"]})
    return httpx.Response(404, content=json.dumps({"errors": [{"code": "MANIFEST_UNKNOWN"}]}).encode())


def listing(count: int) -> Handler:
    """Every repository's tag list names `count` tags (none of which has a manifest)."""

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/tags/list"):
            return httpx.Response(200, json={"name": "stackproof", "tags": [f"t{i}" for i in range(count)]})
        return handler(request)

    return answer


def challenging(realm: str, inner: Handler = handler) -> Handler:
    """Every /v2/ call answers 401 with a Bearer challenge naming `realm` (and a token is never enough)."""

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.startswith("/v2/"):
            challenge = f'Bearer realm="{realm}",service="hostile",scope="repository:stackproof:pull"'
            return httpx.Response(401, headers={"WWW-Authenticate": challenge}, json={"errors": []})
        return inner(request)

    return answer


def token_service(request: httpx.Request) -> httpx.Response:
    """A token service that grants anything (what a realm on another origin would do with a password)."""
    return httpx.Response(200, json={"token": "hostile-token", "expires_in": 300})


@dataclass
class Served:
    address: str  # host:port
    seen: list[httpx.Request] = field(default_factory=list)  # every request, headers included

    @property
    def url(self) -> str:
        return f"http://{self.address}"


_HOP = {"content-length", "transfer-encoding", "connection", "content-encoding"}


@contextmanager
def serve(answer: Handler) -> Iterator[Served]:
    """`answer` behind a real HTTP/1.0 server on 127.0.0.1 (bodies streamed, then the connection
    closed); stopped, its threads done with, when the block ends."""
    served = Served(address="")

    class Adapter(BaseHTTPRequestHandler):
        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            url = f"http://{self.headers.get('Host', served.address)}{self.path}"
            request = httpx.Request(self.command, url, headers=dict(self.headers.items()), content=body)
            served.seen.append(request)
            response = answer(request)
            try:
                self.send_response(response.status_code)
                for key, value in response.headers.items():
                    if key.lower() not in _HOP:
                        self.send_header(key, value)
                self.end_headers()
                if self.command != "HEAD":
                    for chunk in response.stream:  # type: ignore[union-attr]
                        self.wfile.write(chunk)
                        self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up, as it should have

        do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _any

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Adapter)
    server.daemon_threads = True
    served.address = f"127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield served
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def in_front_of(upstream: str, *, endless_blobs: bool = True) -> Handler:
    """A proxy to the real registry at `upstream` (host:port) that answers every blob with bytes
    without end (`endless_blobs`), and everything else as the registry does."""

    def answer(request: httpx.Request) -> httpx.Response:
        if endless_blobs and request.method == "GET" and "/blobs/" in request.url.path:
            return httpx.Response(200, headers={"Content-Type": "application/octet-stream"}, content=endless())
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        url = f"http://{upstream}{request.url.raw_path.decode()}"
        with httpx.Client(timeout=30) as client:
            got = client.request(request.method, url, headers=headers, content=request.content)
        return httpx.Response(got.status_code, headers=got.headers, content=got.content)

    return answer
