"""Two `stackproof lock`s writing one cell's lock at once (issue 27, class 7: lost data): a reader
(a `verify` starting beside them) sees the old lock or a new one whole, never a truncated file.

A unit test with real processes and a real file: two forked writers call `write_lock` in a loop
(different documents, so a mix would show) while this process reads the file the whole time: for
one second in the quick tier, for three with --run-slow (CI), three processes busy all along.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import time
from pathlib import Path

import pytest

from pipeline.build.lock import Lock, LockedPackage, inputs_digest, read_lock, write_lock
from pipeline.matrix.model import Cell, Matrix


def _writer(cell: Cell, packages: int, until: float) -> None:
    assert cell.install is not None
    lock = Lock(
        cell="cpu-tiny",
        inputs_digest=inputs_digest(cell.install),
        packages=tuple(
            LockedPackage(name=f"p{i}", version=f"{packages}.0", index="pypi", hashes=(f"sha256:{i:064x}",))
            for i in range(packages)
        ),
    )
    while time.monotonic() < until:
        write_lock(cell, lock)


@pytest.mark.parametrize("seconds", [1.0, pytest.param(3.0, marks=pytest.mark.slow)])
def test_two_locks_racing_to_one_file_never_leave_a_torn_lock(
    real_matrix: Matrix, tmp_path: Path, seconds: float
) -> None:
    cell = real_matrix.cell("cpu-tiny")
    assert cell.install is not None
    cell = dataclasses.replace(cell, install=dataclasses.replace(cell.install, lock=tmp_path / "cpu-tiny.lock.json"))
    lock_path = cell.install.lock
    _writer(cell, 1, time.monotonic() + 0.01)  # the old lock, whole
    until = time.monotonic() + seconds
    context = multiprocessing.get_context("fork")
    writers = [context.Process(target=_writer, args=(cell, n, until)) for n in (300, 3000)]
    for w in writers:
        w.start()
    reads, torn = 0, []
    try:
        while time.monotonic() < until:
            text = lock_path.read_text()
            reads += 1
            try:
                json.loads(text)
            except ValueError:
                torn.append(len(text))
    finally:
        for w in writers:
            w.join(10)
    assert all(w.exitcode == 0 for w in writers)
    assert reads > 100 and not torn, f"{len(torn)} of {reads} reads saw a torn lock (sizes {torn[:5]})"
    assert {p.version for p in read_lock(cell).packages} in ({"300.0"}, {"3000.0"})
    assert [p.name for p in tmp_path.iterdir()] == ["cpu-tiny.lock.json"]  # no temporary file left
