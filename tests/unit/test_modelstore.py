"""The model store without docker: revision validation, the store's place, completeness and fetch
through the real huggingface_hub against a stand-in hub on 127.0.0.1, the server's mounts and env,
and the token kept out of every argv we echo."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from pipeline import cmd
from pipeline.console import console
from pipeline.errors import InfraError, InputError
from pipeline.host import modelstore
from pipeline.matrix.model import ModelSource, ServeSpec
from pipeline.matrix.read import load_matrix
from stackproof.cli import main
from tests.standin_hub import StandInHub, stand_in_hub
from tests.unit.fake_docker import RecordingDocker
from verify.stages.server import Server

REPO = Path(__file__).resolve().parents[2]
COMMIT = "0123456789abcdef0123456789abcdef01234567"
CANARY = "hf_unitcanary_value_never_printed"

MATRIX = """\
schema_version: 1
indexes:
  pypi: {url: "https://pypi.org/simple"}
bases:
  b: {image: "x/y:1", python: python3}
defaults: {platform: linux/amd64, arch: none, base: b}
cells:
  - id: c
    serve:
      model: MODEL
"""


def _matrix(tmp_path: Path, model: str) -> Path:
    path = tmp_path / "matrix.yaml"
    path.write_text(MATRIX.replace("MODEL", model))
    return path


def _serve(source: str, revision: str | None = None) -> ServeSpec:
    return ServeSpec(
        model=ModelSource(source=source, revision=revision),
        args=(),
        env=(("A", "1"),),
        readiness_timeout_s=60,
        shm_size="1g",
        gpus=None,
    )


# -- validation -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ('{source: "hf:org/name"}', "missing: hf:org/name needs the 40-hex commit hash it is served at"),
        ('{source: "hf:org/name", revision: main}', "'main' is not a commit hash (40 hex digits)"),
        ('{source: "hf:org/name", revision: "0123abc"}', "'0123abc' is not a commit hash"),
        (f'{{source: "hf:org/name", revision: "{COMMIT.upper()}"}}', "is not a commit hash"),
        (f'{{source: "path:/models/x", revision: "{COMMIT}"}}', "a path: model is part of the image and takes no"),
    ],
    ids=["hf-without-revision", "hf-branch", "hf-short-hash", "hf-uppercase", "path-with-revision"],
)
def test_bad_revision_is_a_located_error_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], model: str, message: str
) -> None:
    path = _matrix(tmp_path, model)
    assert main(["matrix", "validate", "--matrix", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:10: cells[0].serve.model.revision: " in err and message in err


@pytest.mark.parametrize(
    "model", [f'{{source: "hf:org/name", revision: "{COMMIT}"}}', '{source: "path:/models/x"}'], ids=["hf", "path"]
)
def test_good_model_sources_validate(tmp_path: Path, model: str) -> None:
    matrix = load_matrix(_matrix(tmp_path, model), images_dir=REPO / "images")
    source = matrix.cell("c").serve.model  # type: ignore[union-attr]
    assert source.revision == (COMMIT if source.kind == "hf" else None)


def test_the_project_matrix_pins_every_hf_model() -> None:
    matrix = load_matrix(REPO / "matrix.yaml")
    hf = [c for c in matrix.cells if c.serve and c.serve.model.kind == "hf"]
    assert hf and all(len(c.serve.model.revision or "") == 40 for c in hf if c.serve)


# -- where the store is, what a server container gets ------------------------------------------------


def test_store_is_under_the_cache_dir_unless_moved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STACKPROOF_CACHE_DIR", str(tmp_path / "cache"))
    assert modelstore.store_dir({}) == tmp_path / "cache" / "models"
    assert modelstore.store_dir({"STACKPROOF_MODEL_STORE": "/srv/models"}) == Path("/srv/models")


def test_hf_model_mounts_the_store_read_only_offline_and_the_token_by_name(tmp_path: Path) -> None:
    mounts = modelstore.model_mounts(_serve("hf:org/name", COMMIT), store=tmp_path, environ={"HF_TOKEN": CANARY})
    assert mounts.volumes == ((tmp_path.resolve(), "/stackproof/models"),)
    assert dict(mounts.env) == {
        "HF_HUB_CACHE": "/stackproof/models",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    assert "HF_HOME" not in dict(mounts.env), "HF_HOME stays writable inside the container"
    assert mounts.env_names == ("HF_TOKEN",) and CANARY not in repr(mounts), "the token by name, never its value"
    without = modelstore.model_mounts(_serve("hf:org/name", COMMIT), store=tmp_path, environ={})
    assert without.env_names == (), "no token on the host: none named"


def test_path_model_gets_no_store() -> None:
    assert modelstore.model_mounts(_serve("path:/models/x"), environ={"HF_TOKEN": CANARY}) == modelstore.ModelMounts()


@pytest.mark.parametrize("source", ["hf:org/name", "path:/models/tiny-llama"])
def test_server_argv_carries_the_store_for_hf_models_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], source: str
) -> None:
    monkeypatch.setenv("STACKPROOF_MODEL_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("HF_TOKEN", CANARY)
    cell = load_matrix(REPO / "matrix.yaml").cell("cpu-tiny")
    model = ModelSource(source=source, revision=COMMIT if "hf" in source else None)
    serve = dataclasses.replace(cell.serve, model=model, env=(("HF_HUB_OFFLINE", "0"),))  # type: ignore[arg-type]
    docker = RecordingDocker()
    cell = dataclasses.replace(cell, serve=serve)
    server = Server(docker, cell, "img", out_dir=tmp_path / "out")
    server.start()
    server.remove()
    run = next(c for c in docker.calls if c[0] == "run")
    text = " ".join(run)
    assert CANARY not in text + capsys.readouterr().err
    if source.startswith("hf:"):
        assert f"--volume {(tmp_path / 'store').resolve()}:/stackproof/models:ro" in text
        assert "--env HF_HUB_OFFLINE=1" in text and "--env HF_TOKEN" in text
        # the store's settings win over the cell's own env: a cell cannot switch the hub back on by accident
        assert "HF_HUB_OFFLINE=0" not in text
        assert run[run.index("--revision") + 1] == COMMIT
    else:
        assert "/stackproof/models" not in text and "HF_TOKEN" not in text


def test_cmd_passes_the_token_to_children_but_never_echoes_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`docker run --env HF_TOKEN` takes the value from docker's own environment: cmd.run must pass it on."""
    monkeypatch.setenv("HF_TOKEN", CANARY)
    monkeypatch.setattr(console(), "verbose", True)  # the echo is shown with -v only
    result = cmd.run(["sh", "-c", 'test "$HF_TOKEN" = "$1" && echo passed', "sh", CANARY[:4] + CANARY[4:]])
    assert result.stdout.strip() == "passed"
    quiet = cmd.run(["sh", "-c", 'test -n "$HF_TOKEN"', "--env", "HF_TOKEN"])
    assert quiet.returncode == 0
    echoed = capsys.readouterr().err
    assert "+ sh -c" in echoed and "--env HF_TOKEN" in echoed


