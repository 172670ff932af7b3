"""Test-only planted regression: vLLM's engine step sleeps DELAY_S before each step.

Packaged by tests/integration/test_bisect.py as the wheel `stackproof-planted` in versions 1.0 to
8.0, with this file's DELAY_S set per version (0 before 5.0, a fixed delay from 5.0 on), and a
.pth file that imports it in every Python process of the server. As the stall recipe
(tests/recipes/stall) does, it wraps `EngineCoreProc._process_engine_step` when
`vllm.v1.engine.core` is imported: in vLLM 0.28.0 (vllm/v1/engine/core.py:1432, "Called only when
there are unfinished local requests") that method runs one `self.step_fn()` per busy-loop turn,
so every engine step of a loaded server pays the delay, and nothing else does.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import time
from types import ModuleType
from typing import Any

DELAY_S = 0.0  # rewritten per version when the test builds the wheel
TARGET = "vllm.v1.engine.core"


def _patch(module: ModuleType) -> None:
    cls = module.EngineCoreProc
    original = cls._process_engine_step

    def _process_engine_step(self: Any) -> bool:
        if DELAY_S:
            time.sleep(DELAY_S)
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


sys.meta_path.insert(0, _PatchOnImport())
