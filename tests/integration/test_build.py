"""Real builds through the real CLI: the bootstrapped base, overrides from PyPI and from a local mirror."""

from __future__ import annotations

import base64
import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from pipeline.build.bootstrap import ensure_base
from pipeline.docker.client import Docker
from pipeline.matrix.model import BootstrapBase
from pipeline.matrix.read import load_matrix
from pipeline.matrix.site import load_site
from tests.integration.conftest import IMAGES, MATRIX, docker_cmd, stackproof

pytestmark = pytest.mark.integration

SMOKE_MATRIX = """\
schema_version: 1
indexes:
  pypi: {url: "https://pypi.org/simple"}
bases:
  debian-bookworm:
    bootstrap:
      suite: bookworm
      variant: minbase
      include: [python3, python3-venv, python3-pip, ca-certificates]
      venv: /opt/venv
cells:
  - id: smoke-six
    base: debian-bookworm
    platform: linux/amd64
    arch: none
    overrides:
      six: {version: "1.16.0", index: pypi}
"""


def _python_in(image: str, code: str) -> str:
    return docker_cmd(
        "run", "--rm", "--network", "host", "--entrypoint", "/opt/venv/bin/python", image, "-c", code
    ).strip()


def test_bootstrap_base_is_built_once_and_has_a_venv(docker: Docker) -> None:
    matrix = load_matrix(MATRIX, images_dir=IMAGES)
    base = next(b for b in matrix.bases if isinstance(b, BootstrapBase))
    site = load_site(matrix)
    tag, _ = ensure_base(docker, base, site, IMAGES)
    again, built_again = ensure_base(docker, base, site, IMAGES)
    assert again == tag
    assert built_again is False, "a base whose recipe tag exists must not be rebuilt"
    assert _python_in(tag, "import sys; print(sys.prefix, sys.version_info[:2])") == "/opt/venv (3, 11)"


def test_override_from_pypi_is_installed_labelled_and_skipped_on_rebuild(docker: Docker, tmp_path: Path) -> None:
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(SMOKE_MATRIX)
    args = ["build", "smoke-six", "--matrix", str(matrix), "--images", str(IMAGES), "--out", str(tmp_path), "--json"]
    first = stackproof(args, env={"STACKPROOF_MIRRORS": ""})
    assert first.returncode == 0, first.stderr[-3000:]
    tag = str(first.json()["tag"])

    assert _python_in(tag, "import importlib.metadata as m; print(m.version('six'))") == "1.16.0"
    labels = json.loads(docker_cmd("image", "inspect", "--format", "{{json .Config.Labels}}", tag))
    assert labels["io.stackproof.cell"] == "smoke-six"
    assert json.loads(labels["io.stackproof.overrides"]) == [{"name": "six", "version": "1.16.0", "index": "pypi"}]
    assert labels["io.stackproof.matrix.digest"] == "sha256:" + hashlib.sha256(matrix.read_bytes()).hexdigest()
    assert labels["org.opencontainers.image.title"] == "smoke-six"

    # The CA bundle and the index options were secrets: nothing of them is in the image or its history.
    history = docker_cmd("image", "history", "--no-trunc", "--format", "{{.CreatedBy}}", tag)
    assert "index-url" not in history and "PIP_CERT" not in history
    assert _python_in(tag, "import os; print(os.path.exists('/run/secrets/cabundle'))") == "False"

    second = stackproof(args, env={"STACKPROOF_MIRRORS": ""})
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.json()["tag"] == tag
    assert second.json()["skipped"] is True, "an existing content tag must skip the build"


def test_override_from_a_local_directory_mirror_installs_that_copy(docker: Docker, tmp_path: Path) -> None:
    """A six==1.16.0 wheel that differs from PyPI's: only the mirror's copy carries the marker."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _marked_wheel(wheels, "six", "1.16.0", marker="from-the-local-mirror")
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(SMOKE_MATRIX)
    # -v streams the build: pip's own "Looking in links" line is the proof
    args = ["build", "smoke-six", "-v", "--matrix", str(matrix), "--images", str(IMAGES), "--out", str(tmp_path)]
    result = stackproof(
        [*args, "--json"],
        env={"STACKPROOF_MIRRORS": f"pypi={wheels}"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    tag = str(result.json()["tag"])
    assert _python_in(tag, "import six; print(six.STACKPROOF_MARKER)") == "from-the-local-mirror"
    assert "Looking in links: /tmp/stackproof/wheels/pypi" in result.stderr


def test_bad_matrix_builds_nothing(docker: Docker, tmp_path: Path) -> None:
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(SMOKE_MATRIX.replace('version: "1.16.0"', 'version: ">=1.16"'))
    result = stackproof(["build", "smoke-six", "-v", "--matrix", str(matrix), "--images", str(IMAGES)])  # -v: echoes
    assert result.returncode == 2
    assert f"{matrix}:17: cells[0].overrides.six.version: '>=1.16' is not an exact version" in result.stderr
    assert "+ " not in result.stderr, "nothing may be run for a bad matrix"


def _marked_wheel(directory: Path, name: str, version: str, *, marker: str) -> Path:
    """A minimal, valid pure-Python wheel whose module carries `STACKPROOF_MARKER`."""
    dist_info = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": f"STACKPROOF_MARKER = {marker!r}\n",
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist_info}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: stackproof-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = "\n".join(record) + "\n"
    wheel = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return wheel
