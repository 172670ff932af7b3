"""`--compile-cache` of ab, bisect and sweep (stackproof/compilecompare.py `command_compile_cache`).

On the H100 (2026-12-07, tests/fixtures/gpu_ab/h100-ab-interrupted/), `stackproof ab` of a host cell
started three servers (A, B, A again "on the caches now warm") and each spent 113-117 s in vLLM's
engine init: every server had a home of its own, so the restart warmed nothing. With no cache given
and none set by the site, a command whose plan restarts a side now gives its servers one cache for
the run; given one (or `none`), it uses that; either way the environment is as it was afterwards.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pipeline.matrix.compilecache import ENV_NAME, compile_cache_from_env
from stackproof.cli import main
from stackproof.compilecompare import command_compile_cache

GPU_CELL = "h200-vllm-0.26.0-tiny"


def test_a_restarting_plan_without_a_cache_gets_one_for_the_run_and_its_restart_starts_warm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(ENV_NAME, raising=False)
    with command_compile_cache(None, out=tmp_path, restarts=True, command="ab") as own:
        assert own is not None and own.parent == tmp_path and os.environ[ENV_NAME] == str(own)
        cache = compile_cache_from_env(os.environ)  # what each Server reads when it is made
        assert cache is not None
        first = cache.use("/tmp/venv/bin/python")
        (first.slot / "flashinfer" / "built.so").write_bytes(b"\0")  # what a start leaves there
        restart = cache.use("/tmp/venv/bin/python")
        assert not first.warm and restart.warm and restart.slot == first.slot
    assert ENV_NAME not in os.environ and not own.exists()
    assert f"ab: compile/JIT cache for this run: {own} (removed after" in capsys.readouterr().err


def test_no_restart_or_a_site_cache_adds_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_NAME, raising=False)
    with command_compile_cache(None, out=tmp_path / "a", restarts=False, command="sweep") as own:
        assert own is None and ENV_NAME not in os.environ
    site = tmp_path / "site"
    monkeypatch.setenv(ENV_NAME, str(site))
    with command_compile_cache(None, out=tmp_path / "b", restarts=True, command="ab") as own:
        assert own is None and os.environ[ENV_NAME] == str(site)
    assert not (tmp_path / "b").exists() and os.environ[ENV_NAME] == str(site)


@pytest.mark.parametrize("given", ["dir", "none"])
def test_a_given_cache_or_none_wins_for_the_command_and_the_site_setting_comes_back(
    given: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_NAME, str(tmp_path / "site"))
    directory = tmp_path / "mine" if given == "dir" else Path("none")
    with command_compile_cache(directory, out=tmp_path / "out", restarts=True, command="bisect") as own:
        assert own is None and os.environ[ENV_NAME] == str(directory)
        assert (compile_cache_from_env(os.environ) is None) == (given == "none")
    assert os.environ[ENV_NAME] == str(tmp_path / "site") and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["ab", GPU_CELL, GPU_CELL, "--python", "/usr/bin/python3"],
        ["sweep", GPU_CELL, "--sweep", "concurrency=1,2", "--python", "/usr/bin/python3"],
        [
            "bisect",
            GPU_CELL,
            "--package",
            "stackproof-planted",
            "--good",
            "1.0",
            "--bad",
            "8.0",
            "--index",
            "http://127.0.0.1:9/simple",
            "--python",
            "/usr/bin/python3",
        ],
    ],
    ids=["ab", "sweep", "bisect"],
)
def test_a_compile_cache_that_is_a_file_is_exit_2_before_anything_is_built(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "cache"
    a_file.write_text("not a directory\n")
    assert main([*argv, "--compile-cache", str(a_file), "--out", str(tmp_path / "out"), "--json"]) == 2
    assert "--compile-cache: STACKPROOF_COMPILE_CACHE: " in json.loads(capsys.readouterr().out)["error"]["message"]
    assert not (tmp_path / "out").exists()
