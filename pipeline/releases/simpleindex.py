"""The versions of one package on one index: a PEP 503 simple page, or a directory of wheels.

An index location is what the site maps the index name to (pipeline/matrix/site.py: a mirror URL, a
local wheel directory, else matrix.yaml's URL). Its page for a project is `<location>/<name>/`
with the PEP 503 normalized name (PEP 503, "Normalized Names"); each anchor is one file, its
text the filename, `data-yanked` marking a yanked one (PEP 592). A location that is a find-links
page (one page listing every file, as FlashInfer's wheel index is) is read whole when the project
page is missing. Versions come from the filenames (packaging's wheel and sdist filename rules):
a version is listed when it has a wheel for the cell's Python and platform, or an sdist.
"""

from __future__ import annotations

import html.parser
import re
from urllib.parse import unquote, urlsplit

import httpx
from packaging.tags import Tag
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import Version

from pipeline.errors import InfraError
from pipeline.guard import httppolicy
from pipeline.guard.redact import redact
from pipeline.matrix.site import Mirror

__all__ = ["files_of_page", "list_versions", "versions_of_files"]

POLICY = httppolicy.HttpPolicy(read_s=30, total_s=120, max_items=100_000, max_body=32 << 20, min_rate_bps=1024.0)


class _Anchors(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.files: list[tuple[str, bool]] = []  # (filename, yanked)
        self._href: str | None = None
        self._yanked = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            values = dict(attrs)
            self._href = values.get("href") or ""
            self._yanked = "data-yanked" in values

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._href is not None:
            name = unquote(urlsplit(self._href).path.rsplit("/", 1)[-1])
            self.files.append((name, self._yanked))
            self._href = None


def files_of_page(text: str) -> list[tuple[str, bool]]:
    """(filename, yanked) of every anchor of a simple or find-links page."""
    parser = _Anchors()
    parser.feed(text)
    return parser.files


def versions_of_files(files: list[tuple[str, bool]], name: str, *, python: str, machine: str) -> tuple[Version, ...]:
    """The versions of `name` among the files, ascending: not yanked, with a wheel for CPython
    `python` (3.11) on `machine` (x86_64), or an sdist."""
    want = canonicalize_name(name)
    compact = python.replace(".", "")
    found: set[Version] = set()
    for filename, yanked in files:
        if yanked:
            continue
        try:
            if filename.endswith(".whl"):
                project, version, _, tags = parse_wheel_filename(filename)
                if project == want and any(_fits(t, compact, machine) for t in tags):
                    found.add(version)
            elif filename.endswith((".tar.gz", ".zip")):
                project, version = parse_sdist_filename(filename)
                if project == want:
                    found.add(version)
        except (InvalidWheelFilename, InvalidSdistFilename):
            continue
    return tuple(sorted(found))


def _fits(tag: Tag, compact: str, machine: str) -> bool:
    minor = tag.interpreter[3:]  # `cp39` -> 9; a tag that is no CPython minor (`cp3x`) fits nothing (issue 43)
    interpreter_ok = tag.interpreter in ("py3", f"py{compact}", f"cp{compact}") or (
        tag.interpreter.startswith("cp3")
        and tag.abi == "abi3"
        and minor.isdigit()
        and compact[1:].isdigit()
        and int(minor) <= int(compact[1:])
    )
    platform_ok = tag.platform == "any" or (tag.platform.startswith(("manylinux", "linux")) and machine in tag.platform)
    return interpreter_ok and platform_ok


def list_versions(where: Mirror, name: str, *, python: str, machine: str) -> tuple[Version, ...]:
    """The versions of `name` at the index location `where` (InfraError when it cannot be read)."""
    if where.is_local:
        directory = where.directory
        if not directory.is_dir():
            raise InfraError(f"index {where.index}: {directory} is not a directory")
        project = directory / str(canonicalize_name(name))
        listing = [(p.name, False) for p in (project if project.is_dir() else directory).iterdir()]
        return versions_of_files(listing, name, python=python, machine=machine)
    base = where.location.rstrip("/")
    with httpx.Client(timeout=POLICY.timeout()) as client:
        page = _get(client, f"{base}/{canonicalize_name(name)}/", where)
        if page is None:
            page = _get(client, f"{base}/", where)  # a find-links page: every file on one page
        if page is None:
            raise InfraError(f"index {where.index} ({where.redacted}): no page for {name} (HTTP 404)")
    return versions_of_files(files_of_page(page), name, python=python, machine=machine)


def _get(client: httpx.Client, url: str, where: Mirror) -> str | None:
    what = f"index {where.index} ({where.redacted})"
    try:
        response = httppolicy.fetch(
            client, client.build_request("GET", url), policy=POLICY, what=what, follow_redirects=True
        )
    except httpx.HTTPError as exc:
        raise InfraError(f"{what} is unreachable: {redact(str(exc), (where.location,))}") from None
    if response.status_code == 404:
        return None
    if response.status_code != 200:
        raise InfraError(f"{what}: HTTP {response.status_code} for its project page")
    return response.text


def local_label(version: str) -> str:
    """`+cu130` of `0.6.18+cu130`, '' without one."""
    match = re.search(r"\+.*$", version)
    return match.group(0) if match else ""
