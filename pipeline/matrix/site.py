"""Site-local settings that never belong in matrix.yaml: index mirrors, the CA bundle, the Debian mirror.

Air-gapped GPU runners and corporate networks point index names at mirrors or local wheel
directories, and intercept TLS with their own CA. Both come from the environment:

- `STACKPROOF_MIRRORS`: comma-separated `INDEX=LOCATION`, where LOCATION is an http(s) URL
  (it may carry credentials) or a local directory of wheels; `none`: no mirror at all. Unset, the
  `pytorch-cpu` index maps to this machine's local wheel directory when pip has one (`find-links`
  in PIP_FIND_LINKS or pip's configuration files): the one place the CLI and the nox sessions
  learn it from.
- `STACKPROOF_CA_BUNDLE`: a PEM bundle for pip inside builds; `none` disables it. Default: the
  bundle the host's pip uses (`PIP_CERT` or `cert` in pip's configuration files).
- `STACKPROOF_DEBIAN_MIRROR`: the Debian mirror for bootstrap bases. Default: the first one in
  the host's apt sources.
- `STACKPROOF_REGISTRY`: `HOST[:PORT][/NAMESPACE]` the fleet shares. `build` pulls a cell's content
  tag from it instead of building when it is there, and (with buildx) keeps its layer cache in it.
- `STACKPROOF_BUILD_CACHE`: `none` turns that registry layer cache off.
- `STACKPROOF_RUNNER_LABELS`: a YAML file mapping the matrix's runner labels onto this site's
  (`pipeline.matrix.runners`): ARC scale sets, for one, carry none of the default `self-hosted` labels.
- `STACKPROOF_BASE_ARCHIVES`: the directory a relative `archive:` base path is under (an air-gapped
  runner's image archives; pipeline/build/archive.py). Default: the current directory.
- `STACKPROOF_COMPILE_CACHE`: a directory for the servers' compile/JIT caches (vLLM's torch.compile,
  inductor, Triton, FlashInfer's JIT), one slot per image id (`pipeline.matrix.compilecache`); `--compile-cache`
  on run and verify sets it. Unset: every start compiles from nothing.

An index a build needs that has no mirror is asked once (`check_reachable`) before the build
starts: unreachable, the job ends with exit 3 naming the index and STACKPROOF_MIRRORS, instead
of a pip failure deep in a build log.

Mirrors and the CA bundle reach builds only as BuildKit secrets, so neither lands in a layer or a
log line; the Debian mirror is a debootstrap argument on the host, never inside an image.
"""

from __future__ import annotations

import configparser
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.errors import InfraError, InputError
from pipeline.guard import boundedio
from pipeline.guard.redact import redact
from pipeline.matrix.compilecache import CompileCache, compile_cache_from_env
from pipeline.matrix.model import Matrix
from pipeline.matrix.runners import RunnerLabels, load_runner_labels
from pipeline.registry.oci import split_registry

__all__ = ["FIND_LINKS_INDEX", "Mirror", "SiteSettings", "load_site"]

# pip's configuration files in the order pip reads them (later files win): site-wide, user.
PIP_CONFIG_LIMIT = 4 * 2**20  # a pip.conf is a few lines
_PIP_CONFIG_FILES = ("/etc/xdg/pip/pip.conf", "/etc/pip.conf", "~/.pip/pip.conf", "~/.config/pip/pip.conf")
# The index a machine's local wheel directory stands for when STACKPROOF_MIRRORS is unset: the
# development and CI machines keep the CPU torch wheels there, and that index is the one they
# cannot reach (the others are PyPI's or GPU-only).
FIND_LINKS_INDEX = "pytorch-cpu"
_APT_SOURCES = ("/etc/apt/sources.list.d/debian.sources", "/etc/apt/sources.list")


@dataclass(frozen=True, kw_only=True)
class Mirror:
    index: str
    location: str

    @property
    def is_local(self) -> bool:
        return not self.location.startswith(("http://", "https://"))

    @property
    def directory(self) -> Path:
        return Path(self.location.removeprefix("file://"))

    @property
    def redacted(self) -> str:
        """The location with any `user:password@` removed, for logs and reports."""
        return redact(self.location)


