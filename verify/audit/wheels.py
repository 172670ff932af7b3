"""The wheels an audit reads: downloaded once with `pip download`, kept by name, version and sha256.

Layout: `<cache dir>/wheels/<name>/<version>/<wheel file>`, with `wheels.json` there mapping each
request (index, platform, Python) to the file and the sha256 computed after the download. A
request seen before is answered from the directory without starting pip, and so is a request for
another platform when the wheel is pure Python (`none-any`). For a day, "the newest version" of an
unpinned package and an index's "no such file" are remembered too (`latest.json`, `missing.json`).
pip runs `--isolated`: the host's pip configuration (extra indexes, find-links, constraints) must
not change which file an index gives; the site's CA bundle is passed explicitly.

An index that does not have the wheel, or cannot be reached, makes the package "not checkable";
the caller decides whether that ends the audit (the index serving vLLM itself) or is reported.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from pipeline import cmd
from pipeline.cache import locked
from pipeline.errors import InfraError

__all__ = ["Target", "Unavailable", "Wheel", "fetch_wheel"]

# pip's words for a connection problem, as opposed to "this index has no such file"
_NETWORK = re.compile(
    r"ProxyError|NewConnectionError|Max retries exceeded|ConnectTimeout|ReadTimeout|SSLError|"
    r"Network is unreachable|Temporary failure in name resolution|Connection refused|Could not fetch URL|"
    r"too many \d+ error responses"  # the index answers, but only 5xx (pip's Retry status_forcelist)
)
DOWNLOAD_TIMEOUT = 900  # seconds for one wheel: the vLLM wheel is ~300 MB


@dataclass(frozen=True, kw_only=True)
class Target:
    """What the image runs: the wheel tags pip must select for."""

    platform: str  # manylinux_2_28_x86_64 | manylinux_2_28_aarch64
    python: str  # 3.12

    def key(self) -> str:
        return f"{self.platform}-cp{self.python.replace('.', '')}"


@dataclass(frozen=True, kw_only=True)
class Wheel:
    name: str
    version: str
    path: Path
    sha256: str
    downloaded: bool  # False: answered from the cache
    seconds: float = 0.0  # how long `pip download` ran for it (0: answered from the cache)


class Unavailable(Exception):
    """The index gave no wheel. `network`: it could not be reached at all (pip's words say so).
    `seconds`: how long the `pip download` that found out ran (0: remembered, no pip started)."""

    def __init__(self, message: str, *, network: bool, seconds: float = 0.0) -> None:
        super().__init__(message)
        self.network = network
        self.seconds = seconds


def fetch_wheel(
    name: str,
    version: str | None,
    *,
    index_url: str,
    target: Target,
    root: Path,
    cert: Path | None = None,
    find_links: Path | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> Wheel:
    """The wheel of name==version (the newest when version is None) for `target`, from `index_url`."""
    name = str(canonicalize_name(name))
    request = f"{index_url}|{target.key()}"
    if version is None:  # "the newest": remembered for a day, so a warm audit starts no pip
        version = _latest(root / name, request)
    if version is not None:
        known = _known(root / name / version, request)
        if known is not None:
            return known
        missing = _missing(root / name / version, request)
        if missing is not None:  # the index said "no such file" within the day: do not ask again
            raise Unavailable(missing, network=False)
    with tempfile.TemporaryDirectory(prefix="stackproof-wheel-", dir=_tmp_parent(root)) as scratch:
        spec = f"{name}=={version}" if version else name
        argv = [sys.executable, "-m", "pip", "download", "--isolated", "--no-deps", "--only-binary", ":all:"]
        argv += ["--disable-pip-version-check", "--retries", "1", "--timeout", "30", "--progress-bar", "off"]
        argv += ["--platform", target.platform, "--python-version", target.python, "--implementation", "cp"]
        argv += ["--no-index", "--find-links", str(find_links)] if find_links else ["--index-url", index_url]
        # pip logs an index page it could not fetch (a 5xx after its retries) at debug level only:
        # its --log keeps that, and it is what tells "unreachable" from "no such file".
        argv += ["--log", str(Path(scratch) / "pip.log")]
        argv += ([f"--cert={cert}"] if cert else []) + ["-d", scratch, spec]
        lines: list[str] = []

        def on_line(line: str) -> None:
            lines.append(line)
            if line.lstrip().startswith(("Downloading", "Saved", "Collecting")):
                progress(line.strip())

        started = time.monotonic()
        try:
            cmd.stream(argv, on_line=on_line, timeout=DOWNLOAD_TIMEOUT)
        except cmd.CommandFailed as exc:
            seconds = time.monotonic() - started
            text = "\n".join(lines) or exc.output_tail
            log = Path(scratch) / "pip.log"
            if log.is_file():  # the debug-level lines that name a connection problem, if any
                text += "\n" + "\n".join(
                    ln for ln in log.read_text(errors="replace").splitlines() if _NETWORK.search(ln)
                )
            if "No module named pip" in text:
                raise InfraError(
                    f"{sys.executable} has no pip: install it (python -m ensurepip) and run again"
                ) from None
            network = bool(_NETWORK.search(text))
            # pip's last line says "No matching distribution" for an unreachable index too: name the cause.
            reason = f"{spec} from {index_url}: {_network_error(text) if network else _last_error(text)}"
            if not network and version is not None:
                _remember_missing(root / name / version, request, reason)
            raise Unavailable(reason, network=network, seconds=seconds) from None
        seconds = time.monotonic() - started
        files = sorted(Path(scratch).glob("*.whl"))
        if not files:
            raise Unavailable(f"{spec} from {index_url}: pip saved no wheel", network=False, seconds=seconds)
        _, got_version, _, _ = parse_wheel_filename(files[0].name)
        directory = root / name / str(got_version)
        with locked(directory):
            final = directory / files[0].name
            os.replace(files[0], final)
            wheel = Wheel(
                name=name, version=str(got_version), path=final, sha256=_sha256(final), downloaded=True, seconds=seconds
            )
            _remember(directory, request, wheel)
        if spec == name:
            _remember_latest(root / name, request, wheel.version)
        return wheel


LATEST_TTL = 86400  # seconds an unpinned package's "newest" (or an index's "no such file") is reused


def _latest(directory: Path, request: str) -> str | None:
    """The newest version seen within the day: for this target, else for another target of the
    same index (`_known` then reuses its wheel only if it is pure-Python, else pip fetches this
    target's wheel of that version)."""
    try:
        known = json.loads((directory / "latest.json").read_text())
        index = request.split("|")[0]
        entry = known.get(request) or next(e for r, e in sorted(known.items()) if r.split("|")[0] == index)
    except (OSError, ValueError, KeyError, TypeError, StopIteration, AttributeError):
        return None
    return str(entry["version"]) if time.time() - float(entry["at"]) < LATEST_TTL else None


def _remember_latest(directory: Path, request: str, version: str) -> None:
    manifest = directory / "latest.json"
    try:
        known = json.loads(manifest.read_text())
    except (OSError, ValueError):
        known = {}
    known[request] = {"version": version, "at": time.time()}
    tmp = manifest.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(known, indent=1, sort_keys=True))
    tmp.replace(manifest)


def _missing(directory: Path, request: str) -> str | None:
    try:
        entry = json.loads((directory / "missing.json").read_text())[request]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return str(entry["reason"]) if time.time() - float(entry["at"]) < LATEST_TTL else None


def _remember_missing(directory: Path, request: str, reason: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    manifest = directory / "missing.json"
    try:
        known = json.loads(manifest.read_text())
    except (OSError, ValueError):
        known = {}
    known[request] = {"reason": reason, "at": time.time()}
    tmp = manifest.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(known, indent=1, sort_keys=True))
    tmp.replace(manifest)


def _tmp_parent(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)  # scratch on the same filesystem: the move is a rename
    return root


def _known(directory: Path, request: str) -> Wheel | None:
    """The wheel fetched before for this request, or a pure-Python one (`none-any`) from the same
    index for another platform: FlashInfer's and uvicorn's wheels are one file for every target."""
    try:
        known = json.loads((directory / "wheels.json").read_text())
        index = request.split("|")[0]
        entry = known.get(request) or next(
            e for r, e in sorted(known.items()) if r.split("|")[0] == index and e["file"].endswith("-none-any.whl")
        )
    except (OSError, ValueError, KeyError, TypeError, StopIteration, AttributeError):
        return None
    path = directory / entry["file"]
    if not path.is_file() or path.stat().st_size != entry["size"]:
        return None
    _, version, _, _ = parse_wheel_filename(path.name)
    name = str(canonicalize_name(directory.parent.name))
    return Wheel(name=name, version=str(version), path=path, sha256=entry["sha256"], downloaded=False)


def _remember(directory: Path, request: str, wheel: Wheel) -> None:
    manifest = directory / "wheels.json"
    try:
        known = json.loads(manifest.read_text())
    except (OSError, ValueError):
        known = {}
    known[request] = {"file": wheel.path.name, "sha256": wheel.sha256, "size": wheel.path.stat().st_size}
    tmp = manifest.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(known, indent=1, sort_keys=True))
    tmp.replace(manifest)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _network_error(text: str) -> str:
    line = next(ln for ln in text.splitlines() if _NETWORK.search(ln))
    for cause in (r"Failed to establish a new connection: ([^'\")]*)", r"(\w+Error)\b"):
        found = re.search(cause, line)
        if found:
            return f"the index cannot be reached ({found.group(1).strip()[:200]})"
    return f"the index cannot be reached ({line.strip()[:200]})"


def _last_error(text: str) -> str:
    errors = [line.strip() for line in text.splitlines() if line.strip().startswith("ERROR")]
    with contextlib.suppress(IndexError):
        return errors[-1].removeprefix("ERROR: ")
    tail = [line.strip() for line in text.splitlines() if line.strip()]
    return tail[-1] if tail else "pip failed without a message"