# -- completeness and fetch, through huggingface_hub and a stand-in hub ----------------------------


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Any:
    files = {"config.json": b'{"model_type": "llama"}\n', "model.safetensors": os.urandom(300_000), "t/x.txt": b"x"}
    with stand_in_hub("stackproof-test/tiny", files) as running:
        monkeypatch.setenv("HF_ENDPOINT", running.url)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        yield running


def _model(hub: StandInHub, revision: str | None = None) -> ModelSource:
    return ModelSource(source=f"hf:{hub.repo_id}", revision=revision or hub.revision)


def test_fetch_fills_the_hub_layout_once_and_completeness_follows(hub: StandInHub, tmp_path: Path) -> None:
    store = tmp_path / "store"
    model = _model(hub)
    assert modelstore.snapshot_in_store(model, store) is None
    first = modelstore.fetch(model, store=store)
    assert first.bytes_downloaded == hub.total_bytes == hub.file_bytes_sent
    assert first.files == 3 and first.snapshot == store / "models--stackproof-test--tiny" / "snapshots" / hub.revision
    assert modelstore.snapshot_in_store(model, store) == first.snapshot
    second = modelstore.fetch(model, store=store)
    assert second.bytes_downloaded == 0 and hub.file_bytes_sent == hub.total_bytes
    # Another commit of the same repository is not in the store.
    assert modelstore.snapshot_in_store(_model(hub, COMMIT), store) is None


