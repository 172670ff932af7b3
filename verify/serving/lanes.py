"""The load's connection pools: its streams spread over several small ones instead of one large one.

httpcore's pool hands a connection to a request by scanning every connection and every queued request
(AsyncConnectionPool._assign_requests_to_connections, at each request's start and end), so one pool of
256 connections costs the load client a scan of 256 per request. Pools of at most LANE_CONNECTIONS keep
it short: client_ceiling.py measured 5% less CPU per token at concurrency 256 (benchmarks/gpu_ab/README.md).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

__all__ = ["LANE_CONNECTIONS", "Lanes", "lanes_for"]

LANE_CONNECTIONS = 32


def lanes_for(max_connections: int | None) -> tuple[int, int | None]:
    """(pools, connections per pool) for `max_connections` in all (None: one pool, httpx's default)."""
    if not max_connections:
        return 1, None
    count = -(-max_connections // LANE_CONNECTIONS)
    return count, -(-max_connections // count)


class Lanes:
    """`lanes_for(max_connections)` clients of one server; `take()` lends the one with the fewest streams in
    flight: while fewer streams than the lanes' connections are open, that lane has a free one, so no request
    waits for a connection while another lane has one spare. The one-off calls (models, metrics, the
    determinism completions sent during a load) take a lane too: a fixed one could be full of streams."""

    def __init__(self, clients: list[httpx.AsyncClient]) -> None:
        self.clients = clients
        self.in_flight = [0] * len(clients)

    @classmethod
    def of(cls, max_connections: int | None, **client: Any) -> Lanes:
        """The lanes for `max_connections` in all, each an `httpx.AsyncClient(**client)` of its share."""
        count, per_lane = lanes_for(max_connections)
        limits = (
            httpx.Limits(max_connections=per_lane, max_keepalive_connections=per_lane) if per_lane else httpx.Limits()
        )
        return cls([httpx.AsyncClient(limits=limits, **client) for _ in range(count)])

    @asynccontextmanager
    async def take(self) -> AsyncIterator[httpx.AsyncClient]:
        lane = self.in_flight.index(min(self.in_flight))
        self.in_flight[lane] += 1
        try:
            yield self.clients[lane]
        finally:
            self.in_flight[lane] -= 1

    async def aclose(self) -> None:
        for client in self.clients:
            await client.aclose()
