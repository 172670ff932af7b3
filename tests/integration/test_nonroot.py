"""Files a root container writes, read by the tool running as an ordinary user (a CI runner's).

The vLLM image runs as root and FlashInfer saves its autotune cache through `tempfile.mkstemp`
(mode 0600) then `os.replace`. A real container of the cpu-tiny image writes a real FlashInfer
cache file (an H200 run's, from tests/fixtures) exactly that way, once into an anonymous volume
(how the tool runs servers now) and once into a host bind mount (how it did before). Then the
tool's own code, run as the runner user, must read the first through docker and judge it, and the
second must be unreadable and undeletable to that user: the failure the change removes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from pipeline.docker.client import Docker
from tests.integration.conftest import REPO, docker_cmd, python_as, runner_dir

pytestmark = pytest.mark.integration

FIXTURE = REPO / "tests" / "fixtures" / "autotune" / "h200-fi0.6.18.post1-cudnn9.19-two-shapes.json"
# What FlashInfer's save_configs does (0.6.18.post1 autotuner.py L2619, L2639), in the container.
WRITE_LIKE_FLASHINFER = """
import os, shutil, tempfile
for root in ("/stackproof/autotune-cache", "/stackproof/bind"):
    os.makedirs(f"{root}/abc123", exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=f"{root}/abc123", suffix=".tmp")
    with os.fdopen(fd, "w") as out, open("/stackproof/fixture.json") as src:
        shutil.copyfileobj(src, out)
    os.replace(tmp, f"{root}/abc123/autotune_configs.json")
print("written", oct(os.stat("/stackproof/autotune-cache/abc123/autotune_configs.json").st_mode & 0o777))
"""
# Run as the runner user: the tool's code path (Docker.copy_out, judge_fresh_cache), then the old one.
READ_AS_RUNNER = """
import json, shutil, sys
from pathlib import Path
from pipeline.docker.client import Docker
from pipeline.matrix.read import load_matrix
from verify.stages.autotune import CACHE_MOUNT, judge_fresh_cache
from verify.logs.logscan import Facts

name, out, bind = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
result = {}
try:
    (bind / "abc123" / "autotune_configs.json").read_text()
    result["bind_read"] = "ok"
except PermissionError as exc:
    result["bind_read"] = f"PermissionError: {exc.strerror}"
try:
    shutil.rmtree(bind / "abc123")
    result["bind_rmtree"] = "ok"
except PermissionError as exc:
    result["bind_rmtree"] = f"PermissionError: {exc.strerror}"
copied = Docker.connect().copy_out(name, CACHE_MOUNT, out / "autotune-cache")
matrix = load_matrix(Path("matrix.yaml"), images_dir=Path("images"))
cell = matrix.cell("sm120-vllm-0.28.0-fi-0.6.18.post1-cu130")
log = f"INFO Using FlashInfer autotune cache file: {CACHE_MOUNT}/abc123/autotune_configs.json\\n"
facts = Facts(serve=True, arch="sm90", flashinfer="0.6.18.post1", cudnn=91900)
checks = judge_fresh_cache(cell, log, out / "autotune-cache", out, facts=facts, env={})
result["copied"] = copied
result["checks"] = {c.name: str(c.status) for c in checks}
result["entries"] = next(c.evidence["entries"] for c in checks if c.name == "autotune-cache")
shutil.rmtree(out / "autotune-cache")  # the runner's own copy: it can clean up
result["cleaned"] = not (out / "autotune-cache").exists()
print(json.dumps(result))
"""


def test_runner_reads_a_root_written_0600_cache_only_through_docker(
    docker: Docker, cpu_tiny: str, runner_user: str | None
) -> None:
    if runner_user is None and os.geteuid() == 0:
        pytest.skip("needs an ordinary user")
    name = f"stackproof-test-nonroot-{uuid.uuid4().hex[:8]}"
    out = runner_dir(runner_user, "nonroot-out")
    bind = Path(os.environ.get("TMPDIR", "/tmp")) / f"stackproof-nonroot-bind-{uuid.uuid4().hex[:8]}"
    bind.mkdir(mode=0o755)
    try:
        docker_cmd(
            "run", "--detach", "--name", name, "--network", "none", "--label", "io.stackproof.role=test",
            "--volume", "/stackproof/autotune-cache", "--volume", f"{bind}:/stackproof/bind",
            "--volume", f"{FIXTURE}:/stackproof/fixture.json:ro", "--entrypoint", "/opt/venv/bin/python",
            cpu_tiny, "-c", WRITE_LIKE_FLASHINFER + "\nimport time; time.sleep(600)",
        )  # fmt: skip
        _wait_written(bind / "abc123" / "autotune_configs.json")
        assert oct((bind / "abc123" / "autotune_configs.json").stat().st_mode & 0o777) == "0o600"
        assert (bind / "abc123").stat().st_uid == 0  # root-owned, as on a real runner
        result = _as_runner(runner_user, [READ_AS_RUNNER, name, str(out), str(bind)])
        # The old way fails for the runner user, both reading and cleaning up ...
        assert result["bind_read"].startswith("PermissionError"), result
        assert result["bind_rmtree"].startswith("PermissionError"), result
        # ... the tool's way reads the cache, judges it and cleans up after itself.
        assert result["copied"] is True and result["entries"] == len(
            [k for k in json.loads(FIXTURE.read_text()) if not k.startswith("_")]
        )
        assert result["checks"]["autotune-cache"] == "PASS" and result["cleaned"] is True
    finally:
        docker_cmd("rm", "--force", "--volumes", name, check=False)
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(bind, ignore_errors=True)  # root-owned: this (root) test process removes it


def test_copy_out_of_a_path_the_container_lacks_is_false(docker: Docker, cpu_tiny: str, tmp_path: Path) -> None:
    name = f"stackproof-test-nocache-{uuid.uuid4().hex[:8]}"
    docker_cmd("create", "--name", name, "--label", "io.stackproof.role=test", "--entrypoint", "/bin/true", cpu_tiny)
    try:
        assert docker.copy_out(name, "/stackproof/autotune-cache", tmp_path / "copy") is False
        assert not (tmp_path / "copy").exists()
    finally:
        docker_cmd("rm", "--force", name, check=False)


def _wait_written(path: Path) -> None:
    import time

    deadline = time.monotonic() + 60
    while not path.exists():
        assert time.monotonic() < deadline, f"the container did not write {path} within 60 s"
        time.sleep(0.2)


def _as_runner(user: str | None, args: list[str]) -> dict[str, object]:
    argv, env = python_as(user, ["-c", *args], dict(os.environ))
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]
