"""Keeping up with vLLM releases: the release-pin table, the Dockerfile's overrides, `matrix propose`.

The table's metadata is the real Requires-Dist text of the vllm 0.28.0 and 0.33.0 wheels (and of the
torch each pins), fetched once and kept in tests/fixtures (repro/pypi-metadata-vllm-0.28.0.json,
pins/pypi-metadata-vllm-0.33.0.json); the pins are re-derived from it here. The cache tests run pip
itself against a stand-in index on 127.0.0.1 (tiny wheels whose METADATA carries that real text)
and count the requests it receives.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from pipeline.errors import InputError
from pipeline.matrix.read import load_matrix
from pipeline.releases.dockerfile import read_dockerfile
from pipeline.releases.pins import builtin_releases, derive, release_pins
from pipeline.releases.table import PLATFORMS, load_table, release_from_json
from stackproof.cli import main

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
IMAGES = str(REPO / "images")
METADATA = {
    "0.28.0": FIXTURES / "repro" / "pypi-metadata-vllm-0.28.0.json",
    "0.33.0": FIXTURES / "pins" / "pypi-metadata-vllm-0.33.0.json",
}


# -- the table is what the wheels said ---------------------------------------------------------------


@pytest.mark.parametrize("version", sorted(METADATA))
@pytest.mark.parametrize("platform", PLATFORMS)
def test_table_holds_the_wheels_own_requires_dist(version: str, platform: str) -> None:
    fixture = release_from_json(json.loads(METADATA[version].read_text()))
    table = load_table()[version]
    assert table.requires("vllm", platform) == fixture.requires("vllm", platform)
    assert table.requires("torch", platform) == fixture.requires("torch", platform)
    assert derive(table, platform) == derive(fixture, platform) == builtin_releases(platform)[version]


def test_033_pins_are_re_derived_from_its_metadata() -> None:
    fixture = release_from_json(json.loads(METADATA["0.33.0"].read_text()))
    pins = derive(fixture, "linux/amd64")
    # shared/reference/upstream-0.33-drift.md section 1, read here from the lines themselves
    assert (pins["flashinfer-python"], pins["torch"], pins["torchvision"]) == ("0.7.2.post1", "2.14.0", "0.29.0")
    assert (pins["nvidia-cudnn-cu13"], pins["nvidia-nccl-cu13"]) == ("9.24.0.43", "2.30.7")
    assert pins["nvidia-cutlass-dsl"] == "4.8.0" and pins["xgrammar"] == "0.2.8"
    assert "triton" not in pins  # torch 2.14.0 requires triton~=3.8.0: a range, not a pin
    assert "zentorch" not in pins  # extra == "zen": no extra is installed in the image
    old = derive(release_from_json(json.loads(METADATA["0.28.0"].read_text())), "linux/amd64")
    assert (old["flashinfer-python"], old["torch"], old["nvidia-cudnn-cu13"]) == ("0.6.16.post3", "2.13.0", "9.20.0.48")


def test_release_pins_of_033_need_no_network_and_say_the_dockerfile_was_not_read() -> None:
    pins, source = release_pins("0.33.0", "linux/arm64", online=False)
    assert pins is not None and source.startswith("release-pin table")
    assert pins.get("flashinfer-cubin") == "0.7.2.post1" and pins.get("flashinfer-jit-cache") == "0.7.2.post1+cu130"
    assert any("Dockerfile was not read" in note for note in pins.notes)
    old, _ = release_pins("0.28.0", "linux/amd64", online=False)
    assert old is not None and old.get("nvidia-nccl-cu13") == "2.30.7" and not old.notes


# -- the release Dockerfile ---------------------------------------------------------------------------

# The lines pipeline/releases/pins.py quotes from v0.28.0's docker/Dockerfile (release commit 2cf0a691), in
# the order the file has them; CUDA_VERSION as the cu130 image has it.
DOCKERFILE = """\
ARG CUDA_VERSION=13.0.1
FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu22.04 AS vllm-base
ARG CUDA_VERSION
ARG NCCL_VERSION=2.30.7
# Pin NCCL past torch's own requirement
RUN CUDA_MAJOR="${CUDA_VERSION%%.*}" && \\
    echo "nvidia-nccl-cu${CUDA_MAJOR}==${NCCL_VERSION}" > /etc/uv-overrides.txt
