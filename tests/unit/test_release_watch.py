"""`matrix propose --new`'s scan (stackproof/releasewatch.py) against a local index on 127.0.0.1:
nothing new until a release appears, then exactly it; an unreadable index is said so."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.version import Version

from pipeline.matrix.read import load_matrix
from pipeline.matrix.site import Mirror
from pipeline.releases.simpleindex import list_versions
from stackproof.releasewatch import matrix_newest, pr_body, scan
from tests.release_index import local_index, release_wheel

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def matrix():  # type: ignore[no-untyped-def]
    return load_matrix(REPO / "matrix.yaml", images_dir=REPO / "images")


def test_the_matrix_newest_are_its_release_images_and_pins(matrix) -> None:  # type: ignore[no-untyped-def]
    assert matrix_newest(matrix) == {"vllm": "0.34.0", "sglang": "0.5.23", "flashinfer-python": "0.7.4"}


def test_a_release_appearing_on_the_index_is_found_and_nothing_before(matrix, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    release_wheel(tmp_path, "vllm", "0.34.0", ["torch==2.14.0"])
    release_wheel(tmp_path, "sglang", "0.5.23", [], tag="cp312-cp312")
    release_wheel(tmp_path, "flashinfer-python", "0.7.4", [], tag="py3-none")
    with local_index(tmp_path) as url:
        unchanged: dict[tuple[str, str], tuple[Version, ...]] = {}  # what no release is added to: asked once

        def lister(index: str, package: str) -> tuple[Version, ...]:
            if (index, package) in unchanged:
                return unchanged[(index, package)]
            found = list_versions(Mirror(index=index, location=url), package, python="3.12", machine="x86_64")
            if package != "vllm":
                unchanged[(index, package)] = found
            return found

        before = scan(matrix, lister)
        assert before.new == () and before.unreadable == ()
        release_wheel(tmp_path, "vllm", "0.35.0", ["torch==2.14.0"])
        release_wheel(tmp_path, "vllm", "0.36.0rc1", ["torch==2.14.0"])  # a pre-release: not proposed
        after = scan(matrix, lister)
    assert [(r.package, r.version, r.newest_in_matrix) for r in after.new] == [("vllm", "0.35.0", "0.34.0")]
    body = pr_body(after, [], seconds=1.5)
    assert "- vllm 0.35.0 (index `pypi`; the matrix's newest: 0.34.0)" in body


def test_an_index_that_cannot_be_read_is_named_not_taken_as_nothing_new(matrix) -> None:  # type: ignore[no-untyped-def]
    def lister(index: str, package: str) -> tuple[Version, ...]:
        where = Mirror(index=index, location="http://127.0.0.1:9")  # the discard port: refused
        return list_versions(where, package, python="3.12", machine="x86_64")

    found = scan(matrix, lister)
    assert found.new == ()
    assert len(found.unreadable) == 4 and all("unreachable" in u for u in found.unreadable)
    assert "- not read: index pypi for vllm" in pr_body(found, [], seconds=0.1)
