"""A CDI spec for a FAKE device kind, `stackproof.test/gpu`, and a tiny root filesystem to see it from.

Named as the stand-in it is: no GPU is reachable here, so the CPU tier proves the CDI path
(pipeline/docker/gpuaccess.py) with a device that injects an env var and bind-mounts a file, which
is all a CDI spec does for the NVIDIA kind too (device nodes, mounts, env; gpu-docker.md section 1).
Docker 25+ reads it when daemon.json has `features.cdi` and `cdi-spec-dirs`."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

import yaml

FAKE_KIND = "stackproof.test/gpu"
FAKE_ENV = "STACKPROOF_FAKE_GPU"
FAKE_MOUNT = "/fake-gpu/card"


def write_fake_cdi_spec(directory: Path) -> Path:
    """The spec (devices `all` and `0`) and the file it mounts, under `directory`; returns it."""
    directory.mkdir(parents=True, exist_ok=True)
    card = directory / "card"
    card.write_text("fake gpu card\n")
    spec = {
        "cdiVersion": "0.6.0",
        "kind": FAKE_KIND,
        "devices": [{"name": name, "containerEdits": {"env": [f"{FAKE_ENV}={name}"]}} for name in ("all", "0")],
        "containerEdits": {"mounts": [{"hostPath": str(card), "containerPath": FAKE_MOUNT, "options": ["ro", "bind"]}]},
    }
    (directory / "fake-gpu.yaml").write_text(yaml.safe_dump(spec))
    return directory


def host_rootfs(
    tarball: Path, binaries: tuple[str, ...] = ("/bin/sh", "/bin/cat", "/usr/bin/env", "/bin/mkdir", "/bin/chmod")
) -> Path:
    """A root filesystem tarball of a few of this host's binaries and the libraries `ldd` names:
    enough to run `sh -c` in a container, built in milliseconds with no registry."""
    files: set[Path] = set()
    for binary in binaries:
        files.add(Path(binary))
        out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            path = next((p for p in line.split() if p.startswith("/")), None)
            if path:
                files.add(Path(path))
    with tarfile.open(tarball, "w") as tar:
        for path in sorted(files):
            tar.add(path.resolve(), arcname=str(path).lstrip("/"))
    return tarball
