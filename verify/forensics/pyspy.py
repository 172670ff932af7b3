"""py-spy for stall forensics: the static binary from its PyPI wheel, fetched once into the cache.

py-spy (https://github.com/benfred/py-spy) ships a static-pie x86-64 executable inside a manylinux
wheel (`py_spy-VERSION.data/scripts/py-spy`); it runs in any image. It is never installed into a
cell's image: the stall forensics mount it read-only into a sidecar container that shares the
server's PID namespace. Where it comes from, in order:

1. `STACKPROOF_PY_SPY`: a path to the binary or to the wheel (offline sites carry it);
2. the tool's cache (`<cache>/py-spy/VERSION/py-spy`), filled by an earlier fetch;
3. `pip download` of the pinned wheel (hash-checked) from the `pypi` entry of `STACKPROOF_MIRRORS`
   (a URL or a local wheel directory) or, without one, from pip's own configured index.

When none works the answer is a reason, never an exception: a missing debugger must not fail the
stage that wanted to use it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pipeline import cmd
from pipeline.cache import cache_dir, locked
from pipeline.errors import InfraError

__all__ = ["PY_SPY_VERSION", "PySpy", "find_py_spy"]

PY_SPY_VERSION = "0.4.3"
# sha256 of py_spy-0.4.3-py2.py3-none-manylinux1_x86_64.manylinux_2_5_x86_64.whl as PyPI serves it.
PY_SPY_WHEEL_SHA256 = "8a4277225f470d394a85cca0cdd944bef87f0097b6f20150a6dd3ac2e92806b8"
_MEMBER = f"py_spy-{PY_SPY_VERSION}.data/scripts/py-spy"
_PLATFORMS = ("manylinux_2_5_x86_64", "manylinux1_x86_64")


@dataclass(frozen=True, kw_only=True)
class PySpy:
    binary: Path | None
    origin: str  # where it came from, or why there is none

    @property
    def available(self) -> bool:
        return self.binary is not None


def find_py_spy(env: Mapping[str, str] | None = None, *, cache: Path | None = None) -> PySpy:
    env = os.environ if env is None else env
    explicit = env.get("STACKPROOF_PY_SPY")
    if explicit:
        return _from_path(Path(explicit), cache or cache_dir())
    target = (cache or cache_dir()) / "py-spy" / PY_SPY_VERSION / "py-spy"
    if target.is_file() and os.access(target, os.X_OK):
        return PySpy(binary=target, origin=f"cached {target}")
    try:
        with locked(target.parent):
            if not target.is_file():
                _fetch(target, _mirror(env))
    except (InfraError, OSError, zipfile.BadZipFile, ValueError) as exc:
        return PySpy(binary=None, origin=f"py-spy {PY_SPY_VERSION} unavailable: {str(exc)[:400]}")
    return PySpy(binary=target, origin=f"fetched py-spy {PY_SPY_VERSION} into {target}")


def _from_path(path: Path, cache: Path) -> PySpy:
    if not path.is_file():
        return PySpy(binary=None, origin=f"STACKPROOF_PY_SPY={path}: no such file")
    if path.suffix != ".whl":
        return PySpy(binary=path, origin=f"STACKPROOF_PY_SPY={path}")
    target = cache / "py-spy" / "from-wheel" / hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16] / "py-spy"
    try:
        _extract(path, target)
    except (OSError, zipfile.BadZipFile, KeyError) as exc:
        return PySpy(binary=None, origin=f"STACKPROOF_PY_SPY={path}: not a py-spy wheel ({exc})")
    return PySpy(binary=target, origin=f"extracted from {path}")


def _mirror(env: Mapping[str, str]) -> list[str]:
    """pip arguments that point at the site's `pypi` mirror, if STACKPROOF_MIRRORS names one."""
    for entry in env.get("STACKPROOF_MIRRORS", "").split(","):
        name, _, location = entry.strip().partition("=")
        if name == "pypi" and location:
            if location.startswith(("http://", "https://")):
                return ["--index-url", location]
            return ["--no-index", "--find-links", location.removeprefix("file://")]
    return []


def _fetch(target: Path, index_args: list[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="stackproof-py-spy-") as tmp:
        argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", tmp]
        for platform in _PLATFORMS:
            argv += ["--platform", platform]
        argv += [*index_args, f"py-spy=={PY_SPY_VERSION}"]
        result = cmd.run(argv, check=False, quiet=True, timeout=180)
        wheels = sorted(Path(tmp).glob("py_spy-*.whl"))
        if result.returncode != 0 or not wheels:
            tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no wheel"]
            raise InfraError(f"pip download py-spy=={PY_SPY_VERSION} failed: {tail[0][:300]}")
        digest = hashlib.sha256(wheels[0].read_bytes()).hexdigest()
        if digest != PY_SPY_WHEEL_SHA256:
            raise ValueError(f"{wheels[0].name} has sha256 {digest}, not the pinned {PY_SPY_WHEEL_SHA256}")
        _extract(wheels[0], target)


def _extract(wheel: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        member = next((n for n in archive.namelist() if n.endswith(".data/scripts/py-spy")), _MEMBER)
        partial = target.with_suffix(f".{os.getpid()}.part")
        with archive.open(member) as source, partial.open("wb") as out:
            shutil.copyfileobj(source, out)
    partial.chmod(0o755)
    partial.replace(target)
