"""Hash-locked stacks: resolve a cell's `install` once, install exactly that lock at build time.

A lock records, for every package, its name, version, sha256 hashes and the index it must come
from. It also records a digest of its inputs, so a cell edited after locking is refused with a
clear error instead of silently building something else.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name

from pipeline import cmd
from pipeline.errors import InfraError, InputError
from pipeline.guard.jsonfile import read_json
from pipeline.matrix.model import Cell, Install, Matrix
from pipeline.matrix.site import SiteSettings

__all__ = ["LOCK_SCHEMA_VERSION", "Lock", "LockedPackage", "inputs_digest", "read_lock", "resolve_lock", "write_lock"]

LOCK_SCHEMA_VERSION = 1
DEPENDENCY_INDEX = "pypi"  # packages the cell does not name come from here


@dataclass(frozen=True, kw_only=True)
class LockedPackage:
    name: str
    version: str
    index: str
    hashes: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Lock:
    cell: str
    inputs_digest: str
    packages: tuple[LockedPackage, ...]

    def get(self, name: str) -> LockedPackage | None:
        return next((p for p in self.packages if p.name == name), None)


def inputs_digest(install: Install) -> str:
    """What the lock was resolved from; any change makes the lock stale."""
    inputs = {
        "requirements": [[r.name, r.version, r.index] for r in install.requirements],
        "python_version": install.python_version,
        "python_platform": install.python_platform,
        "dependency_index": DEPENDENCY_INDEX,
    }
    return "sha256:" + hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def read_lock(cell: Cell) -> Lock:
    assert cell.install is not None
    path = cell.install.lock
    hint = f"run `stackproof lock {cell.id}`"
    if not path.exists():
        raise InputError(f"{path}: cell {cell.id!r} has no lock yet: {hint}")
    data = read_json(path, "lock", hint=hint)
    if data.get("schema_version") != LOCK_SCHEMA_VERSION:
        raise InputError(f"{path}: schema_version {data.get('schema_version')!r} is not {LOCK_SCHEMA_VERSION}: {hint}")
    try:
        lock = Lock(
            cell=str(data["cell"]),
            inputs_digest=str(data["inputs_digest"]),
            packages=tuple(
                LockedPackage(
                    name=str(p["name"]), version=str(p["version"]), index=str(p["index"]), hashes=_hashes(p["hashes"])
                )
                for p in data["packages"]
            ),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{path}: malformed lock ({type(exc).__name__}: {str(exc)[:200]}): {hint}") from None
    if lock.inputs_digest != inputs_digest(cell.install):
        raise InputError(f"{path}: stale lock, cell {cell.id!r} changed its install since it was locked: {hint}")
    return lock


def _hashes(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(h, str) for h in value):
        raise ValueError("hashes must be a list of strings")
    return tuple(value)


def write_lock(cell: Cell, lock: Lock) -> Path:
    assert cell.install is not None
    document = {
        "schema_version": LOCK_SCHEMA_VERSION,
        "cell": lock.cell,
        "inputs_digest": lock.inputs_digest,
        "generated_by": f"stackproof lock {cell.id}",
        "packages": [
            {"name": p.name, "version": p.version, "index": p.index, "hashes": list(p.hashes)} for p in lock.packages
        ],
    }
    path = cell.install.lock
    path.parent.mkdir(parents=True, exist_ok=True)
    # Atomic: a private temporary file beside the lock, then a rename over it. Two `lock`s racing to
    # one file (or a `verify` reading it meanwhile) see the old lock or a new one whole, never a
    # truncated file (issue 27); the last rename wins.
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(document, indent=1) + "\n")
        os.chmod(temporary, 0o644)  # mkstemp's 0600 would differ from a lock written by hand
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def resolve_lock(matrix: Matrix, cell: Cell, site: SiteSettings) -> Lock:
    """Resolve the cell's install requirements with `uv pip compile` into a Lock."""
    install = cell.install
    if install is None:
        raise InputError(f"cell {cell.id!r} has no `install` section to lock")
    argv = [
        "uv",
        "pip",
        "compile",
        "--quiet",
        "--generate-hashes",
        "--no-header",
        "--no-annotate",
        "--python-version",
        install.python_version,
        "--python-platform",
        install.python_platform,
    ]
    # Index URLs (which may carry credentials) go to uv through its environment, not its argv: the
    # process table is readable by every local user, a process's environment only by its owner.
    env = {"SSL_CERT_FILE": str(site.ca_bundle)} if site.ca_bundle else {}
    extra = []
    remote: dict[str, str] = {}  # index name -> the location uv is given, to name an unreachable one
    for index in sorted({DEPENDENCY_INDEX, *(r.index for r in install.requirements)}):
        where = site.index_location(matrix, index)
        if not where.is_local:
            remote[index] = where.location
        if where.is_local:
            argv += ["--find-links", str(where.directory)]
        elif index == DEPENDENCY_INDEX:
            env["UV_INDEX_URL"] = where.location
        else:
            extra.append(where.location)
    if extra:
        env["UV_EXTRA_INDEX_URL"] = " ".join(extra)
    with tempfile.TemporaryDirectory(prefix="stackproof-lock-") as tmp:
        requirements = Path(tmp) / "requirements.in"
        requirements.write_text("".join(f"{r.pin}\n" for r in install.requirements))
        try:
            result = cmd.run([*argv, str(requirements)], env=env, timeout=900, redact=site.secrets())
        except cmd.CommandFailed as exc:
            unreachable = _unreachable_index(exc.output_tail, remote)
            if unreachable is None:
                raise
            raise InfraError(
                f"cell {cell.id}: `uv pip compile` could not reach {unreachable}: check the network and proxy "
                "(STACKPROOF_CA_BUNDLE for a private CA), or map the index to a mirror or a wheel directory "
                "(STACKPROOF_MIRRORS=NAME=URL|DIR)"
            ) from None
    named = {r.name: r.index for r in install.requirements}
    packages = tuple(
        LockedPackage(name=name, version=version, index=named.get(name, DEPENDENCY_INDEX), hashes=hashes)
        for name, version, hashes in parse_compiled(result.stdout)
    )
    return Lock(cell=cell.id, inputs_digest=inputs_digest(install), packages=packages)


