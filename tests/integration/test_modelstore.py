"""The model store for real: huggingface_hub fills it from a stand-in hub, vLLM serves from it offline.

The hub itself is not reachable from here, so a stand-in hub on 127.0.0.1 (tests/standin_hub.py)
serves the cpu-tiny image's own tiny model as `stackproof-test/tiny-llama` at one commit. The
variant cell `cpu-tiny-hf` is cpu-tiny with that `hf:` model: the same image (tagged under the
variant's content tag, nothing built), served from the store mounted read-only, hub off.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.build.plan import plan_cell
from pipeline.docker.client import Docker
from pipeline.matrix.read import load_matrix
from pipeline.matrix.site import load_site
from tests.integration.conftest import REPO, containers, docker_cmd, stackproof, write_matrix
from tests.standin_hub import StandInHub, stand_in_hub

pytestmark = pytest.mark.integration

REPO_ID = "stackproof-test/tiny-llama"
CANARY = "hf_stackproofcanary0123456789abcdefTOKEN"  # a made-up token: it must never show up in our outputs
WRONG_REVISION = "5f1e0c9d2b7a4e6f8a3c1b0d9e8f7a6b5c4d3e2f"  # 40 hex the stand-in hub does not have
VARIANT = "cpu-tiny-hf"
WRONG = "cpu-tiny-hf-wrong-revision"


@pytest.fixture(scope="module")
def tiny_model_files(cpu_tiny: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The tiny model's files, copied out of the cpu-tiny image (a created, never started, container)."""
    out = tmp_path_factory.mktemp("tiny-model")
    name = f"stackproof-test-copy-{os.getpid()}"
    docker_cmd("create", "--name", name, "--entrypoint", "/bin/true", cpu_tiny)
    try:
        docker_cmd("cp", f"{name}:/models/tiny-llama", str(out))
    finally:
        docker_cmd("rm", "--force", name, check=False)
    root = out / "tiny-llama"
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def hub(tiny_model_files: dict[str, bytes]) -> Iterator[StandInHub]:
    with stand_in_hub(REPO_ID, tiny_model_files) as running:
        yield running


@pytest.fixture
def variant_matrix(cpu_tiny: str, hub: StandInHub, tmp_path: Path) -> Iterator[Path]:
    """The real matrix plus two cpu-tiny variants serving the stand-in hub's model; each variant's
    content tag points at the cpu-tiny image (the serve spec is not image content), removed after."""
    cells: list[dict[str, object]] = [
        {
            "id": cell_id,
            "extends": "cpu-tiny",
            "description": "cpu-tiny serving its tiny model as an hf: model from the model store, offline",
            "serve": {"model": {"source": f"hf:{REPO_ID}", "revision": revision}},
        }
        for cell_id, revision in ((VARIANT, hub.revision), (WRONG, WRONG_REVISION))
    ]
    matrix_file = write_matrix(tmp_path / "matrix.yaml", extra_cells=cells, eager=True)
    matrix = load_matrix(matrix_file, images_dir=REPO / "images")
    tags = [plan_cell(matrix, matrix.cell(c), load_site(matrix), REPO / "images").tag for c in (VARIANT, WRONG)]
    for tag in tags:
        docker_cmd("tag", cpu_tiny, tag)
    try:
        yield matrix_file
    finally:
        for tag in tags:
            docker_cmd("rmi", tag, check=False)


def _cli(args: list[str], matrix: Path, env: dict[str, str], timeout: float = 900) -> Any:
    return stackproof([*args, "--matrix", str(matrix), "--images", str(REPO / "images")], env=env, timeout=timeout)


