"""The serving engine behind one seam: a table of drivers, chosen by a cell's `serve.engine`.

A check asks `driver_for(cell.serve)` and reads what it needs from the `ServingDriver` it gets
(verify/serving/driver.py); it never imports a driver's module (`lint-imports` holds that). Adding
an engine is one module with one `ServingDriver`, a rule set in verify/logs/logrules.yaml, and its name
in `pipeline.matrix.model.SERVING_ENGINES` (the matrix loader validates `serve.engine` against that list,
and tests/unit/test_serving.py holds the two equal).
"""

from __future__ import annotations

from pipeline.matrix.model import DEFAULT_ENGINE, ServeSpec
from verify.serving.driver import AutotuneFacts, Endpoints, MetricNames, ServingDriver, Since, at_version
from verify.serving.sglang import SGLANG
from verify.serving.vllm import VLLM

__all__ = [
    "DEFAULT",
    "DRIVERS",
    "AutotuneFacts",
    "Endpoints",
    "MetricNames",
    "ServingDriver",
    "Since",
    "at_version",
    "autotune_file_patterns",
    "driver_for",
    "driver_named",
]

DRIVERS: dict[str, ServingDriver] = {driver.name: driver for driver in (VLLM, SGLANG)}
DEFAULT = DRIVERS[DEFAULT_ENGINE]  # the engine a cell names when it names none


def driver_named(name: str) -> ServingDriver:
    """The driver for an engine name; the matrix loader has already rejected unknown names."""
    try:
        return DRIVERS[name]
    except KeyError:
        raise LookupError(f"no serving-engine driver {name!r} (known: {', '.join(sorted(DRIVERS))})") from None


def driver_for(serve: ServeSpec | None) -> ServingDriver:
    """The driver of a cell's serve spec (vLLM when the cell serves nothing or names no engine)."""
    return driver_named(serve.engine) if serve is not None else DEFAULT


def autotune_file_patterns() -> tuple[str, ...]:
    """The cache-file globs of every engine release known here (`AutotuneFacts.files`), in order:
    what a directory a user names may hold (`stackproof inspect autotune DIR`)."""
    patterns = (p for driver in DRIVERS.values() for since in driver.autotune for p in since.value.files)
    return tuple(dict.fromkeys(patterns))
