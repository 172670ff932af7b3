"""Two real `stackproof lock` processes racing to one lock file (issue 27, class 7: lost data).

The unit tier (tests/unit/test_lock_race.py) races `write_lock` in forked processes; here the whole
command runs twice at once, real uv included, each resolving against a local wheel directory
(STACKPROOF_MIRRORS=pypi=DIR, uv offline) of tiny wheels built here, so no network is needed. The
two matrices pin different versions, so a mix of the two documents would show. While they race,
this process reads the file the whole time: every read is one of the two locks, whole; after each
round the file is a valid lock of one of them and no temporary file is left beside it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from tests.integration.conftest import IMAGES, JOB, REPO, write_matrix

pytestmark = pytest.mark.integration

CELL = "lock-race"
ROUNDS = 4


def wheel(directory: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    """A minimal pure-Python wheel: uv reads only its METADATA to resolve."""
    dist = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    files = {
        f"{name}/__init__.py": "",
        f"{dist}/METADATA": metadata,
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: stackproof-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{path},,\n" for path in files) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(directory / f"{name}-{version}-py3-none-any.whl", "w") as zf:
        for path, text in {**files, f"{dist}/RECORD": record}.items():
            zf.writestr(path, text)


def matrix(tmp_path: Path, version: str, lock: Path) -> Path:
    cell = {
        "id": CELL,
        "base": "debian-bookworm",
        "arch": "none",
        "runner": ["self-hosted"],
        "install": {
            "requirements": {"sptiny": {"version": version, "index": "pypi"}},
            "lock": str(lock),
            "python_version": "3.11",
            "python_platform": "x86_64-manylinux_2_28",
        },
        "serve": {"model": {"source": "path:/hello.txt"}},
    }
    directory = tmp_path / f"m-{version}"
    directory.mkdir()
    return write_matrix(directory / "matrix.yaml", extra_cells=[cell])


def start(path: Path, wheels: Path, tmp_path: Path) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "STACKPROOF_JOB": JOB,
        "STACKPROOF_MIRRORS": f"pypi={wheels},pytorch-cpu={wheels}",
        "UV_OFFLINE": "1",
        "UV_CACHE_DIR": str(tmp_path / "uv-cache"),
    }
    argv = [sys.executable, "-m", "pipeline", "lock", CELL, "--matrix", str(path), "--images", str(IMAGES), "--json"]
    return subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_locks_racing_to_one_file_leave_it_whole_and_valid(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    deps = tuple(f"spdep{i}" for i in range(30))  # a lock of some size, so a torn write would show
    for dep in deps:
        wheel(wheels, dep, "1.0")
    for version in ("1.0", "2.0"):
        wheel(wheels, "sptiny", version, deps[: 10 if version == "1.0" else 30])
    lock = tmp_path / "locks" / f"{CELL}.lock.json"
    lock.parent.mkdir()
    matrices = [matrix(tmp_path, version, lock) for version in ("1.0", "2.0")]
    reads, torn = 0, []
    for _ in range(ROUNDS):
        procs = [start(path, wheels, tmp_path) for path in matrices]
        deadline = time.monotonic() + 120
        try:
            while any(p.poll() is None for p in procs):
                assert time.monotonic() < deadline, "a lock took longer than 120 s"
                if lock.exists():
                    text = lock.read_text()
                    reads += 1
                    try:
                        json.loads(text)
                    except ValueError:
                        torn.append(len(text))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait(timeout=10)
        outputs = [p.communicate(timeout=10) for p in procs]
        for p, (_, stderr) in zip(procs, outputs, strict=True):
            assert p.returncode == 0, stderr[-3000:]
            assert "Traceback" not in stderr
        document = json.loads(lock.read_text())
        versions = {p["name"]: p["version"] for p in document["packages"]}
        assert versions["sptiny"] in ("1.0", "2.0") and len(versions) == (11 if versions["sptiny"] == "1.0" else 31)
        assert all(p["hashes"] and all(h.startswith("sha256:") for h in p["hashes"]) for p in document["packages"])
        assert [p.name for p in lock.parent.iterdir()] == [lock.name]  # no temporary file left
    assert reads > 0 and not torn, f"{len(torn)} of {reads} reads saw a torn lock (sizes {torn[:5]})"

    # The other way: a lock that cannot resolve (no wheel of the pinned version) fails, and the
    # lock file the race left stays as it was, whole.
    before = lock.read_bytes()
    failing = start(matrix(tmp_path, "3.0", lock), wheels, tmp_path)
    try:
        _, stderr = failing.communicate(timeout=120)
    finally:
        if failing.poll() is None:
            failing.kill()
            failing.wait(timeout=10)
    assert failing.returncode != 0 and "Traceback" not in stderr, stderr[-2000:]
    assert lock.read_bytes() == before and [p.name for p in lock.parent.iterdir()] == [lock.name]
