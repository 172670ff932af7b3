"""pipeline/host/proc.py on real processes: a marked process group (a parent and the child it forks,
as vLLM's API server forks its engine) is found by its mark, judged dead when its owner is gone,
and ended whole; a live owner's run is never touched."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest

from pipeline.host.proc import OWNER_ENV, RUN_ENV, dead_runs, end_run, group_members, marked_processes

# A parent that forks a child and both sleep: the shape of an API server and its engine.
FAMILY = "import os, time\nif os.fork() == 0:\n    time.sleep(120)\nelse:\n    time.sleep(120)\n"


@pytest.fixture
def family() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    run = f"test-{uuid.uuid4().hex[:8]}"
    dead_owner = f"{socket.gethostname()}:999999999:1"  # no such pid: the tool that started it is gone
    env = {**os.environ, RUN_ENV: run, OWNER_ENV: dead_owner}
    proc = subprocess.Popen([sys.executable, "-c", FAMILY], env=env, start_new_session=True)
    deadline = time.monotonic() + 10
    while len([m for m in marked_processes() if m.run == run]) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    yield run, proc
    end_run(run, pgid=proc.pid, grace_s=1)  # whatever the test did, nothing of it is left
    proc.wait(timeout=10)


def test_the_family_is_found_by_its_mark_and_its_group(family: tuple[str, subprocess.Popen[bytes]]) -> None:
    run, proc = family
    marked = [m for m in marked_processes() if m.run == run]
    assert len(marked) == 2 and {m.pgid for m in marked} == {proc.pid}  # its own session and group
    assert sorted(group_members(proc.pid)) == sorted(m.pid for m in marked)


def test_a_run_whose_owner_is_gone_is_dead_and_end_run_leaves_nothing(
    family: tuple[str, subprocess.Popen[bytes]],
) -> None:
    run, proc = family
    dead = dead_runs(marked_processes())
    assert run in dead and len(dead[run]) == 2
    ended = end_run(run, pgid=proc.pid, grace_s=5)
    assert len(ended) == 2
    assert proc.wait(timeout=10) == -15  # SIGTERM within the grace: no SIGKILL needed
    assert [m for m in marked_processes() if m.run == run] == [] and group_members(proc.pid) == []


def test_a_live_owner_is_never_judged_dead() -> None:
    from pipeline.docker.gc import owner_start_time

    run = f"test-{uuid.uuid4().hex[:8]}"
    me = f"{socket.gethostname()}:{os.getpid()}:{owner_start_time(os.getpid())}"
    env = {**os.environ, RUN_ENV: run, OWNER_ENV: me}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not [m for m in marked_processes() if m.run == run] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [m for m in marked_processes() if m.run == run]
        assert run not in dead_runs(marked_processes())
    finally:
        end_run(run, pgid=proc.pid, grace_s=1)
        proc.wait(timeout=10)
