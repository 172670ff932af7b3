"""Issue 16 item 12: containers of dead runs are found by their owner labels (pure part)."""

from __future__ import annotations

import os
import socket
import subprocess

from pipeline.docker.gc import Owned, dead_containers, owner_labels, owner_start_time, process_alive


def test_owner_labels_name_this_process() -> None:
    labels = dict(label.split("=", 1) for label in owner_labels({"STACKPROOF_JOB": "ci-42"}))
    assert labels["io.stackproof.owner-pid"] == str(os.getpid())
    assert labels["io.stackproof.owner-host"] == socket.gethostname()
    assert labels["io.stackproof.owner-start"] == owner_start_time(os.getpid())
    assert labels["io.stackproof.job"] == "ci-42"


def test_dead_containers_are_this_hosts_with_a_gone_owner() -> None:
    rows = [
        Owned(id="1", name="mine-dead", host="h", pid="100", start="5"),
        Owned(id="2", name="mine-alive", host="h", pid="200", start="7"),
        Owned(id="3", name="other-host", host="g", pid="100", start="5"),
        Owned(id="4", name="garbled", host="h", pid="x", start=""),
    ]
    dead = dead_containers(rows, host="h", alive=lambda pid, start: pid == 200)
    assert [c.name for c in dead] == ["mine-dead"]


def test_process_alive_sees_a_finished_process_and_a_reused_pid() -> None:
    child = subprocess.Popen(["true"])
    child.wait()
    assert not process_alive(child.pid, "")
    me = os.getpid()
    assert process_alive(me, owner_start_time(me) or "")
    assert not process_alive(me, "1")  # same pid, another start time: a reused pid
