"""What each side's engine was given, read from its server log, and whether two sides are comparable.

An A/B whose sides differ 40-fold in KV cache is not an A/B. Two vLLM servers started at once on one
GPU size their KV caches from the free memory each sees while profiling, and each counts the other's
allocation as its own: on the H100 one pair came up with 26.47 GiB against 0.63 GiB (13.9 M against
330 k tokens), and `ab` judged them without a word (shared/reference/gpu-docker.md, section 4). The
commands read these facts from each server's log once both are ready and refuse a mismatch
(`mismatch`) before a slice is measured.

The lines, as vLLM writes them (the text is matched, not a line number):
- "Available KV cache memory: 41.59 GiB": the GPU worker's `determine_available_memory`,
  vllm/v1/worker/gpu_worker.py:560 at 0.26.0 (the H200 logs of tests/fixtures/h200-vllm-0.26.0/
  receipts/*/server.log), once per worker;
- "GPU KV cache size: 21,803,104 tokens": vllm/v1/core/kv_cache_utils.py:2177 at 0.26.0 (same logs),
  :1869 at 0.28.0, :2327 at 0.32.0 where it names the device ("CPU KV cache size" on CPU): the
  pattern of the log catalog's kv-profiling phase (verify/logs/failure_classes.yaml). A CPU engine
  writes only this one, so the token counts stand in for the memory there.
SGLang's KV lines are not read (its format was not checked at a pinned version): its sides compare
as "the logs do not say", which is not a refusal.

Pure: text in, facts out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = ["KV_TOLERANCE", "EngineFacts", "engine_facts", "mismatch"]

# The largest relative difference of KV cache memory that two sides may have and still be compared.
# Two lone starts of the same cell differ by well under 1% (allocator rounding); the concurrent-start
# failure above was 40-fold. A bump that changes the weights' size moves it on purpose:
# `ab --allow-kv-mismatch` says so.
KV_TOLERANCE = 0.10

_GIB = re.compile(r"Available KV cache memory: (-?[0-9.]+) GiB")
_TOKENS = re.compile(r"\b[A-Z]PU(?: \+ host)? KV cache size: ([0-9,]+) tokens")


@dataclass(frozen=True, kw_only=True)
class EngineFacts:
    """One side's engine as its log describes it (None: the log did not say)."""

    kv_cache_gib: float | None
    kv_cache_tokens: int | None
    started_order: int = 0  # 1: this side's server was started first
    start_s: float | None = None  # seconds from start to ready
    restarted: bool = False  # started again once the other side was ready (--restart-first)
    # Its last start's compile/JIT cache: "warm" (its slot held a start's artifacts), "cold", None (no cache).
    compile_cache: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "kv_cache_gib": self.kv_cache_gib,
            "kv_cache_tokens": self.kv_cache_tokens,
            "started_order": self.started_order,
            "start_s": self.start_s,
            "restarted": self.restarted,
            "compile_cache": self.compile_cache,
        }


def engine_facts(log_text: str, **extra: Any) -> EngineFacts:
    """The KV cache facts of a server log: the last value of each line (a restarted server's is the newest)."""
    gib = [float(m) for m in _GIB.findall(log_text)]
    tokens = [int(m.replace(",", "")) for m in _TOKENS.findall(log_text)]
    return EngineFacts(kv_cache_gib=gib[-1] if gib else None, kv_cache_tokens=tokens[-1] if tokens else None, **extra)


def mismatch(a: EngineFacts, b: EngineFacts, *, tolerance: float = KV_TOLERANCE) -> str | None:
    """Why the two sides are not comparable (None: they are, or their logs do not say)."""
    for side, facts in (("A", a), ("B", b)):
        if facts.kv_cache_gib is not None and facts.kv_cache_gib <= 0:
            return f"side {side}'s engine has {facts.kv_cache_gib:g} GiB for its KV cache: it cannot serve"
    pairs = (("KV cache memory", a.kv_cache_gib, b.kv_cache_gib, "GiB"),)
    if a.kv_cache_gib is None or b.kv_cache_gib is None:  # no memory line: the token counts stand in
        pairs = (("KV cache size", a.kv_cache_tokens, b.kv_cache_tokens, "tokens"),)
    for what, x, y, unit in pairs:
        if x is None or y is None or x <= 0 or y <= 0:
            continue
        ratio = max(x, y) / min(x, y)
        if ratio - 1 > tolerance:
            return (
                f"the sides' {what} differ {ratio:.2f}-fold (A {x:,} {unit}, B {y:,} {unit}; more than "
                f"{tolerance:.0%}): the servers did not get the same memory, so the A/B would measure that"
            )
    return None
