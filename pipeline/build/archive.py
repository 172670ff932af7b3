"""A cell base that is a local image archive (`ArchiveBase`): checked by sha256, then loaded once.

An air-gapped runner has no registry to pull a base from; its base arrives as a file: a
`docker save` / OCI archive (`docker load`) or a root filesystem tarball (`docker import`, the
base's `env` set with `--change ENV`). The file's sha256 is what matrix.yaml pins, so it is checked
(streamed: a GPU host's tree is 15 GB) before docker sees it, and the loaded image is tagged from it
(`ArchiveBase.tag`): a tag already present is this very file, loaded before, and is not loaded again."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from pipeline.console import console
from pipeline.docker.client import Docker
from pipeline.errors import InfraError, InputError
from pipeline.guard.boundedio import open_input
from pipeline.matrix.model import ArchiveBase

__all__ = ["archive_path", "ensure_archive_base", "file_sha256"]

_CHUNK = 4 * 2**20
# `docker load` prints one of these per image (cli/command/image/load.go: the daemon's stream lines).
_LOADED = re.compile(r"^Loaded image(?: ID)?: (\S+)\s*$", re.MULTILINE)


def archive_path(base: ArchiveBase, directory: Path | None) -> Path:
    """Where the archive is: `archive` itself when absolute, else under the site's directory
    (STACKPROOF_BASE_ARCHIVES; default the current directory)."""
    path = Path(base.archive).expanduser()
    return path if path.is_absolute() else (directory or Path.cwd()) / path


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open_input(path, "base archive") as f:  # a regular file: a FIFO or device is refused
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def ensure_archive_base(docker: Docker, base: ArchiveBase, *, directory: Path | None, matrix_file: Path) -> str:
    """The base's tag on this daemon: there already, or loaded now from its checked archive. A
    missing file is exit 3 (where it was looked for); a different file is exit 2 (the pin is wrong,
    or the file): nothing is loaded either way."""
    if docker.image(base.tag) is not None:
        return base.tag
    path = archive_path(base, directory)
    if not path.is_file():
        where = (
            ""
            if Path(base.archive).is_absolute()
            else f" (relative: under STACKPROOF_BASE_ARCHIVES={directory or '.'})"
        )
        raise InfraError(
            f"base {base.name}: archive {path} not found{where}: put the archive there, or set STACKPROOF_BASE_ARCHIVES"
        )
    console().say(f"base {base.name}: checking the sha256 of {path} ({path.stat().st_size / 2**30:.1f} GiB)")
    actual = file_sha256(path)
    if actual != base.sha256:
        raise InputError(
            f"{matrix_file}:{base.line}: bases.{base.name}.sha256: {path} has sha256 {actual}, not {base.sha256}"
        )
    console().say(f"base {base.name}: {'importing' if base.format == 'rootfs' else 'loading'} {path} as {base.tag}")
    if base.format == "rootfs":
        docker.import_rootfs(path, base.tag, [f"ENV {name}={value}" for name, value in base.env])
    else:
        loaded = _LOADED.findall(docker.load_archive(path))
        if len(loaded) != 1:
            raise InputError(
                f"{matrix_file}:{base.line}: bases.{base.name}: {path} holds {len(loaded)} images "
                f"({', '.join(loaded) or 'none'}): an archive base is one image"
            )
        docker.tag(loaded[0], base.tag)
    return base.tag
