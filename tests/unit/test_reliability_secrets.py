"""Issue 16 item 3: index credentials never reach a process's argv or a message.

The install script runs with a stand-in python that records its argv, and with the real pip
against a closed port on 127.0.0.1 (pip then says where it looked, redacted: proof it read the
location from the secret file, not from its argv)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline import cmd
from pipeline.build.image import index_options
from pipeline.build.lock import resolve_lock
from pipeline.errors import InputError
from pipeline.matrix.model import Matrix
from pipeline.matrix.site import Mirror, load_site

REPO = Path(__file__).resolve().parents[2]
TOKEN = "tok3nS3cretValue42"
URL = f"http://user:{TOKEN}@127.0.0.1:9/simple"


def _script_env(tmp_path: Path, location: str) -> dict[str, str]:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "index-pypi").write_text(index_options(Mirror(index="pypi", location=location)))
    return {**os.environ, "STACKPROOF_SECRETS_DIR": str(secrets)}


def test_the_install_script_keeps_the_index_url_out_of_argv(tmp_path: Path) -> None:
    recorder = tmp_path / "python"
    argv_file = tmp_path / "argv"
    recorder.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {argv_file}\n')
    recorder.chmod(0o755)
    requirements = tmp_path / "req.txt"
    requirements.write_text("six==1.16.0\n")
    env = _script_env(tmp_path, URL)
    script = REPO / "images" / "pip-install.sh"
    subprocess.run(["sh", str(script), str(recorder), "pypi", str(requirements)], env=env, check=True, timeout=30)
    argv = argv_file.read_text()
    assert TOKEN not in argv and "127.0.0.1" not in argv
    assert f"-r\n{tmp_path}/secrets/index-pypi\n-r\n{requirements}\n" in argv


def test_real_pip_reads_the_location_from_the_secret_file(tmp_path: Path) -> None:
    requirements = tmp_path / "req.txt"
    requirements.write_text("six==1.16.0\n")
    env = _script_env(tmp_path, URL)
    script = REPO / "images" / "pip-install.sh"
    result = subprocess.run(
        ["sh", str(script), sys.executable, "pypi", str(requirements), "--dry-run", "--retries", "0", "--timeout", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0  # nothing listens on port 9
    assert "Looking in indexes: http://user:****@127.0.0.1:9/simple" in output
    assert TOKEN not in output


def test_the_secret_file_is_pip_options() -> None:
    assert (
        index_options(Mirror(index="x", location="https://a:b@h.example/s")) == "--index-url https://a:b@h.example/s\n"
    )
    assert index_options(Mirror(index="x", location="/wheels")) == "--no-index\n--find-links /tmp/stackproof/wheels/x\n"
    plain = index_options(Mirror(index="x", location="http://t@h.example:8080/s"))
    assert plain.splitlines()[1] == "--trusted-host h.example:8080"


@pytest.mark.parametrize(
    "value",
    [
        f"https://user:{TOKEN}@mirror.example/simple",  # no INDEX=
        f"pypi{TOKEN}@mirror.example=https://x.example",  # an unknown index name holding a token
        f"user:{TOKEN}@mirror.example/simple=/nowhere",
        f"pypi=/no/such/dir/user:{TOKEN}@x",
        f"pypi=https://user:{TOKEN}@mirror.example/a b",
    ],
)
def test_malformed_mirrors_never_print_the_token(real_matrix: Matrix, value: str) -> None:
    with pytest.raises(InputError) as info:
        load_site(real_matrix, {"STACKPROOF_MIRRORS": value})
    assert "STACKPROOF_MIRRORS" in str(info.value)
    assert TOKEN not in str(info.value)


def test_lock_passes_index_urls_to_uv_through_its_environment(
    real_matrix: Matrix, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    def fake_run(argv: list[str], **kwargs: Any) -> cmd.CommandResult:
        seen["argv"], seen["env"] = argv, kwargs.get("env") or {}
        return cmd.CommandResult(argv=tuple(argv), returncode=0, stdout="", stderr="", seconds=0.0)

    monkeypatch.setattr(cmd, "run", fake_run)
    site = load_site(real_matrix, {"STACKPROOF_MIRRORS": f"pypi=https://user:{TOKEN}@mirror.example/simple"})
    cell = next(c for c in real_matrix.cells if c.install is not None)
    resolve_lock(real_matrix, cell, site)
    assert not any(TOKEN in a for a in seen["argv"])
    assert TOKEN in seen["env"]["UV_INDEX_URL"]
