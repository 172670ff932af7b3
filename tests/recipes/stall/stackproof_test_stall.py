"""Test-only stall recipe: vLLM's engine step blocks while /tmp/stackproof-stall exists.

Installed into a test image derived from cpu-tiny (never into a cell's image) with a .pth file, so
it loads in every Python process of the server, and patches only the EngineCore: when
`vllm.v1.engine.core` is imported, `EngineCoreProc._process_engine_step` is wrapped. In vLLM
0.28.0 (vllm/v1/engine/core.py, `EngineCoreProc._process_engine_step`, "Called only when there
are unfinished local requests") that method runs one `self.step_fn()` per busy-loop turn, so with
requests in flight and the flag present the engine stops stepping while the API process, which
runs no engine step, keeps answering /health, /v1/models and /metrics: the ENGINE_STALL_API_ALIVE
shape, with no signal sent. The blocked frame is named `_stackproof_test_stall` so that a py-spy
dump of the EngineCore shows exactly where it is parked. Removing the flag lets the engine go on.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import time
from types import ModuleType
from typing import Any

FLAG = "/tmp/stackproof-stall"
TARGET = "vllm.v1.engine.core"


def _stackproof_test_stall() -> None:
    while os.path.exists(FLAG):
        time.sleep(0.05)


def _patch(module: ModuleType) -> None:
    cls = module.EngineCoreProc
    original = cls._process_engine_step

    def _process_engine_step(self: Any) -> bool:
        _stackproof_test_stall()
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
