"""The release-pin Dockerfile reader (pipeline/releases/dockerfile.py) on a real vLLM docker/Dockerfile.

The fixture is upstream's file byte for byte (tests/fixtures/dockerfile/README.md names the commit):
the synthetic lines of test_propose.py show the reader's rules; this shows they hold on the whole
file upstream writes, continuation lines, heredocs, `case` arms and all. Both ways: what the file
sets is read (its CUDA version, no overrides, since it writes no uv override file), and copies
mangled the way a careless edit would be are bad input naming the line, or read as the edit says.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from pipeline.errors import InputError
from pipeline.releases import pins as pins_module
from pipeline.releases import table as table_module
from pipeline.releases.dockerfile import read_dockerfile
from pipeline.releases.table import Release, release_from_json
from stackproof.cli import main

REPO = Path(__file__).resolve().parents[2]
REAL = REPO / "tests" / "fixtures" / "dockerfile" / "vllm-dead20baf-docker-Dockerfile"
# Where the file installs its kernel packages: pinned installs, not overrides (line 331-333 there).
KERNELS = "    uv pip install --system flashinfer-cubin==0.4.1 \\\n"
# v0.28.0's way of pinning past the metadata (pipeline/releases/dockerfile.py's docstring), spliced in
# just before the runtime stage's installs.
SPLICE_AT = "# Install vllm wheel first, so that torch etc will be installed.\n"
OVERRIDE = (
    'RUN echo "flashinfer-jit-cache==${FI_VERSION}" > /etc/uv-overrides.txt\nENV UV_OVERRIDE=/etc/uv-overrides.txt\n'
)


def test_the_real_file_gives_its_cuda_version_and_no_overrides() -> None:
    text = REAL.read_text()
    assert "ARG CUDA_VERSION=12.9.1\n" in text and KERNELS in text  # what the file says, read by eye
    facts = read_dockerfile(REAL)
    assert facts.require_cuda == "cuda>=12.9"
    assert facts.args == (("CUDA_VERSION", "12.9.1"),)
    # flashinfer-cubin/-jit-cache 0.4.1, apache-tvm-ffi 0.1.0b15 and the arm64 torch nightly are
    # installed by pinned commands, and `echo ... >> /etc/environment` is no install's file: none of
    # them is an override of the wheels' metadata.
    assert facts.overrides == ()
    assert facts.source == f"{REAL.name} (given with --dockerfile)"


def test_an_override_spliced_into_the_real_file_is_read_with_its_arg(tmp_path: Path) -> None:
    path = tmp_path / "Dockerfile"
    path.write_text(REAL.read_text().replace(SPLICE_AT, "ARG FI_VERSION=0.4.1\n" + OVERRIDE + SPLICE_AT, 1))
    facts = read_dockerfile(path)
    assert facts.overrides == (("flashinfer-jit-cache", "0.4.1"),)
    assert facts.args == (("CUDA_VERSION", "12.9.1"), ("FI_VERSION", "0.4.1"))


def test_a_mangled_copy_whose_override_has_no_arg_is_bad_input_naming_the_line(tmp_path: Path) -> None:
    text = REAL.read_text()
    path = tmp_path / "Dockerfile"
    path.write_text(text.replace(SPLICE_AT, OVERRIDE + SPLICE_AT, 1))  # the ARG line lost in an edit
    line = text[: text.index(SPLICE_AT)].count("\n") + 1
    with pytest.raises(InputError, match=rf"Dockerfile:{line}: \$\{{FI_VERSION\}} is not set"):
        read_dockerfile(path)


def test_a_mangled_copy_whose_override_is_a_range_is_bad_input(tmp_path: Path) -> None:
    path = tmp_path / "Dockerfile"
    ranged = OVERRIDE.replace("==${FI_VERSION}", ">=0.4.1")
    path.write_text(REAL.read_text().replace(SPLICE_AT, ranged + SPLICE_AT, 1))
    with pytest.raises(InputError, match="not an exact pin"):
        read_dockerfile(path)


def test_a_copy_that_is_not_text_is_bad_input(tmp_path: Path) -> None:
    path = tmp_path / "Dockerfile"
    path.write_bytes(REAL.read_bytes()[:4000] + b"\xff\xfe\x00garbage")
    with pytest.raises(InputError, match=r"Dockerfile:\d+: the Dockerfile is not UTF-8 text"):
        read_dockerfile(path)


# -- the command ---------------------------------------------------------------------------------------


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> list[Release]:
    """`matrix pins refresh` with the 0.33.0 wheels' real metadata (kept in tests/fixtures) in place of
    the index, and the table write captured instead of rewriting pipeline/releases/release_pins.json."""
    metadata = REPO / "tests" / "fixtures" / "pins" / "pypi-metadata-vllm-0.33.0.json"
    release = release_from_json(json.loads(metadata.read_text()))
    monkeypatch.setattr(pins_module, "fetch_release", lambda version, platforms, fetch, **_: release)
    written: list[Release] = []
    monkeypatch.setattr(table_module, "write_release", lambda r, path=None: written.append(r))
    return written


def refresh(dockerfile: Path) -> int:
    matrix = str(REPO / "matrix.yaml")
    images = str(REPO / "images")
    return main(
        [
            "matrix",
            "pins",
            "refresh",
            "vllm==0.33.0",
            "--dockerfile",
            str(dockerfile),
            "--matrix",
            matrix,
            "--images",
            images,
        ]
    )


def test_pins_refresh_reads_the_real_file_into_the_release_entry(offline: list[Release]) -> None:
    assert refresh(REAL) == 0
    (release,) = offline
    assert release.version == "0.33.0" and release.dockerfile is not None
    assert release.dockerfile.require_cuda == "cuda>=12.9" and release.dockerfile.overrides == ()


def test_pins_refresh_on_a_mangled_copy_exits_2_and_writes_nothing(offline: list[Release], tmp_path: Path) -> None:
    path = tmp_path / "Dockerfile"
    path.write_text(REAL.read_text().replace(SPLICE_AT, OVERRIDE + SPLICE_AT, 1))
    assert refresh(path) == 2
    assert offline == []


@pytest.fixture
def before_033(tmp_path: Path) -> Path:
    """The real matrix without its v0.33.0 base and cells, nor the later ones that extend them (as
    tests/unit/test_propose.py makes it)."""
    text = (REPO / "matrix.yaml").read_text()
    text = re.sub(r"(?ms)^  vllm-openai-0\.3[34]\.0:\n.*?(?=^  \S|^\S)", "", text)
    blocks = re.split(r"(?m)^(?=  - id: )", text)
    later = ("-vllm-0.33.0-", "-vllm-0.34.0-")
    text = "".join(
        b for b in blocks if not b.startswith("  - id: sm12") or not any(v in b.split("\n")[0] for v in later)
    )
    (tmp_path / "matrix.yaml").write_text(text)
    shutil.copytree(REPO / "locks", tmp_path / "locks")
    return tmp_path / "matrix.yaml"


def test_propose_takes_the_base_cuda_from_the_real_file(
    before_033: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The table is a copy here: the command writes the release's entry and reads it back.
    metadata = REPO / "tests" / "fixtures" / "pins" / "pypi-metadata-vllm-0.33.0.json"
    release = release_from_json(json.loads(metadata.read_text()))
    monkeypatch.setattr(pins_module, "fetch_release", lambda version, platforms, fetch, **_: release)
    table = tmp_path / "release_pins.json"
    shutil.copy(table_module.TABLE, table)
    real_write, real_load = table_module.write_release, table_module.load_table.__wrapped__
    monkeypatch.setattr(table_module, "write_release", lambda r, path=table: real_write(r, table))
    copy = functools.cache(lambda path=table: real_load(table))  # write_release clears it, as the real one
    for module in (table_module, pins_module):
        monkeypatch.setattr(module, "load_table", copy)
    images = str(REPO / "images")
    args = ["matrix", "propose", "vllm==0.33.0", "--dockerfile", str(REAL), "--no-audit"]
    assert main([*args, "--matrix", str(before_033), "--images", images]) == 0
    base = yaml.safe_load(before_033.read_text())["bases"]["vllm-openai-0.33.0"]
    assert base["require_cuda"] == "cuda>=12.9"  # this file's ARG CUDA_VERSION, not the 0.28 base's
    assert f"From ARG CUDA_VERSION of {REAL.name}" in before_033.read_text()
    assert table_module.TABLE.read_text() != table.read_text()  # the copy was written, the repo's not
