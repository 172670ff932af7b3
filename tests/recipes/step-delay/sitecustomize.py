"""Test-only planted regression: every engine step of vLLM waits STACKPROOF_TEST_STEP_DELAY_MS first.

Put on a server's PYTHONPATH by a test's arm (never into a cell's environment), so that Python
imports it at start in every process of the server, and patches only the EngineCore: when
`vllm.v1.engine.core` is imported, `EngineCoreProc._process_engine_step` is wrapped. In vLLM 0.28.0
(vllm/v1/engine/core.py:1432, `EngineCoreProc._process_engine_step`, "Called only when there are
unfinished local requests") that method runs one `self.step_fn()` per busy-loop turn, so the delay
is paid once per engine step while requests are in flight and never while the server idles: a
fixed cost per step whose direction is certain (every token of every request waits for it),
whatever else the host's cores are doing. The stall recipe (tests/recipes/stall) wraps the same
method. The delay is a sleep, not a spin: it takes no CPU from the other side of an A/B.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import time
from types import ModuleType
from typing import Any

TARGET = "vllm.v1.engine.core"
DELAY_S = float(os.environ.get("STACKPROOF_TEST_STEP_DELAY_MS", "0")) / 1000.0


def _stackproof_test_step_delay() -> None:
    time.sleep(DELAY_S)


def _patch(module: ModuleType) -> None:
    cls = module.EngineCoreProc
    original = cls._process_engine_step

    def _process_engine_step(self: Any) -> bool:
        _stackproof_test_step_delay()
        return bool(original(self))

    cls._process_engine_step = _process_engine_step


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != TARGET:
            return None
        sys.meta_path.remove(self)  # find the real module the ordinary way, once
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        load = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            load(module)
            _patch(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if DELAY_S > 0:
    sys.meta_path.insert(0, _PatchOnImport())