@dataclass(frozen=True, kw_only=True)
class SiteSettings:
    mirrors: tuple[Mirror, ...] = ()
    ca_bundle: Path | None = None
    debian_mirror: str | None = None
    registry: str | None = None  # HOST[:PORT][/NAMESPACE]: where the fleet's built images are
    build_cache: bool = True  # keep buildx's layer cache in `registry` (when the CLI has buildx)
    runner_labels: RunnerLabels | None = None
    base_archives: Path | None = None  # STACKPROOF_BASE_ARCHIVES: where relative `archive:` bases are
    notes: tuple[str, ...] = field(default=())
    compile_cache: CompileCache | None = None  # STACKPROOF_COMPILE_CACHE: servers' compile/JIT cache

    def mirror(self, index: str) -> Mirror | None:
        return next((m for m in self.mirrors if m.index == index), None)

    def index_location(self, matrix: Matrix, index: str) -> Mirror:
        """Where `index` is fetched from at this site: its mirror, or the URL matrix.yaml declares."""
        return self.mirror(index) or Mirror(index=index, location=matrix.index(index).url)

    def secrets(self) -> tuple[str, ...]:
        """Strings that must never be printed (mirror URLs may embed credentials)."""
        return tuple(m.location for m in self.mirrors if "@" in m.location)

    def check_reachable(
        self, matrix: Matrix, indexes: Iterable[str], *, reach: Callable[[str], str | None] | None = None
    ) -> None:
        """InfraError (exit 3) naming every index of `indexes` without a mirror that this host cannot
        reach, and the variable that gives it one. `reach(url)`: None when it answers, else why not."""
        reach = reach or self._reach
        unreachable = []
        for name in indexes:
            if self.mirror(name) is not None:
                continue  # a mirror's own trouble shows in the build, with its location redacted
            url = matrix.index(name).url
            why = reach(url)
            if why is not None:
                unreachable.append(f"index {name} ({url}) is unreachable from this host: {why}")
        if unreachable:
            raise InfraError(
                "; ".join(unreachable) + ". Give it a mirror or a local wheel directory in STACKPROOF_MIRRORS "
                "(comma-separated INDEX=URL or INDEX=/path/to/wheels)"
            )

    def _reach(self, url: str) -> str | None:
        """One HEAD request: any HTTP answer, even 403 or 404, means pip can get there."""
        import httpx  # here: settings are read by commands that never touch the network

        verify: str | bool = str(self.ca_bundle) if self.ca_bundle else True
        try:
            httpx.head(url, timeout=10.0, verify=verify, follow_redirects=False)
        except httpx.ConnectError as exc:
            return f"cannot connect ({_hide(str(exc))[:200]})"
        except httpx.TimeoutException:
            return "no answer within 10s"
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {_hide(str(exc))[:200]}"
        return None


def load_site(matrix: Matrix, env: Mapping[str, str] | None = None) -> SiteSettings:
    """Read the site settings from `env` (default: the process environment) and check them."""
    env = os.environ if env is None else env
    known = tuple(ix.name for ix in matrix.indexes)
    mirrors: list[Mirror] = []
    notes: list[str] = []
    explicit = env.get("STACKPROOF_MIRRORS", "").strip()
    if not explicit:
        mirrors, notes = _found_mirrors(known, env)
    elif explicit.lower() == "none":
        explicit = ""
    for entry in filter(None, (e.strip() for e in explicit.split(","))):
        name, sep, location = entry.partition("=")
        # Every message shows the entry redacted: a location may carry `user:token@`.
        if not sep or not location:
            raise InputError(f"STACKPROOF_MIRRORS: {_hide(entry)!r} is not INDEX=LOCATION")
        if name not in known:
            raise InputError(
                f"STACKPROOF_MIRRORS: {_hide(name)!r} is not an index in {matrix.file} (known: {', '.join(known)})"
            )
        mirror = Mirror(index=name, location=location)
        if mirror.is_local and not mirror.directory.is_dir():
            raise InputError(f"STACKPROOF_MIRRORS: {_hide(name)}={_hide(location)}: no such directory")
        if not mirror.is_local and (any(c.isspace() for c in location) or "\x00" in location):
            raise InputError(
                f"STACKPROOF_MIRRORS: {_hide(name)}={_hide(location)}: a URL has no spaces or control characters"
            )
        mirrors.append(mirror)
    labels_file = env.get("STACKPROOF_RUNNER_LABELS")
    return SiteSettings(
        mirrors=tuple(mirrors),
        ca_bundle=_ca_bundle(env),
        debian_mirror=env.get("STACKPROOF_DEBIAN_MIRROR") or _apt_mirror(),
        registry=_registry(env),
        build_cache=env.get("STACKPROOF_BUILD_CACHE", "").lower() not in ("none", "off", "0"),
        runner_labels=load_runner_labels(Path(labels_file), matrix) if labels_file else None,
        base_archives=Path(env["STACKPROOF_BASE_ARCHIVES"]) if env.get("STACKPROOF_BASE_ARCHIVES") else None,
        notes=tuple(notes),
        compile_cache=compile_cache_from_env(env),
    )


