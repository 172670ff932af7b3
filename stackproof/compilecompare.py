"""`--compile-cache DIR` and `--compile-cache-compare` of run and verify.

The cache itself is a site setting read where a server starts (`STACKPROOF_COMPILE_CACHE`,
pipeline/matrix/compilecache.py); `--compile-cache` sets it for this command. The compare mode verifies
twice against one fresh, empty cache, so the first start is cold and the second warm, and reports
both startup times side by side: what a site gains from the cache, measured on its own machine.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pipeline.errors import InputError
from pipeline.matrix.compilecache import ENV_NAME, compile_cache_from_env
from pipeline.receipt import Receipt

__all__ = [
    "check_compile_cache",
    "command_compile_cache",
    "compared",
    "readiness_seconds",
    "side_by_side",
    "use_compile_cache",
]


def check_compile_cache(directory: Path | None) -> None:
    """`--compile-cache DIR` (or `none`) checked: a bad one is exit 2, before anything is built or run."""
    if directory is None:
        return
    try:
        compile_cache_from_env({ENV_NAME: str(directory)})
    except InputError as exc:
        raise InputError(f"--compile-cache: {exc}") from None


def use_compile_cache(directory: Path | None) -> None:
    """`--compile-cache DIR` (or `none`): this command's servers use it; a bad one is exit 2 now."""
    check_compile_cache(directory)
    if directory is not None:
        os.environ[ENV_NAME] = str(directory)


@contextlib.contextmanager
def command_compile_cache(directory: Path | None, *, out: Path, restarts: bool, command: str) -> Iterator[Path | None]:
    """`--compile-cache` of ab, bisect and sweep, for the command's life: DIR (or `none`) as for run and
    verify; with neither it nor the site's setting, and a plan that restarts a side "on the caches the
    other warmed" (`restarts`), one cache for this command under `out`, removed at its end. Without a
    shared cache that restart warms nothing: each server has its own home (verify/runtime/host.py) or
    container, and every start pays the compile and JIT again (on the H100, vLLM 0.26.0's engine init
    took 113-117 s in each of an A/B's three host starts, 7 s of it torch.compile; 3.6 s warm in docker:
    tests/fixtures/gpu-ab-interrupted/README.md). Yields the command's own cache, if any."""
    before = os.environ.get(ENV_NAME)
    own: Path | None = None
    try:
        if directory is not None:
            use_compile_cache(directory)
        elif restarts and compile_cache_from_env(os.environ) is None:
            out.mkdir(parents=True, exist_ok=True)
            own = Path(tempfile.mkdtemp(prefix="compile-cache-", dir=out))
            os.environ[ENV_NAME] = str(own)
            print(f"{command}: compile/JIT cache for this run: {own} (removed after; --compile-cache DIR keeps one)",
                  file=sys.stderr)  # fmt: skip
        yield own
    finally:
        if before is None:
            os.environ.pop(ENV_NAME, None)
        else:
            os.environ[ENV_NAME] = before
        if own is not None:
            shutil.rmtree(own, ignore_errors=True)


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
