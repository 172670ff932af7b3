"""Issue 16 items 5 and 7: runs and builds never share a directory or a log; `--stages ,` is usage."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from pipeline.build.image import BUILT_MARK, _build_log, link_build_log
from pipeline.errors import InputError
from pipeline.matrix.model import Matrix
from stackproof.runjob import _run_dir, exclusive_dir
from verify.stages.runner import parse_stages


def test_runs_started_in_one_second_get_their_own_directories(real_matrix: Matrix, tmp_path: Path) -> None:
    cell = real_matrix.cell("cpu-tiny")
    dirs: list[Path] = []
    threads = [threading.Thread(target=lambda: dirs.append(_run_dir(tmp_path, cell))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(dirs)) == 8 and all(d.is_dir() and d.parent == tmp_path / "cpu-tiny" for d in dirs)


def test_exclusive_dir_numbers_the_next_one(tmp_path: Path) -> None:
    assert exclusive_dir(tmp_path, "run-x").name == "run-x"
    assert exclusive_dir(tmp_path, "run-x").name == "run-x-2"


def test_each_build_has_its_own_log_and_build_log_names_the_newest(tmp_path: Path) -> None:
    first, second = _build_log(tmp_path), _build_log(tmp_path)
    assert first != second and first.is_file() and second.is_file()
    assert not (tmp_path / "build.log").exists(), "a build that has not finished is not the newest build"
    link_build_log(tmp_path, "stackproof/c:1", second)
    assert (tmp_path / "build.log").resolve() == second.resolve()


def _finished(log: Path, tag: str | None, mtime: float) -> Path:
    log.write_text("#1 [internal] load build definition\n" + (f"{BUILT_MARK}{tag} sha256:abc\n" if tag else "ERROR\n"))
    os.utime(log, (mtime, mtime))
    return log


def test_a_skipped_build_points_build_log_at_the_log_that_built_its_tag_never_a_failed_one(tmp_path: Path) -> None:
    good = _finished(tmp_path / "build-20261201T100000.log", "stackproof/c:1", 100)
    _finished(tmp_path / "build-20261201T110000.log", None, 200)  # a later --force build that failed
    (tmp_path / "build.log").symlink_to("build-20261201T110000.log")  # as an older version left it
    assert link_build_log(tmp_path, "stackproof/c:1") == good
    assert (tmp_path / "build.log").resolve() == good.resolve()


def test_a_skipped_build_with_no_log_of_its_own_here_removes_build_log(tmp_path: Path) -> None:
    _finished(tmp_path / "build-20261201T100000.log", "stackproof/c:other", 100)
    (tmp_path / "build.log").symlink_to("build-20261201T100000.log")
    assert link_build_log(tmp_path, "stackproof/c:1") is None
    assert not (tmp_path / "build.log").exists() and not (tmp_path / "build.log").is_symlink()


@pytest.mark.parametrize("text", [",", " , ,", ""])
def test_stages_naming_nothing_is_a_usage_error(text: str) -> None:
    if text == "":
        assert parse_stages(text)  # not given: every available stage
        return
    with pytest.raises(InputError, match="name at least one stage"):
        parse_stages(text)
