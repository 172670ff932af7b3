"""A site's compile/JIT cache for server starts: one directory per image, named to the engines.

A vLLM CPU start spends about 43 of its 47 s in torch.compile (inductor); a GPU start also JIT-builds
FlashInfer's kernels. Both are written to caches in the server's home, which dies with its container,
so every start pays them again. A site may give verifications a cache directory
(`STACKPROOF_COMPILE_CACHE=DIR`, or `--compile-cache DIR` on run and verify): each server then sees
the image's own slot of it at `CONTAINER_DIR`, with the engines' cache variables pointed into it.

Slots are per image id: two images never share compiled artifacts (a graph compiled by one torch
loaded into another). A host environment's slot is keyed by its interpreter and the versions of the
packages whose artifacts fill the slot (`COMPILED_PACKAGES`, `host_slot_key`): environments that
differ only elsewhere (the layers of one bisect over a base) share it, and a bump of one of those
packages gets a slot of its own. A warm slot (one that was not empty before the start) can hide a compile
failure of the image under test, so every use is recorded in the receipt with whether it was warm,
and tests that judge a cold start run without the cache.

The variables, each where the engine reads it (the pinned wheels):

- `VLLM_CACHE_ROOT`: vllm/envs.py:697-702 (0.28.0), :712-717 (0.32.0). vLLM's torch.compile cache
  lives under it, `<root>/torch_compile_cache/<hash>` (compilation/backends.py:1067-1069 at 0.28.0,
  :1074-1076 at 0.32.0), and vLLM points inductor and Triton into that folder itself
  (compilation/compiler_interface.py:475-480 at 0.28.0, :465-475 at 0.32.0). The root is a
  location only: it is left out of vLLM's compile hash (envs.py:2229 at 0.28.0, :2364 at 0.32.0),
  so a moved root still hits.
- `TORCHINDUCTOR_CACHE_DIR`: torch/_inductor/runtime/cache_dir_utils.py:15 (torch 2.13.0); for
  compiles outside vLLM's own (another engine, a probe).
- `TRITON_CACHE_DIR`: torch/_inductor/runtime/cache_dir_utils.py:38 (torch 2.13.0).
- `FLASHINFER_WORKSPACE_BASE`: flashinfer/jit/env.py:58-62 (0.6.16.post3 and 0.6.18.post1,
  byte-identical): FlashInfer's JIT workspace is `<base>/.cache/flashinfer/<version>/<arch>`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import InputError

__all__ = [
    "CACHE_VARIABLES",
    "CONTAINER_DIR",
    "ENV_NAME",
    "CacheUse",
    "CompileCache",
    "CompileCacheRecord",
    "compile_cache_from_env",
    "host_slot_key",
]

ENV_NAME = "STACKPROOF_COMPILE_CACHE"
OFF = ("", "none", "off", "0")
CONTAINER_DIR = "/stackproof/compile-cache"  # where the server sees its image's slot

# What writes the slot's contents, so what a host environment's slot is keyed by: torch and Triton
# (inductor's and Triton's caches), the engines (vLLM's torch.compile cache; SGLang's and its kernels'),
# FlashInfer (its JIT workspace, and the cubins and AOT kernels it loads in place of a JIT build).
COMPILED_PACKAGES = frozenset(
    {"torch", "triton", "vllm", "sglang", "sgl-kernel", "flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache"}
)

# Variable -> its folder in the slot (the citations are in the module's docstring).
CACHE_VARIABLES: tuple[tuple[str, str], ...] = (
    ("VLLM_CACHE_ROOT", "vllm"),
    ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
    ("TRITON_CACHE_DIR", "triton"),
    ("FLASHINFER_WORKSPACE_BASE", "flashinfer"),
)


@dataclass(frozen=True)
class CacheUse:
    """One server start's use of the cache: its slot, the key, and whether it was warm."""

    slot: Path  # on this host
    key: str
    warm: bool
    env: tuple[tuple[str, str], ...]  # the engines' variables, as the server sees the paths

    def to_json(self) -> dict[str, Any]:
        return {"used": True, "warm": self.warm, "key": self.key, "dir": str(self.slot)}