def test_a_cut_snapshot_is_incomplete_and_the_next_fetch_gets_only_what_is_missing(
    hub: StandInHub, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    model = _model(hub)
    snapshot = modelstore.fetch(model, store=store).snapshot
    (snapshot / "model.safetensors").resolve().unlink()
    (snapshot / "model.safetensors").unlink()
    assert modelstore.snapshot_in_store(model, store) is None, "huggingface_hub's file listing knows it is cut"
    again = modelstore.fetch(model, store=store)
    assert again.bytes_downloaded == len(hub.files["model.safetensors"])
    assert modelstore.snapshot_in_store(model, store) == snapshot


def test_a_stalled_download_times_out_and_resumes_where_it_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The library keeps what it received in whole chunks (10 MiB) and asks for the rest with a Range."""
    size = 24 << 20
    with stand_in_hub("stackproof-test/big", {"model.safetensors": os.urandom(size)}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "1")
        hub.stall_once = "model.safetensors"
        result = modelstore.fetch(_model(hub), store=tmp_path)
    assert result.bytes_downloaded == size
    gets = [p for m, p in hub.requests if m == "GET" and p.endswith("model.safetensors")]
    assert len(gets) == 2, "one stalled download, one resumed"
    assert size < hub.file_bytes_sent < size + size // 2, "the resumed download did not start over"
    assert modelstore.snapshot_in_store(_model(hub), tmp_path) == result.snapshot


def test_unknown_revision_or_repository_is_bad_input(hub: StandInHub, tmp_path: Path) -> None:
    with pytest.raises(InputError, match=f"revision {COMMIT} of stackproof-test/tiny does not exist at the hub"):
        modelstore.fetch(_model(hub, COMMIT), store=tmp_path, where="m.yaml:3: cells[c].serve.model")
    with pytest.raises(InputError, match="has no repository other/repo"):
        modelstore.fetch(ModelSource(source="hf:other/repo", revision=COMMIT), store=tmp_path)


def test_ensure_model_uses_the_store_and_refuses_to_fetch_when_told(hub: StandInHub, tmp_path: Path) -> None:
    model = _model(hub)
    assert modelstore.ensure_model(ModelSource(source="path:/m", revision=None), where="w", store=tmp_path) is None
    with pytest.raises(InfraError, match=r"is not in the model store .* fetching is off") as refused:
        modelstore.ensure_model(model, where="w", store=tmp_path, allow_fetch=False)
    assert refused.value.exit_code == 3 and hub.requests == [], "--no-fetch never asks the hub"
    fetched = modelstore.ensure_model(model, where="w", store=tmp_path)
    assert fetched is not None and fetched.bytes_downloaded == hub.total_bytes
    asked = len(hub.requests)
    present = modelstore.ensure_model(model, where="w", store=tmp_path, allow_fetch=False)
    assert present is not None and present.already_present and len(hub.requests) == asked


def test_model_fetch_command(hub: StandInHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _matrix(tmp_path, f'{{source: "hf:{hub.repo_id}", revision: "{hub.revision}"}}')
    store = tmp_path / "store"
    assert main(["model", "fetch", "c", "--matrix", str(path), "--store", str(store), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["fetched"] is True and document["bytes_downloaded"] == hub.total_bytes
    wrong = _matrix(tmp_path, f'{{source: "hf:{hub.repo_id}", revision: "{COMMIT}"}}')
    assert main(["model", "fetch", "c", "--matrix", str(wrong), "--store", str(store)]) == 2
    assert f"{wrong}:8: cells[c].serve.model: revision {COMMIT}" in capsys.readouterr().err
    local = _matrix(tmp_path, '{source: "path:/models/x"}')
    assert main(["model", "fetch", "c", "--matrix", str(local), "--store", str(store)]) == 0
    assert "nothing to fetch" in capsys.readouterr().out
