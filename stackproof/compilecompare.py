"""`--compile-cache DIR` and `--compile-cache-compare` of run and verify.

The cache itself is a site setting read where a server starts (`STACKPROOF_COMPILE_CACHE`,
pipeline/matrix/compilecache.py); `--compile-cache` sets it for this command. The compare mode verifies
twice against one fresh, empty cache, so the first start is cold and the second warm, and reports
both startup times side by side: what a site gains from the cache, measured on its own machine.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.errors import InputError
from pipeline.matrix.compilecache import ENV_NAME, compile_cache_from_env
from pipeline.receipt import Receipt

__all__ = ["compared", "readiness_seconds", "side_by_side", "use_compile_cache"]


def use_compile_cache(directory: Path | None) -> None:
    """`--compile-cache DIR` (or `none`): this command's servers use it; a bad one is exit 2 now."""
    if directory is None:
        return
    text = str(directory)
    try:
        compile_cache_from_env({ENV_NAME: text})
    except InputError as exc:
        raise InputError(f"--compile-cache: {exc}") from None
    os.environ[ENV_NAME] = text


def readiness_seconds(receipt: Receipt) -> float | None:
    """Seconds from the startup server's start to its health answer (the startup stage's readiness)."""
    for stage in receipt.stages:
        for check in stage.checks:
            if stage.stage == "startup" and check.name == "readiness":
                seconds = check.evidence.get("seconds")
                return float(seconds) if isinstance(seconds, int | float) else None
    return None


def side_by_side(cold: Receipt, warm: Receipt) -> tuple[dict[str, Any], str]:
    """The two runs as one document and one line (pure)."""

    def one(receipt: Receipt) -> dict[str, Any]:
        cache = receipt.compile_cache
        return {
            "status": receipt.status,
            "readiness_seconds": readiness_seconds(receipt),
            "cache_warm": cache.warm if cache else None,
            # warm but not used: the engine said it failed to load the slot and compiled again
            "cache_warm_not_reused": cache.warm_not_reused if cache else None,
            "seconds": receipt.seconds,
        }

    a, b = one(cold), one(warm)
    document = {"cell": cold.cell, "cold": a, "warm": b}
    line = (
        f"{cold.cell}: startup cold {_s(a['readiness_seconds'])} (cache warm: {a['cache_warm']}), "
        f"warm {_s(b['readiness_seconds'])} (cache warm: {b['cache_warm']}"
        f"{', not reused: the engine compiled again' if b['cache_warm_not_reused'] else ''}); "
        f"runs {cold.status} {cold.seconds:.0f}s, {warm.status} {warm.seconds:.0f}s"
    )
    return document, line


def compared(verify: Callable[[], tuple[int, Receipt]]) -> tuple[int, dict[str, Any], str]:
    """Run `verify` twice against a fresh cache (under the site's, when it sets one); the worse exit
    code, the side-by-side document and line. The fresh cache is removed after."""
    site = compile_cache_from_env(os.environ)
    fresh = Path(tempfile.mkdtemp(prefix="compare-", dir=site.root if site else None))
    before = os.environ.get(ENV_NAME)
    os.environ[ENV_NAME] = str(fresh)
    try:
        first, cold = verify()
        second, warm = verify()
    finally:
        if before is None:
            os.environ.pop(ENV_NAME, None)
        else:
            os.environ[ENV_NAME] = before
        shutil.rmtree(fresh, ignore_errors=True)
    document, line = side_by_side(cold, warm)
    return max(first, second), document, line


def _s(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds:.1f}s"
