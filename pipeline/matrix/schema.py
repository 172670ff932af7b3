"""The matrix schema: the keys each mapping allows, the shapes of its values, the limits, and the
inheritance merge (`defaults`, then each `extends` ancestor, then the cell).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import re
from typing import Any

from pipeline.matrix.model import Base, Cell, LoadSpec, lineage
from pipeline.matrix.yamlsrc import Path_

SCHEMA_VERSION = 1
KNOWN_ARCHES = ("none", "sm80", "sm86", "sm89", "sm90", "sm100", "sm103", "sm110", "sm120", "sm121")
PLATFORMS = ("linux/amd64", "linux/arm64")
TOP_KEYS = ("schema_version", "indexes", "bases", "defaults", "cells")
CELL_KEYS = (
    "id",
    "extends",
    "description",
    "base",
    "platform",
    "arch",
    "runner",
    "system_packages",
    "install",
    "overrides",
    "uninstall",
    "recipes",
    "env",
    "serve",
    "arms",
    "expect",
    "imports",
    "accepted_conflicts",
    "log_rules",
    "autotune",
    "runtime",
    "given",
    "host",
)
AUTOTUNE_ENTRIES = ("expected", "none")
RUNTIMES = ("docker", "host")  # verify/runtime/: an image's container, or a process group on the host
INHERITABLE_KEYS = tuple(k for k in CELL_KEYS if k not in ("id", "extends"))
REQUIRED_CELL_KEYS = ("base", "platform", "arch")
PACKAGE_KEYS = ("version", "index")
INSTALL_KEYS = ("requirements", "lock", "python_version", "python_platform")
SERVE_KEYS = ("engine", "model", "args", "env", "readiness_timeout", "shm_size", "gpus", "load", "forensics")
FORENSICS_KEYS = ("cuda_coredump",)
# serve.load keys: the LoadSpec field, with `_s` dropped from durations; `determinism` is a sub-mapping.
LOAD_KEYS = (
    *tuple(f.name.removesuffix("_s") for f in dataclasses.fields(LoadSpec) if not f.name.startswith("determinism_")),
    "determinism",
)
DETERMINISM_KEYS = ("prompts", "repeats", "max_tokens")
MODEL_KEYS = ("source", "revision")
ARM_KEYS = ("description", "env", "args", "log_rules")
EXPECT_KEYS = ("outcome", "stage", "reason", "match", "may_not_reproduce")
EXPECT_REQUIRED = ("outcome", "stage", "reason", "match")
INDEX_KEYS = ("url",)
REGISTRY_BASE_KEYS = ("image", "digest", "python", "require_cuda", "platforms")
BOOTSTRAP_KEYS = ("suite", "variant", "include", "venv")
ARCHIVE_BASE_KEYS = ("archive", "sha256", "format", "python", "env")
TOOL_OWNED_ARGS = ("--host", "--port")  # the tool binds the server to 127.0.0.1 on a port it picks

_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}$")  # a path component and a tag repository: short, no `/`
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PACKAGE = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.IGNORECASE)
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
_IMAGE = re.compile(r"^[a-z0-9][a-z0-9._/:-]*:[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
_MODEL = re.compile(r"^(hf:[\w.-]+/[\w.-]+|path:/\S+)$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
# Strings that reach a Dockerfile `RUN` line or a file name: strict, then quoted when rendered too.
_DEB_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.-]{0,99}(=[A-Za-z0-9.+~:-]{1,100})?$")
_ABS_PATH = re.compile(r"^(/[A-Za-z0-9._+-]+)+$")
_PYTHON = re.compile(r"^[A-Za-z0-9._+-]+$|^(/[A-Za-z0-9._+-]+)+$")
_SUITE = re.compile(r"^[a-z][a-z0-9-]{0,31}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# Upper bounds: a typo or a hostile file must not buy unbounded memory or time (issue 16).
MAX_CONCURRENCY = 4096
MAX_COUNT = 1_000_000  # questions, tokens, errors, prompts, repeats
MAX_SECONDS = 7 * 24 * 3600.0
MAX_CHAIN = 32  # extends ancestors, and cells stacked on cells as bases


def _merge(layers: list[tuple[Path_, Any]]) -> tuple[dict[str, Any], dict[Path_, Path_]]:
    """Apply the inheritance rule; return the merged mapping and where each path came from."""
    merged: dict[str, Any] = {}
    origins: dict[Path_, Path_] = {}

    def record(rel: Path_, where: Path_, value: Any) -> None:
        origins[rel] = where
        if isinstance(value, dict):
            for k, v in value.items():
                record((*rel, k), (*where, k), v)
        elif isinstance(value, list):
            for j, v in enumerate(value):
                record((*rel, j), (*where, j), v)

    def merge_into(target: dict[str, Any], rel: Path_, layer: dict[str, Any], where: Path_) -> None:
        for key, value in layer.items():
            r, w = (*rel, key), (*where, key)
            if value is None:
                target.pop(key, None)
                for stale in [o for o in origins if o[: len(r)] == r]:
                    del origins[stale]
            elif isinstance(value, dict) and isinstance(target.get(key), dict):
                origins[r] = w
                merge_into(target[key], r, value, w)
            else:
                for stale in [o for o in origins if o[: len(r)] == r]:
                    del origins[stale]
                target[key] = _without_nulls(value)
                record(r, w, target[key])

    for where, layer in layers:
        if isinstance(layer, dict):
            merge_into(merged, (), layer, where)
    return merged, origins


def _inherit_accepted_conflicts(cells: list[Cell], bases: tuple[Base, ...]) -> tuple[Cell, ...]:
    """A cell built on another cell's image stands on that stack, so it accepts what that cell
    accepted (its own entries win). Resolved here, once, so checks see the whole list."""
    by_id = {c.id: c for c in cells}
    resolved = []
    for cell in cells:
        chain = lineage(cell, by_id)
        if len(chain) > 1:
            merged: dict[str, str] = {}
            for layer in reversed(chain):  # the root first: each cell's entries win over those below
                merged.update(layer.accepted_conflicts)
            cell = dataclasses.replace(cell, accepted_conflicts=tuple(sorted(merged.items())))
        resolved.append(cell)
    return tuple(resolved)


def _without_nulls(value: Any) -> Any:
    """A copy of `value` where `null` mapping entries are dropped: null always means "remove"."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return copy.deepcopy(value)


def _finite_in(value: Any, low: float, high: float, *, zero_ok: bool = False) -> bool:
    """A real number (not a boolean, NaN or infinity) in (low, high], or [low, high] with zero_ok."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if not math.isfinite(value):
        return False
    return (low <= value if zero_ok else low < value) and value <= high


def _shown(value: Any) -> str:
    """A value for a message, short (a 50 MB scalar must not become a 50 MB message)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _did_you_mean(word: str, choices: tuple[str, ...] | list[str]) -> str:
    matches = difflib.get_close_matches(word, list(choices), n=1)
    return f", did you mean {matches[0]!r}?" if matches else ""


def _kind(value: Any) -> str:
    names: dict[type, str] = {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), type(value).__name__)
