"""Site-local settings that never belong in matrix.yaml: index mirrors, the CA bundle, the Debian mirror.

Air-gapped GPU runners and corporate networks point index names at mirrors or local wheel
directories, and intercept TLS with their own CA. Both come from the environment:

- `STACKPROOF_MIRRORS`: comma-separated `INDEX=LOCATION`, where LOCATION is an http(s) URL
  (it may carry credentials) or a local directory of wheels.
- `STACKPROOF_CA_BUNDLE`: a PEM bundle for pip inside builds; `none` disables it. Default: the
  bundle the host's pip uses (`PIP_CERT` or `cert` in pip's configuration files).
- `STACKPROOF_DEBIAN_MIRROR`: the Debian mirror for bootstrap bases. Default: the first one in
  the host's apt sources.
- `STACKPROOF_REGISTRY`: `HOST[:PORT][/NAMESPACE]` the fleet shares. `build` pulls a cell's content
  tag from it instead of building when it is there, and (with buildx) keeps its layer cache in it.
- `STACKPROOF_BUILD_CACHE`: `none` turns that registry layer cache off.
- `STACKPROOF_RUNNER_LABELS`: a YAML file mapping the matrix's runner labels onto this site's
  (`pipeline.runners`): ARC scale sets, for one, carry none of the default `self-hosted` labels.

Mirrors and the CA bundle reach builds only as BuildKit secrets, so neither lands in a layer or a
log line; the Debian mirror is a debootstrap argument on the host, never inside an image.
"""

from __future__ import annotations

import configparser
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.errors import InputError
from pipeline.model import Matrix
from pipeline.redact import redact
from pipeline.registry import split_registry
from pipeline.runners import RunnerLabels, load_runner_labels

__all__ = ["Mirror", "SiteSettings", "load_site"]

_PIP_CONFIG_FILES = ("/etc/pip.conf", "/etc/xdg/pip/pip.conf", "~/.pip/pip.conf", "~/.config/pip/pip.conf")
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
    notes: tuple[str, ...] = field(default=())

    def mirror(self, index: str) -> Mirror | None:
        return next((m for m in self.mirrors if m.index == index), None)

    def index_location(self, matrix: Matrix, index: str) -> Mirror:
        """Where `index` is fetched from at this site: its mirror, or the URL matrix.yaml declares."""
        return self.mirror(index) or Mirror(index=index, location=matrix.index(index).url)

    def secrets(self) -> tuple[str, ...]:
        """Strings that must never be printed (mirror URLs may embed credentials)."""
        return tuple(m.location for m in self.mirrors if "@" in m.location)


def load_site(matrix: Matrix, env: Mapping[str, str] | None = None) -> SiteSettings:
    """Read the site settings from `env` (default: the process environment) and check them."""
    env = os.environ if env is None else env
    known = tuple(ix.name for ix in matrix.indexes)
    mirrors = []
    for entry in filter(None, (e.strip() for e in env.get("STACKPROOF_MIRRORS", "").split(","))):
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
    )


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
    files = [Path(f).expanduser() for f in _PIP_CONFIG_FILES]
    if env.get("PIP_CONFIG_FILE"):
        files.append(Path(env["PIP_CONFIG_FILE"]))
    cert = None
    for file in files:  # later files win, as in pip
        parser = configparser.ConfigParser()
        try:
            parser.read(file)
        except configparser.Error:
            continue
        if parser.has_option("global", "cert"):
            cert = parser.get("global", "cert")
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