def test_fetch_then_serve_offline_from_the_store(
    docker: Docker, hub: StandInHub, variant_matrix: Path, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    env = {"HF_ENDPOINT": hub.url, "STACKPROOF_MODEL_STORE": str(store), "HF_TOKEN": CANARY}
    env["HF_HUB_OFFLINE"] = ""  # the host side must reach the stand-in hub even if the caller's shell is offline

    # 1. The first fetch downloads every byte, through huggingface_hub, into its own layout.
    started = time.monotonic()
    first = _cli(["model", "fetch", VARIANT, "--json"], variant_matrix, env, timeout=300)
    fetch_wall = time.monotonic() - started
    assert first.returncode == 0, first.stderr[-3000:]
    fetched = first.json()
    assert fetched["bytes_downloaded"] == hub.total_bytes == hub.file_bytes_sent > 4_000_000
    assert fetched["files"] == len(hub.files) and fetched["revision"] == hub.revision
    snapshot = _assert_the_store_layout(store, hub, fetched)
    assert any("Bearer " + CANARY in seen for seen in hub.token_seen), "huggingface_hub sends HF_TOKEN itself"
    assert "bytes downloaded in" in first.stderr

    # 2. A second fetch downloads nothing and asks the stand-in hub for no file.
    sent = hub.file_bytes_sent
    started = time.monotonic()
    second = _cli(["model", "fetch", VARIANT, "--json"], variant_matrix, env, timeout=120)
    second_wall = time.monotonic() - started
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.json()["bytes_downloaded"] == 0 and hub.file_bytes_sent == sent

    # 3. The server starts from the store, offline: the stand-in hub is up but asked nothing.
    requests_before = len(hub.requests)
    seen: dict[str, Any] = {}
    watcher = _inspect_server_when_it_appears(f"io.stackproof.cell={VARIANT}", seen)
    out = tmp_path / "out"
    since = time.time() - 1
    # -v: the docker command lines are echoed (the token's name must be there, its value nowhere).
    result = _cli(
        ["verify", VARIANT, "--stages", "imports,startup", "--json", "-v", "--out", str(out)], variant_matrix, env
    )
    watcher.join(timeout=30)
    assert result.returncode == 0, result.stderr[-5000:]
    assert len(hub.requests) == requests_before, (
        f"the server or the tool asked the hub: {hub.requests[requests_before:]}"
    )
    assert len(docker.created_since(since, "io.stackproof.role=server")) == 1
    startup = {s["stage"]: s for s in result.json()["stages"]}["startup"]
    checks = {c["name"]: c for c in startup["checks"]}
    assert startup["status"] == "PASS", startup
    completion = checks["completion"]["evidence"]
    assert completion["completion_tokens"] == 16
    log = Path(startup["artifacts"]["server_log"]).read_text()
    assert "HF_HUB_OFFLINE is True, replace model_id" in log and str(hub.revision) in log
    assert f"in the store ({snapshot})" in result.stderr

    _assert_the_server_container_ran_offline(seen, store)

    # The token's value is in no argv we echoed and no file we wrote; its name is.
    for text in (first.stderr, second.stderr, result.stderr, result.stdout):
        assert CANARY not in text
    assert "--env HF_TOKEN " in result.stderr
    leaked = [p for p in out.rglob("*") if p.is_file() and CANARY.encode() in p.read_bytes()]
    assert leaked == [], f"the token's value is in {leaked}"
    assert containers(f"io.stackproof.cell={VARIANT}") == []

    readiness = float(checks["readiness"]["evidence"]["seconds"])
    print(
        f"\nMEASURED stand-in hub fetch: {fetched['bytes_downloaded']:,} bytes in {fetched['seconds']}s "
        f"(command {fetch_wall:.1f}s); second fetch: {second.json()['bytes_downloaded']} bytes "
        f"(command {second_wall:.1f}s); offline server ready in {readiness}s"
    )


def test_wrong_revision_fails_before_any_server_starts(
    docker: Docker, hub: StandInHub, variant_matrix: Path, tmp_path: Path
) -> None:
    env = {"HF_ENDPOINT": hub.url, "STACKPROOF_MODEL_STORE": str(tmp_path / "store"), "HF_HUB_OFFLINE": ""}
    since = time.time() - 1
    result = _cli(["verify", WRONG, "--stages", "imports,startup", "--out", str(tmp_path / "out")], variant_matrix, env)
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"revision {WRONG_REVISION} of {REPO_ID} does not exist at the hub" in result.stderr
    assert f"cells[{WRONG}].serve.model" in result.stderr and "Traceback" not in result.stderr
    assert docker.created_since(since, f"io.stackproof.cell={WRONG}") == [], "no container may start"
    assert not (tmp_path / "out").exists()


def test_missing_model_without_a_reachable_hub_is_exit_3(docker: Docker, variant_matrix: Path, tmp_path: Path) -> None:
    """--no-fetch never asks; a dead endpoint (a closed port on 127.0.0.1) is named with HF_ENDPOINT."""
    closed = _closed_port()
    env = {"HF_ENDPOINT": f"http://127.0.0.1:{closed}", "STACKPROOF_MODEL_STORE": str(tmp_path / "s")}
    env["HF_HUB_OFFLINE"] = ""
    since = time.time() - 1
    args = ["verify", VARIANT, "--stages", "imports,startup", "--out", str(tmp_path / "out")]
    no_fetch = _cli([*args, "--no-fetch"], variant_matrix, env)
    assert no_fetch.returncode == 3, no_fetch.stderr[-3000:]
    assert "not in the model store" in no_fetch.stderr and "fetching is off" in no_fetch.stderr
    unreachable = _cli(args, variant_matrix, env, timeout=300)
    assert unreachable.returncode == 3, unreachable.stderr[-3000:]
    assert "unreachable" in unreachable.stderr and "HF_ENDPOINT" in unreachable.stderr
    assert "Traceback" not in no_fetch.stderr + unreachable.stderr
    assert docker.created_since(since, f"io.stackproof.cell={VARIANT}") == []


def _assert_the_store_layout(store: Path, hub: StandInHub, fetched: dict[str, Any]) -> Path:
    """huggingface_hub's own layout: every file in the snapshot, a link into blobs/; the snapshot's path."""
    repo_dir = store / "models--stackproof-test--tiny-llama"
    snapshot = repo_dir / "snapshots" / hub.revision
    assert Path(fetched["snapshot"]) == snapshot
    assert {p.name for p in snapshot.iterdir()} == set(hub.files)
    assert all((snapshot / name).is_symlink() for name in hub.files), "snapshots/ links into blobs/"
    assert len(list((repo_dir / "blobs").iterdir())) == len(hub.files)
    return snapshot


def _assert_the_server_container_ran_offline(seen: dict[str, Any], store: Path) -> None:
    """The container: the store read-only at the fixed path, the hub off, the token passed by name."""
    assert "inspect" in seen, "the server container was never seen running"
    config = seen["inspect"]
    mounts = [m for m in config["Mounts"] if m["Destination"] == "/stackproof/models"]
    assert len(mounts) == 1 and mounts[0]["RW"] is False and Path(mounts[0]["Source"]) == store.resolve()
    container_env = dict(e.split("=", 1) for e in config["Config"]["Env"])
    assert container_env["HF_HUB_OFFLINE"] == "1" and container_env["TRANSFORMERS_OFFLINE"] == "1"
    assert container_env["HF_HUB_CACHE"] == "/stackproof/models"
    # docker copied the value from the CLI's environment (`--env HF_TOKEN`); inspect shows it: docker's doing.
    assert container_env["HF_TOKEN"] == CANARY


def _inspect_server_when_it_appears(label: str, seen: dict[str, Any], timeout: float = 600) -> threading.Thread:
    """`docker inspect` the cell's server container once it runs (the run removes it at its end)."""

    def watch() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ids = docker_cmd(
                "ps", "--quiet", "--filter", f"label={label}", "--filter", "label=io.stackproof.role=server"
            )
            if ids.split():
                out = docker_cmd("inspect", ids.split()[0], check=False)
                if out.strip():
                    seen["inspect"] = json.loads(out)[0]
                    return
            time.sleep(0.5)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
