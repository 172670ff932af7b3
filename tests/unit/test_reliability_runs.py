"""Issue 16 items 5 and 7: runs and builds never share a directory or a log; `--stages ,` is usage."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from pipeline.build import _build_log
from pipeline.errors import InputError
from pipeline.model import Matrix
from stackproof.runjob import _run_dir, exclusive_dir
from verify.runner import parse_stages


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
    assert (tmp_path / "build.log").resolve() == second.resolve()


@pytest.mark.parametrize("text", [",", " , ,", ""])
def test_stages_naming_nothing_is_a_usage_error(text: str) -> None:
    if text == "":
        assert parse_stages(text)  # not given: every available stage
        return
    with pytest.raises(InputError, match="name at least one stage"):
        parse_stages(text)
