"""A stand-in for the model hub, on 127.0.0.1, for tests: the real hub is not reachable from here.

It answers only what `huggingface_hub.snapshot_download` (2.x) asks for a model at a commit hash:
the recursive file listing `GET /api/models/ORG/NAME/tree/REV`, and `HEAD`/`GET
/ORG/NAME/resolve/REV/FILE` with the headers the library reads (`X-Repo-Commit`, `ETag`,
`Content-Length`; byte ranges for resumed downloads). An unknown revision or repository gets the
404 and `X-Error-Code` the library maps to RevisionNotFoundError / RepositoryNotFoundError. So the
store under test is filled by the real library, in its real layout. Every request is recorded,
with the file bytes sent, so a test can prove a second fetch sent none.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar
from urllib.parse import unquote, urlsplit

__all__ = ["StandInHub", "stand_in_hub"]


@dataclass
class StandInHub:
    """One repository at one commit; `url` is what HF_ENDPOINT is set to."""

    repo_id: str
    revision: str
    files: dict[str, bytes]
    url: str = ""
    requests: list[tuple[str, str]] = field(default_factory=list)  # (method, path)
    file_bytes_sent: int = 0
    token_seen: list[str] = field(default_factory=list)  # Authorization headers, to prove the token reached it
    stall_once: str | None = None  # this file's first download sends half, then goes silent for stall_seconds
    stall_seconds: float = 3.0
    # Hostile answers (issue 27): another commit than the one asked for, bytes that are not the
    # file the listing and the ETag announce, a listing of `extra_listed` more files.
    answer_commit: str | None = None
    corrupt: frozenset[str] = frozenset()
    extra_listed: int = 0
    stall_listing: bool = False  # the listing answers only after stall_seconds
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def total_bytes(self) -> int:
        return sum(len(data) for data in self.files.values())


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@contextmanager
def stand_in_hub(repo_id: str, files: dict[str, bytes], revision: str | None = None) -> Iterator[StandInHub]:
    """Serve `files` as `repo_id` at `revision` (default: a commit-like hash of the files) until the block ends."""
    listing = json.dumps(sorted((name, git_blob_id(data)) for name, data in files.items()))
    revision = revision or hashlib.sha1(listing.encode()).hexdigest()
    hub = StandInHub(repo_id=repo_id, revision=revision, files=dict(files))
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    server.daemon_threads = True  # closing waits for no handler still stalling for a client that gave up
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    # shutdown() waits out one poll of serve_forever: 0.05 s, not its default 0.5 s, on every test's teardown
    poll = {"poll_interval": 0.05}
    thread = threading.Thread(target=server.serve_forever, kwargs=poll, name="stand-in-hub", daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class _HubHandler(BaseHTTPRequestHandler):
    """The stand-in hub's answer to one request; `_handler` binds the hub (a subclass per server)."""

    hub: ClassVar[StandInHub]
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # quiet: the test asserts on `requests`
        pass

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, *, body: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        with self.hub.lock:
            self.hub.requests.append((self.command, path))
            if self.headers.get("Authorization"):
                self.hub.token_seen.append(self.headers["Authorization"])
        tree = f"/api/models/{self.hub.repo_id}/tree/"
        resolve = f"/{self.hub.repo_id}/resolve/"
        if path.startswith(tree):
            self._tree(path[len(tree) :].split("/", 1)[0], body=body)
        elif path.startswith(resolve):
            revision, _, name = path[len(resolve) :].partition("/")
            self._file(revision, name, body=body)
        else:
            self._error(404, "RepoNotFound", "Repository not found")

    def _tree(self, revision: str, *, body: bool) -> None:
        if revision != self.hub.revision:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        if self.hub.stall_listing:
            time.sleep(self.hub.stall_seconds)
        listing = [
            {"type": "file", "path": name, "size": len(data), "oid": git_blob_id(data)}
            for name, data in sorted(self.hub.files.items())
        ]
        listing += [
            {"type": "file", "path": f"shard-{i:07d}.bin", "size": 1, "oid": git_blob_id(b"x")}
            for i in range(self.hub.extra_listed)
        ]
        self._send(200, json.dumps(listing).encode(), {"Content-Type": "application/json"}, body=body)

    def _file(self, revision: str, name: str, *, body: bool) -> None:
        if revision != self.hub.revision:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        if name not in self.hub.files:
            return self._error(404, "EntryNotFound", f"{name} does not exist")
        data = self.hub.files[name]
        etag = git_blob_id(data)
        if name in self.hub.corrupt:
            data = bytes([data[0] ^ 0xFF]) + data[1:]  # the announced file, one byte flipped
        headers = {
            "Content-Type": "application/octet-stream",
            "ETag": f'"{etag}"',
            "X-Repo-Commit": self.hub.answer_commit or self.hub.revision,
            "Accept-Ranges": "bytes",
        }
        status, start = 200, 0
        ranged = self.headers.get("Range", "")
        if ranged.startswith("bytes=") and body:  # a resumed download asks for the rest
            start = int(ranged[len("bytes=") :].split("-", 1)[0] or 0)
            status = 206
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        payload = data[start:]
        if body and self.hub.stall_once == name and start == 0:
            self.hub.stall_once = None
            return self._stall(payload, headers)
        if body:
            with self.hub.lock:
                self.hub.file_bytes_sent += len(payload)
        self._send(status, payload, headers, body=body)

    def _stall(self, payload: bytes, headers: dict[str, str]) -> None:
        """Announce the whole file, send half, then nothing: a stalled download the client must time out."""
        half = payload[: len(payload) // 2]
        with self.hub.lock:
            self.hub.file_bytes_sent += len(half)
        self.send_response(200)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(half)
        self.wfile.flush()
        time.sleep(self.hub.stall_seconds)
        self.close_connection = True

    def _error(self, status: int, code: str, message: str) -> None:
        payload = json.dumps({"error": message}).encode()
        headers = {"Content-Type": "application/json", "X-Error-Code": code, "X-Error-Message": message}
        self._send(status, payload, headers, body=self.command != "HEAD")

    def _send(self, status: int, payload: bytes, headers: dict[str, str], *, body: bool) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        # One request per connection: once the block ends, the stand-in hub is really gone.
        self.send_header("Connection", "close")
        self.close_connection = True
        self.end_headers()
        if body:
            self.wfile.write(payload)


def _handler(hub: StandInHub) -> type[BaseHTTPRequestHandler]:
    class Handler(_HubHandler):
        pass

    Handler.hub = hub
    return Handler
