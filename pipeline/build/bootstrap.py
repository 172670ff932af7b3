"""Bootstrap bases: a Debian root filesystem from debootstrap, imported as an image.

No registry is involved, which is what the embedded default and air-gapped sites need. The
image is content-addressed by its recipe, so it is built once and reused by every cell on it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from pipeline import cmd
from pipeline.cache import cache_dir
from pipeline.console import console
from pipeline.docker.client import Docker
from pipeline.errors import InfraError
from pipeline.matrix.model import BootstrapBase
from pipeline.matrix.site import SiteSettings

__all__ = ["base_tag", "ensure_base"]

# Bump when the steps below change in a way that changes the image.
RECIPE_REVISION = 1


def base_tag(base: BootstrapBase) -> str:
    """`stackproof/base-NAME:<digest of the recipe>`; the mirror is not part of it."""
    recipe = base.recipe
    spec = {
        "revision": RECIPE_REVISION,
        "suite": recipe.suite,
        "variant": recipe.variant,
        "include": sorted(recipe.include),
        "venv": recipe.venv,
    }
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()
    return f"stackproof/base-{base.name}:{digest[:16]}"


def ensure_base(
    docker: Docker, base: BootstrapBase, site: SiteSettings, images_dir: Path, *, log_dir: Path | None = None
) -> tuple[str, bool]:
    """Build the base unless its tag exists. Returns (tag, built_now). debootstrap's whole output
    goes to `log_dir/bootstrap-<time>.log` (default: the cache), the terminal shows its phase line."""
    tag = base_tag(base)
    if docker.image(tag) is not None:
        console().say(f"base {tag} exists, reusing it")
        return tag, False
    if shutil.which("debootstrap") is None:
        raise InfraError("debootstrap is not installed: `apt-get install -y debootstrap` (needs root)")
    if os.geteuid() != 0:  # debootstrap itself refuses, after the build has been planned and announced
        raise InfraError(
            f"base {tag} is not here and bootstrapping it needs root (debootstrap): run this job once as "
            "root (e.g. `stackproof build CELL`); later runs as any user in the docker group reuse the base"
        )
    if not site.debian_mirror:
        raise InfraError("no Debian mirror known: set STACKPROOF_DEBIAN_MIRROR or configure apt sources")
    recipe = base.recipe
    log_dir = log_dir or cache_dir() / "bootstrap"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / time.strftime(f"bootstrap-{base.name}-%Y%m%dT%H%M%S.log")
    with (
        tempfile.TemporaryDirectory(prefix="stackproof-bootstrap-") as tmp,
        log_path.open("a") as log,
        console().phase("bootstrap", base.name, log=log_path) as phase,
    ):
        packages = 0

        def on_line(line: str) -> None:
            nonlocal packages
            log.write(line + "\n")
            if line.startswith(("I: Unpacking ", "I: Configuring ")):
                packages += 1
                phase.update(f"{packages} package steps")
            phase.tool(line)

        rootfs = Path(tmp) / "rootfs"
        argv = ["debootstrap", f"--variant={recipe.variant}"]
        if recipe.include:
            argv.append("--include=" + ",".join(recipe.include))
        argv += [recipe.suite, str(rootfs), site.debian_mirror]
        try:
            cmd.stream(argv, on_line=on_line, timeout=1800)
            cmd.run(["chroot", str(rootfs), "python3", "-m", "venv", recipe.venv], timeout=300)
        finally:
            # An interrupted debootstrap leaves /proc and /sys mounted inside the rootfs; unmount
            # them before the temporary directory is deleted, or the delete walks into them.
            _unmount_below(rootfs)
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for path in (rootfs / leftover).glob("*"):
                if path.is_file():
                    path.unlink()
        tarball = Path(tmp) / "rootfs.tar"
        cmd.run(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(tarball), "."], timeout=600)
        docker.import_rootfs(tarball, tag, changes=["ENV LANG=C.UTF-8"])
        phase.done(f"{tag}, {packages} package steps")
    return tag, True


def _unmount_below(root: Path, mounts: Path = Path("/proc/mounts")) -> None:
    try:
        lines = mounts.read_text().splitlines()
    except OSError:
        return
    prefix = str(root.resolve()) + "/"
    targets = [line.split()[1] for line in lines if len(line.split()) > 1 and line.split()[1].startswith(prefix)]
    for target in sorted(targets, key=len, reverse=True):  # deepest first
        cmd.run(["umount", "--lazy", target], check=False, timeout=60)