def _found_mirrors(known: tuple[str, ...], env: Mapping[str, str]) -> tuple[list[Mirror], list[str]]:
    """STACKPROOF_MIRRORS unset: the machine's local wheel directory (pip's find-links) serves
    FIND_LINKS_INDEX, when the matrix has that index and the directory exists."""
    if FIND_LINKS_INDEX not in known:
        return [], []
    found = _pip_find_links(env)
    if found is None:
        return [], []
    directory, source = found
    note = f"index {FIND_LINKS_INDEX} from {directory} ({source}); STACKPROOF_MIRRORS overrides it"
    return [Mirror(index=FIND_LINKS_INDEX, location=str(directory))], [note]


def _pip_find_links(env: Mapping[str, str]) -> tuple[Path, str] | None:
    """The first local directory in pip's `find-links` (PIP_FIND_LINKS, else pip's configuration
    files, the last setting winning as in pip), and where it was read."""
    if env.get("PIP_FIND_LINKS"):
        text, source = env["PIP_FIND_LINKS"], "PIP_FIND_LINKS"
    else:
        setting = _pip_config(env, ("global", "install"), "find-links")
        if setting is None:
            return None
        text, source = setting
    for entry in text.split():
        directory = Path(entry.removeprefix("file://")).expanduser()
        if not entry.startswith(("http://", "https://")) and directory.is_dir():
            return directory, source
    return None


def _pip_config(env: Mapping[str, str], sections: tuple[str, ...], option: str) -> tuple[str, str] | None:
    """`option` from pip's configuration files (value, file), later files winning as in pip;
    PIP_CONFIG_FILE adds one, and set to the null device it turns them all off, as in pip."""
    if env.get("PIP_CONFIG_FILE") == os.devnull:
        return None
    files = [Path(f).expanduser() for f in _PIP_CONFIG_FILES] + [Path(sys.prefix) / "pip.conf"]
    if env.get("PIP_CONFIG_FILE"):
        files.append(Path(env["PIP_CONFIG_FILE"]))
    found = None
    for file in files:
        parser = configparser.ConfigParser()
        if not os.path.lexists(file):
            continue
        # The user's own files (and PIP_CONFIG_FILE): a FIFO, a device or a file past the cap is exit 2
        # naming it; configparser's own read waited on a FIFO and read /dev/zero whole (issue 27).
        data = boundedio.read_bytes(file, "pip configuration", limit=PIP_CONFIG_LIMIT)
        try:
            parser.read_string(data.decode("utf-8"), source=str(file))
        except (configparser.Error, UnicodeDecodeError):
            continue  # pip itself would stop on it; a build must not, for a setting it may not need
        for section in sections:
            if parser.has_option(section, option):
                found = (parser.get(section, option), str(file))
    return found


def _registry(env: Mapping[str, str]) -> str | None:
    text = env.get("STACKPROOF_REGISTRY", "").strip()
    if not text:
        return None
    try:
        host, namespace = split_registry(text)
    except InputError as exc:
        raise InputError(f"STACKPROOF_REGISTRY: {exc}") from exc
    if "@" in host:
        raise InputError("STACKPROOF_REGISTRY: HOST[:PORT][/NAMESPACE] carries no credentials (docker login)")
    return f"{host}/{namespace}" if namespace else host


def _hide(text: str) -> str:
    """A part of STACKPROOF_MIRRORS fit to print: credentials (`user:token@`, with or without a
    scheme) and known token shapes removed."""
    return re.sub(r"[^\s/=@]+@", "***@", redact(text))


def _ca_bundle(env: Mapping[str, str]) -> Path | None:
    explicit = env.get("STACKPROOF_CA_BUNDLE")
    if explicit:
        if explicit.lower() == "none":
            return None
        if not Path(explicit).is_file():
            raise InputError(f"STACKPROOF_CA_BUNDLE: {explicit}: no such file")
        return Path(explicit)
    if env.get("PIP_CERT") and Path(env["PIP_CERT"]).is_file():
        return Path(env["PIP_CERT"])
    setting = _pip_config(env, ("global",), "cert")
    cert = setting[0] if setting else None
    return Path(cert) if cert and Path(cert).is_file() else None


def _apt_mirror() -> str | None:
    for source in _APT_SOURCES:
        try:
            text = Path(source).read_text()
        except OSError:
            continue
        match = re.search(r"^(?:URIs:|deb)\s+(?:\[[^]]*\]\s+)?(\S+/debian)/?\s", text, re.MULTILINE)
        if match:
            return match.group(1)
    return None
