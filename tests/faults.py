"""Fault injection into a running server container: stop or kill its EngineCore process.

The API server and the engine are separate processes in vLLM V1; the engine's process title is
`VLLM::EngineCore`. Freezing it (SIGSTOP) is the "engine wedged, API alive" failure; killing it
(SIGKILL) is the "engine dead" one. The image has no `ps` or `kill`, so both go through the image's
own Python via `docker exec`. A test helper: used by the integration tests only.
"""

from __future__ import annotations

import signal

from pipeline.docker.client import Docker
from pipeline.errors import CheckFailed
from verify.serving import DRIVERS

__all__ = ["ENGINE_CORE_TITLE", "signal_engine_core"]

ENGINE_CORE_TITLE = DRIVERS["vllm"].engine_process  # the process that runs the model loop

_FIND_AND_SIGNAL = """
import os, sys
title, signo = sys.argv[1], int(sys.argv[2])
pids = []
for entry in os.listdir("/proc"):
    if not entry.isdigit():
        continue
    try:
        with open(f"/proc/{entry}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\\0", b" ").decode(errors="replace")
    except OSError:
        continue
    if cmdline.startswith(title):
        pids.append(int(entry))
for pid in pids:
    if signo:
        os.kill(pid, signo)
print(" ".join(map(str, pids)))
"""


def _run(docker: Docker, container: str, python: str, signo: int, title: str) -> list[int]:
    result = docker.exec(container, [python, "-c", _FIND_AND_SIGNAL, title, str(signo)])
    if result.returncode != 0:
        raise CheckFailed(f"cannot look for {title} in {container}: {result.stderr.strip()[-300:]}")
    return [int(p) for p in result.stdout.split()]


def signal_engine_core(
    docker: Docker,
    container: str,
    sig: signal.Signals,
    *,
    python: str = "python3",
    title: str = ENGINE_CORE_TITLE,
) -> list[int]:
    """Send `sig` to every engine process (`title`, vLLM's EngineCore by default; a driver's
    `engine_process`) in the container; the pids signalled (never empty)."""
    pids = _run(docker, container, python, int(sig), title)
    if not pids:
        raise CheckFailed(f"no {title} process in {container}")
    return pids
