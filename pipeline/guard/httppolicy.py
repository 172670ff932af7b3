"""One HTTP policy for every client the tool runs (issue 27): the registry, the hub listing, the
serving engine's API. A hostile or broken server can dribble an answer one byte a minute, send a
body without end, list a million items or name a token service on another host; each client here
goes through the same four rules:

- timeouts: connect, read (between bytes) and a total deadline for the whole answer;
- body caps, checked while reading (a 10 GB blob is refused after the cap, not after the read);
- item caps on listings (tags, referrers, hub files);
- same-origin credentials: a credential goes only to the origin it was given for.

Every refusal is an `InfraError` (exit 3): the server, not the user's input, is at fault.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx

from pipeline.errors import InfraError

__all__ = ["DEFAULT", "HttpPolicy", "bounded_lines", "cap_items", "fetch", "same_origin"]

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class HttpPolicy:
    connect_s: float = 10.0
    read_s: float = 60.0  # silence between two bytes
    total_s: float = 300.0  # one answer, first byte to last
    max_body: int = 64 * 2**20
    max_items: int = 10_000
    # Issue 43: an answer whose body arrives slower than this on average, once `rate_grace_s` passed
    # since its first byte, is given up on (0: no floor). A registry dribbling one byte a second
    # stays under the read timeout for ever and was given up on only at total_s (300 s).
    min_rate_bps: float = 0.0
    rate_grace_s: float = 20.0

    def timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self.read_s, connect=self.connect_s)


DEFAULT = HttpPolicy(min_rate_bps=1024.0)  # registries: manifests, tokens, blobs (never a token stream)


def fetch(
    client: httpx.Client,
    request: httpx.Request,
    *,
    policy: HttpPolicy = DEFAULT,
    what: str,
    follow_redirects: bool = False,
) -> httpx.Response:
    """Send `request` and read its body under the policy; the answer comes back fully read (its
    `content` is the capped body). Transport errors are the caller's (httpx.HTTPError)."""
    started = time.monotonic()
    response = client.send(request, stream=True, follow_redirects=follow_redirects)
    try:
        body = read_capped(response.iter_bytes(), policy=policy, what=what, started=started)
    finally:
        response.close()
    return httpx.Response(
        response.status_code, headers=response.headers, content=body, request=request, extensions=response.extensions
    )


def read_capped(chunks: Iterable[bytes], *, policy: HttpPolicy, what: str, started: float | None = None) -> bytes:
    """The chunks joined, refused past `max_body` bytes or `total_s` seconds (checked per chunk)."""
    started = time.monotonic() if started is None else started
    parts: list[bytes] = []
    size = 0
    first: float | None = None
    for chunk in chunks:
        now = time.monotonic()
        first = now if first is None else first
        size += len(chunk)
        if size > policy.max_body:
            raise InfraError(f"{what}: the answer is larger than {policy.max_body:,} bytes: refused while reading")
        if now - started > policy.total_s:
            raise InfraError(f"{what}: the answer took longer than {policy.total_s:g}s in all: given up")
        if policy.min_rate_bps and now - first > policy.rate_grace_s and size / (now - first) < policy.min_rate_bps:
            raise InfraError(
                f"{what}: the answer came at {size / (now - first):,.0f} bytes/s for {now - first:.0f}s, under "
                f"{policy.min_rate_bps:,.0f} bytes/s: given up (a server this slow is not answering)"
            )
        parts.append(chunk)
    return b"".join(parts)


def cap_items(items: Iterable[T], *, policy: HttpPolicy = DEFAULT, what: str) -> list[T]:
    """At most `max_items` of a listing a server sent; more is refused, never truncated silently."""
    out: list[T] = []
    for item in items:
        if len(out) >= policy.max_items:
            raise InfraError(f"{what}: lists more than {policy.max_items:,} items: refused (a listing this tool reads)")
        out.append(item)
    return out


def same_origin(a: str, b: str) -> bool:
    """Whether two URLs share scheme, host and port (the default port of the scheme when none)."""
    pa, pb = urlsplit(a), urlsplit(b)
    return (pa.scheme.lower(), (pa.hostname or "").lower(), _port(pa)) == (
        pb.scheme.lower(),
        (pb.hostname or "").lower(),
        _port(pb),
    )


def origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme.lower()}://{(parts.hostname or '').lower()}:{_port(parts)}"


def _port(parts: Any) -> int | None:
    try:
        port = parts.port
    except ValueError:
        return None
    return port if port is not None else {"http": 80, "https": 443}.get(parts.scheme.lower())


def bounded_lines(chunks: Iterable[bytes], *, max_line: int, what: str) -> Iterator[bytes]:
    """Lines of a byte stream, none longer than `max_line` (a line without end is refused, not buffered)."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        yield from lines
        if len(pending) > max_line:
            raise InfraError(f"{what}: a line longer than {max_line:,} bytes: refused while reading")
    if pending:
        yield pending