@dataclass(frozen=True)
class CompileCache:
    """The site's cache root: one slot per image key under it."""

    root: Path

    def slot(self, image_key: str) -> tuple[Path, str]:
        """The slot of an image (its id, `sha256:...`, or another stable name) and the key used."""
        key = re.sub(r"[^A-Za-z0-9_.-]+", "-", image_key).strip("-.")[:160] or "unnamed"
        return self.root / key, key

    def use(self, image_key: str) -> CacheUse:
        """Make the image's slot (world-writable: the server may run as another user than this
        process) and say whether it held anything before this start."""
        slot, key = self.slot(image_key)
        warm = slot.is_dir() and any(slot.iterdir())
        try:
            for folder in (slot, *(slot / name for _, name in CACHE_VARIABLES)):
                _make_shared(folder)
        except OSError as exc:
            raise InputError(f"{ENV_NAME}: {slot}: cannot use it ({exc.strerror})") from None
        env = tuple((name, f"{CONTAINER_DIR}/{folder}") for name, folder in CACHE_VARIABLES)
        return CacheUse(slot=slot, key=key, warm=warm, env=env)


@dataclass(frozen=True, kw_only=True)
class CompileCacheRecord:
    """Whether this verification's servers used the site's compile/JIT cache (pipeline/matrix/compilecache.py),
    and whether it was warm: a warm cache can hide a compile failure of the image under test."""

    used: bool  # at least one server start used it
    warm: bool  # at least one start found its image's slot not empty
    # Warm is "the slot was filled", not "the engine used it": at least one warm start's engine said
    # it failed to load the slot's artifact and compiled again (that start's `reused` is false, its
    # `reload_failure` the log line; verify/stages/startup.py: warm_cache_not_reused).
    warm_not_reused: bool = False
    starts: tuple[dict[str, Any], ...] = ()  # per server start: server, used, warm, key, dir[, reused, reload_failure]

    @classmethod
    def of_starts(cls, starts: list[dict[str, Any]]) -> CompileCacheRecord | None:
        """From the runner's per-start records; None when no server started."""
        if not starts:
            return None
        used = any(bool(start.get("used")) for start in starts)
        not_reused = any(start.get("reused") is False for start in starts)
        warm = any(bool(start.get("warm")) for start in starts)
        return cls(used=used, warm=warm, warm_not_reused=not_reused, starts=tuple(starts))

    def to_json(self) -> dict[str, Any]:
        return {
            "used": self.used,
            "warm": self.warm,
            "warm_not_reused": self.warm_not_reused,
            "starts": list(self.starts),
        }


def _make_shared(folder: Path) -> None:
    """Make `folder` writable by every user (the server may run as another user than this process);
    one made by someone else is left as it is: only its owner may change its mode."""
    try:
        folder.mkdir(parents=True)
    except FileExistsError:
        return
    folder.chmod(0o777)


def host_slot_key(python_version: str, versions: Iterable[tuple[str, str]]) -> str | None:
    """The slot key of a host environment: its interpreter's version and its `COMPILED_PACKAGES`
    versions (readable, then a digest). None when the inventory names none of them (nothing to key by:
    the caller keys by the environment itself)."""
    pins = sorted((re.sub(r"[-_.]+", "-", name).lower(), version) for name, version in versions)
    compiled = [(name, version) for name, version in pins if name in COMPILED_PACKAGES]
    if not compiled:
        return None
    digest = hashlib.sha256(json.dumps([python_version, compiled]).encode()).hexdigest()[:12]
    named = "-".join(f"{name}-{version}" for name, version in compiled if name in ("vllm", "sglang", "torch"))
    return f"host-py{python_version}-{named}-{digest}" if named else f"host-py{python_version}-{digest}"


def compile_cache_from_env(env: Mapping[str, str]) -> CompileCache | None:
    """`STACKPROOF_COMPILE_CACHE`: a directory (made when missing), or unset/`none` for no cache."""
    text = env.get(ENV_NAME, "").strip()
    if text.lower() in OFF:
        return None
    root = Path(text).expanduser()
    if not root.is_absolute():
        raise InputError(f"{ENV_NAME}: {text!r} is not an absolute path")
    if root.exists() and not root.is_dir():
        raise InputError(f"{ENV_NAME}: {text}: not a directory")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{ENV_NAME}: {text}: cannot make it ({exc.strerror})") from None
    return CompileCache(root=root)