# What uv prints when it cannot reach an index (uv's client errors: connect, DNS, TLS, timeouts),
# as opposed to a resolution that failed on what the index answered (exit 1, the user's input).
_NETWORK = re.compile(
    r"Failed to fetch: (?P<url>\S+)|error sending request for url \((?P<url2>[^)]+)\)"
    r"|tcp connect error|dns error|operation timed out|Could not connect"
)


def _unreachable_index(output: str, remote: dict[str, str]) -> str | None:
    """The index (by name, never its URL: it may carry credentials) uv could not reach, if that is
    why it failed; "an index" when the URL is not one of the cell's."""
    found = _NETWORK.search(output)
    if found is None:
        return None
    url = found["url"] or found["url2"] or ""
    for name, location in sorted(remote.items(), key=lambda item: -len(item[1])):
        if url.startswith(location.rstrip("/")):
            return f"index {name!r}"
    return f"its indexes ({', '.join(sorted(remote))})" if remote else "an index"


_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")
_HASH = re.compile(r"--hash=(sha256:[0-9a-f]{64})")


def parse_compiled(text: str) -> list[tuple[str, str, tuple[str, ...]]]:
    """Parse pip-compile style output (`name==ver \\` then `--hash=` lines) into sorted pins."""
    result: list[tuple[str, str, tuple[str, ...]]] = []
    for block in re.split(r"\n(?=[A-Za-z0-9])", text.strip()):
        match = _PIN.match(block)
        if match:
            name = str(canonicalize_name(match.group(1)))
            result.append((name, match.group(2), tuple(sorted(_HASH.findall(block)))))
    return sorted(result)
