"""What a load run is given and what it returns: the target, the counters its workers share, the outcome."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from verify.load.determinism import Sample
from verify.load.progress import Progress
from verify.load.watchdog import Event
from verify.serving import DEFAULT, ServingDriver
from verify.serving.openai import RequestRecord

__all__ = ["Live", "LoadOutcome", "LoadTarget"]


@dataclass(frozen=True, kw_only=True)
class LoadTarget:
    """Where the load goes and what can be learnt about the server beyond HTTP."""

    base_url: str
    label: str  # cell (and arm) for progress lines
    driver: ServingDriver = DEFAULT  # whose endpoints, counters and dead markers (the default engine's)
    engine_version: str | None = None  # the engine's release, for facts that moved (None: the newest)
    batch_invariant: bool = False  # the server declares batch-invariant greedy answers (the driver's variable)
    gpu: bool = False  # NVML snapshots in evidence
    server_alive: Callable[[], str | None] | None = None  # None while alive, else what happened to it
    last_log_lines: Callable[[], list[str]] = list
    prior: tuple[int, int] = (0, 0)  # (questions, clean) from earlier slices of a soak, for the progress line
    on_stall: Callable[[float], dict[str, Any]] | None = None  # stall forensics (verify/forensics/stall.py)


@dataclass(kw_only=True)
class Live:
    """Counters shared by the workers, the watchdog and the progress line."""

    in_flight: int = 0
    questions_done: int = 0
    questions_clean: int = 0
    requests_failed: int = 0
    output_tokens: int = 0
    stop_reason: str | None = None


@dataclass(kw_only=True)
class LoadOutcome:
    config: dict[str, Any]
    model: str
    records: list[RequestRecord]
    questions: dict[str, bool | None]  # id -> clean (True), faulted (False), incomplete (None)
    events: list[Event]
    determinism_a: list[Sample]
    determinism_b: list[Sample]
    before: Progress | None
    after: Progress | None
    seconds: float
    stop_reason: str
    determinism_tokens: tuple[int, int] = (0, 0)  # (prompt, completion) tokens of phase B
    scrapes: int = 0
    crashed: str | None = None  # a worker's exception: the run proves nothing (ERROR, never "all answered")
    files: dict[str, str] = field(default_factory=dict)
    # The driver's names, for messages: its (generated, prompt) token counters and its batch-invariance variable.
    counters: tuple[str, str] = ("the generated-token counter", "the prompt-token counter")
    invariance_env: str | None = None
