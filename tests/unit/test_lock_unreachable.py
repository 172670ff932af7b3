"""`stackproof lock` with the real uv: an index it cannot reach is infrastructure (exit 3, naming the
index by name, never its URL), a resolution that fails on what the index holds stays exit 1."""

from __future__ import annotations

import shutil
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from stackproof.cli import main

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _signals(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("STACKPROOF_MATRIX", raising=False)
    monkeypatch.setenv("STACKPROOF_CA_BUNDLE", "none")
    handler = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, handler)


def closed_port() -> int:
    with socket.socket() as s:  # bound then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def matrix(tmp_path: Path) -> Path:
    """A copy of the project's matrix, so that a lock written by mistake lands in tmp_path."""
    shutil.copy(REPO / "matrix.yaml", tmp_path / "matrix.yaml")
    shutil.copytree(REPO / "locks", tmp_path / "locks")
    shutil.copytree(REPO / "images", tmp_path / "images")
    return tmp_path / "matrix.yaml"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is a run-time dependency; not on PATH here")
def test_an_unreachable_index_is_exit_3_naming_it(
    matrix: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = "s3cret-token"
    mirrors = (
        f"pypi=http://user:{secret}@127.0.0.1:{closed_port()}/simple,pytorch-cpu=http://127.0.0.1:{closed_port()}/s"
    )
    monkeypatch.setenv("STACKPROOF_MIRRORS", mirrors)
    before = (matrix.parent / "locks" / "cpu-tiny.lock.json").read_bytes()
    assert main(["lock", "cpu-tiny", "--matrix", str(matrix)]) == 3
    err = capsys.readouterr().err
    assert "could not reach index 'pypi'" in err or "could not reach index 'pytorch-cpu'" in err
    assert "STACKPROOF_MIRRORS=NAME=URL|DIR" in err and secret not in err and "Traceback" not in err
    assert (matrix.parent / "locks" / "cpu-tiny.lock.json").read_bytes() == before  # nothing written


@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is a run-time dependency; not on PATH here")
def test_a_resolution_that_fails_on_the_index_content_stays_exit_1(
    matrix: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    monkeypatch.setenv("STACKPROOF_MIRRORS", f"pypi={empty},pytorch-cpu={empty}")
    assert main(["lock", "cpu-tiny", "--matrix", str(matrix)]) == 1
    err = capsys.readouterr().err
    assert "could not reach" not in err and "Traceback" not in err
