"""Fixtures for the unit tier: no docker, no network, only files under tmp_path.

Matrices under test are written as small YAML texts; `line_of` finds the line a marker sits on so
an expected `FILE:LINE: path: message` can be spelled out exactly without counting lines by hand.
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline.errors import MatrixError
from pipeline.matrix.model import Matrix
from pipeline.matrix.read import load_matrix

REPO = Path(__file__).resolve().parents[2]

# A small valid matrix; tests append cells to it or replace parts of it.
HEADER = """\
schema_version: 1
indexes:
  pypi: {url: "https://pypi.org/simple"}
  extra: {url: "https://extra.example/simple"}
bases:
  img:
    image: "example/img:1.0"
    digest: "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
"""


def line_of(text: str, marker: str, nth: int = 1) -> int:
    """1-based line of the `nth` line of `text` that contains `marker`."""
    hits = [i for i, line in enumerate(text.splitlines(), start=1) if marker in line]
    assert len(hits) >= nth, f"marker {marker!r} not found {nth} time(s) in the test matrix"
    return hits[nth - 1]


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def images_dir() -> Path:
    return REPO / "images"


@pytest.fixture(scope="session")
def real_matrix(images_dir: Path) -> Matrix:
    return load_matrix(REPO / "matrix.yaml", images_dir=images_dir)


@pytest.fixture
def tmp_images(tmp_path: Path) -> Path:
    """A private copy of images/ (templates and recipes) that a test may change."""
    target = tmp_path / "images"
    shutil.copytree(REPO / "images", target, ignore=shutil.ignore_patterns(".ruff_cache", "__pycache__"))
    return target


@pytest.fixture
def write_matrix(tmp_path: Path) -> Callable[[str], Path]:
    """Write a (dedented) matrix text to tmp_path/matrix.yaml and return its path."""

    def write(text: str, name: str = "matrix.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return write


@pytest.fixture
def load(write_matrix: Callable[[str], Path], images_dir: Path) -> Callable[..., Matrix]:
    """Write and load a matrix text (images default to the real images/)."""

    def load_text(text: str, images: Path | None = None) -> Matrix:
        return load_matrix(write_matrix(text), images_dir=images or images_dir)

    return load_text


@dataclass(frozen=True)
class Invalid:
    """The problems an invalid matrix produced, and a way to name a line of it."""

    file: Path
    text: str
    problems: list[str]

    def at(self, marker: str, nth: int = 1) -> str:
        """`FILE:LINE` of the `nth` line holding `marker`: the prefix of a located problem."""
        return f"{self.file}:{line_of(self.text, marker, nth)}"


@pytest.fixture
def header() -> str:
    return HEADER


@pytest.fixture
def invalid(write_matrix: Callable[[str], Path], images_dir: Path) -> Callable[..., Invalid]:
    """Write a matrix text that must be invalid; return its problems (MatrixError.problems)."""

    def collect(text: str, images: Path | None = None) -> Invalid:
        path = write_matrix(text)
        with pytest.raises(MatrixError) as info:
            load_matrix(path, images_dir=images or images_dir)
        return Invalid(file=path, text=path.read_text(), problems=info.value.problems)

    return collect


@pytest.fixture(autouse=True)
def _private_cache_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit tests never write into the user's ~/.cache/stackproof."""
    monkeypatch.setenv("STACKPROOF_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "stackproof-cache"))