ENV UV_OVERRIDE=/etc/uv-overrides.txt
RUN uv pip install --system -r requirements/cuda.txt
"""


def test_dockerfile_overrides_and_cuda_are_read_from_its_args(tmp_path: Path) -> None:
    path = tmp_path / "Dockerfile"
    path.write_text(DOCKERFILE)
    facts = read_dockerfile(path)
    assert facts.overrides == (("nvidia-nccl-cu13", "2.30.7"),)
    assert dict(facts.args) == {"CUDA_MAJOR": "13", "CUDA_VERSION": "13.0.1", "NCCL_VERSION": "2.30.7"}
    assert facts.require_cuda == "cuda>=13.0"


def test_an_override_file_no_install_reads_is_no_override(tmp_path: Path) -> None:
    path = tmp_path / "Dockerfile"
    path.write_text(DOCKERFILE.replace("ENV UV_OVERRIDE=/etc/uv-overrides.txt\n", ""))
    assert read_dockerfile(path).overrides == ()


def test_an_override_on_an_unset_variable_is_bad_input_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "Dockerfile"
    path.write_text(DOCKERFILE.replace("ARG NCCL_VERSION=2.30.7\n", ""))
    with pytest.raises(InputError, match=rf"{re.escape(str(path))}:5: \$\{{NCCL_VERSION\}} is not set"):
        read_dockerfile(path)


# -- matrix propose -----------------------------------------------------------------------------------


@pytest.fixture
def before_033(tmp_path: Path) -> Path:
    """The real matrix as it was before its v0.33.0 cells: the bases and the cells of 0.33.0 and later removed."""
    text = (REPO / "matrix.yaml").read_text()
    text = re.sub(r"(?ms)^  vllm-openai-0\.3[34]\.0:\n.*?(?=^  \S|^\S)", "", text)
    blocks = re.split(r"(?m)^(?=  - id: )", text)
    later = ("-vllm-0.33.0-", "-vllm-0.34.0-")
    text = "".join(
        b for b in blocks if not b.startswith("  - id: sm12") or not any(v in b.split("\n")[0] for v in later)
    )
    (tmp_path / "matrix.yaml").write_text(text)
    shutil.copytree(REPO / "locks", tmp_path / "locks")
    load_matrix(tmp_path / "matrix.yaml", images_dir=REPO / "images")  # still valid without them
    return tmp_path / "matrix.yaml"


def test_propose_writes_033_cells_with_the_028_models_and_args(before_033: Path) -> None:
    assert (
        main(["matrix", "propose", "--images", IMAGES, "vllm==0.33.0", "--matrix", str(before_033), "--no-audit"]) == 0
    )
    matrix = load_matrix(before_033, images_dir=REPO / "images")
    new = {c.id: c for c in matrix.cells if "-vllm-0.33.0-" in c.id}
    assert set(new) == {"sm120-vllm-0.33.0-release", "sm121-vllm-0.33.0-release"}
    pairs = {"sm120": "sm120-vllm-0.28.0-release", "sm121": "sm121-vllm-0.28.0-fi-0.6.18.post1-cu130"}
    for cell in new.values():
        old = matrix.cell(pairs[cell.arch])
        assert cell.serve is not None and old.serve is not None
        assert (cell.serve.model, cell.serve.args, cell.arms) == (old.serve.model, old.serve.args, old.arms)
        assert cell.base.name == "vllm-openai-0.33.0" and cell.expect is None and cell.overrides == ()
        assert (cell.platform, cell.runner) == (old.platform, old.runner)
    base = yaml.safe_load(before_033.read_text())["bases"]["vllm-openai-0.33.0"]
    assert base["image"] == "vllm/vllm-openai:v0.33.0" and base["require_cuda"] == "cuda>=13.0"
    # A second proposal of the same release finds its cells there: bad input, the file unchanged.
    text = before_033.read_text()
    assert (
        main(["matrix", "propose", "--images", IMAGES, "vllm==0.33.0", "--matrix", str(before_033), "--no-audit"]) == 2
    )
    assert before_033.read_text() == text


def test_propose_with_flashinfer_overrides_the_trio_next_to_the_release_cells(before_033: Path) -> None:
    assert (
        main(["matrix", "propose", "--images", IMAGES, "vllm==0.33.0", "--matrix", str(before_033), "--no-audit"]) == 0
    )
    args = [
        "matrix",
        "propose",
        "--images",
        IMAGES,
        "vllm==0.33.0",
        "flashinfer-python==0.7.4",
        "--matrix",
        str(before_033),
    ]
    assert main([*args, "--no-audit"]) == 0
    matrix = load_matrix(before_033, images_dir=REPO / "images")
    cell = matrix.cell("sm120-vllm-0.33.0-fi-0.7.4-cu130")
    assert {o.name: (o.version, o.index) for o in cell.overrides} == {
        "flashinfer-python": ("0.7.4", "pypi"),
        "flashinfer-cubin": ("0.7.4", "flashinfer"),
        "flashinfer-jit-cache": ("0.7.4+cu130", "flashinfer-cu130"),
    }
    ids = [c.id for c in matrix.cells]
    assert ids.index("sm120-vllm-0.33.0-fi-0.7.4-cu130") == ids.index("sm121-vllm-0.33.0-release") + 1
    assert sum(b.name == "vllm-openai-0.33.0" for b in matrix.bases) == 1  # the base is reused


@pytest.mark.parametrize(
    "specs",
    [["vllm=0.33.0"], ["vllm>=0.33"], ["numpy==2.0"], ["flashinfer-python==0.7.4"], ["vllm==0.33.0.dev1"]],
)
def test_a_bad_spec_exits_2_and_writes_nothing(before_033: Path, specs: list[str]) -> None:
    text = before_033.read_text()
    assert main(["matrix", "propose", "--images", IMAGES, *specs, "--matrix", str(before_033), "--no-audit"]) == 2
    assert before_033.read_text() == text


def test_dry_run_prints_the_cells_and_writes_nothing(before_033: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = before_033.read_text()
    assert (
        main(
            [
                "matrix",
                "propose",
                "--images",
                IMAGES,
                "vllm==0.33.0",
                "--matrix",
                str(before_033),
                "--dry-run",
                "--no-audit",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "  - id: sm120-vllm-0.33.0-release\n    extends: sm120-vllm-0.28.0-release\n" in out
    assert before_033.read_text() == text
