"""The host runtime for real: `cpu-tiny-host` built and verified as the runner user (a process
group of real vLLM 0.28.0 CPU servers, no container), then the tool interrupted (SIGINT: it ends
its server before exit 130) and killed (SIGKILL: its server outlives it, carrying the run's mark,
and `stackproof gc` ends the whole group). Nothing of a run may be left: no marked process, no
member of its process group, nothing listening on its port.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pipeline.host.proc import Marked, group_members, marked_processes
from tests.integration.conftest import COLD, JOB, REPO, python_as, runner_dir, stackproof
from tests.launch import launched

pytestmark = pytest.mark.integration

CELL = "cpu-tiny-host"
URL = re.compile(r"server process group (?P<run>\S+) on http://127\.0\.0\.1:(?P<port>\d+)")


def listening(port: int) -> bool:
    """A socket of any owner listening on 127.0.0.1:port (the kernel's table: state 0A is LISTEN)."""
    wanted = f"0100007F:{port:04X}"
    rows = (line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:])
    return any(row[1] == wanted and row[3] == "0A" for row in rows)


def of_run(run: str) -> list[Marked]:
    return [m for m in marked_processes() if m.run == run]


def wait_for(predicate: Callable[[], object], timeout: float, what: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            pytest.fail(
                f"the tool exited ({proc.returncode}) before {what}: {proc.stderr.read() if proc.stderr else ''}"
            )
        time.sleep(0.5)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")


class Tool:
    """`stackproof verify` as the runner user in the background, its stderr followed for the server
    line; `python` is the tool's own process (runuser stays its parent), the one a signal goes to."""

    def __init__(self, user: str | None, out: Path) -> None:
        argv, env = python_as(
            user, ["-m", "stackproof", "verify", CELL, "--stages", "startup", "--out", str(out)], {**os.environ}
        )
        env["STACKPROOF_JOB"] = JOB
        # COLD: killed or interrupted before or around readiness, it gains nothing from the compile
        # cache, and a kill during vLLM's non-atomic cache write must not break the session's slot.
        env.update(COLD)
        # Through the launcher: SIGINT reaches the tool as KeyboardInterrupt even when the suite was
        # started with it ignored (a background job); the launcher execs, so the pid is the same.
        self.proc = subprocess.Popen(
            launched(argv), cwd=REPO, env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        self.via_runuser = argv[0] == "runuser"
        self.lines: list[str] = []

    def server(self, timeout: float = 120) -> tuple[str, int]:
        assert self.proc.stderr is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line and self.proc.poll() is not None:
                pytest.fail(f"the tool exited ({self.proc.returncode}) before starting a server: {self.lines[-20:]}")
            self.lines.append(line)
            found = URL.search(line)
            if found:
                return found["run"], int(found["port"])
        pytest.fail("no server line within the timeout")

    def python_pid(self) -> int:
        """The tool's python: the owner every marked process names (STACKPROOF_OWNER=host:pid:start)."""
        return _only_child(self.proc.pid) if self.via_runuser else self.proc.pid

    def finish(self, timeout: float = 120) -> int:
        try:
            _, rest = self.proc.communicate(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        self.lines.append(rest or "")
        sys.stderr.write("".join(self.lines)[-8000:])
        return self.proc.returncode


def _only_child(pid: int) -> int:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


@pytest.fixture
def out(runner_user: str | None) -> Iterator[Path]:
    path = runner_dir(runner_user, "host")
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


@pytest.fixture(scope="module")
def built(runner_user: str | None) -> str | None:
    """The cell's environment, built once for the module as the runner user (its own cache)."""
    logs = runner_dir(runner_user, "host-build")
    try:
        done = stackproof(["build", CELL, "--out", str(logs)], user=runner_user, timeout=1200)
    finally:
        subprocess.run(["rm", "-rf", str(logs)], check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "host environment built in" in done.stderr or "is built (same content)" in done.stderr
    return runner_user


def test_cpu_tiny_host_passes_as_the_runner_user_and_leaves_nothing(built: str | None, out: Path) -> None:
    done = stackproof(["verify", CELL, "--out", str(out), "--json"], user=built, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    verdict = json.loads(done.stdout)
    ran = {s["stage"]: s["status"] for s in verdict["stages"]}
    assert ran["imports"] == ran["startup"] == ran["load"] == "PASS", ran
    receipt = json.loads(next(out.glob(f"{CELL}/run-*/receipt.json")).read_text())
    assert receipt["image"]["runtime"] == "host" and receipt["image"]["id_is"] == "environment"
    assert receipt["image"]["environment"]["source"] == "local"  # built by `built`, found by its content
    assert receipt["image"]["environment"]["digest"] == receipt["image"]["id"]
    run, port = URL.search(done.stderr).group("run", "port")  # type: ignore[union-attr]
    assert of_run(run) == [] and not listening(int(port))


def test_sigint_ends_the_server_before_exit_130(built: str | None, out: Path) -> None:
    tool = Tool(built, out)
    run, port = tool.server()
    wait_for(lambda: of_run(run), 60, "the server's marked processes", tool.proc)
    pgid = of_run(run)[0].pgid
    os.kill(tool.python_pid(), signal.SIGINT)
    assert tool.finish() == 130
    assert of_run(run) == [] and group_members(pgid) == [] and not listening(port)


def test_sigkill_leaves_a_marked_group_that_gc_ends(built: str | None, out: Path) -> None:
    tool = Tool(built, out)
    run, port = tool.server()
    wait_for(lambda: len(of_run(run)) >= 2, 90, "the API server and its engine", tool.proc)
    pgid = of_run(run)[0].pgid
    os.kill(tool.python_pid(), signal.SIGKILL)
    tool.finish()
    time.sleep(1)
    orphans = of_run(run)
    try:
        assert orphans, "the server went with the tool: nothing for gc to find"  # SIGKILL runs no cleanup
        assert {m.pgid for m in orphans} == {pgid}
        done = stackproof(["gc", "--json"], user=built, timeout=120)
        assert done.returncode == 0, done.stderr
        assert run in json.loads(done.stdout)["host_runs_ended"]
        assert of_run(run) == [] and group_members(pgid) == [] and not listening(port)
    finally:
        for m in of_run(run):  # a failed assertion must not leave the server behind
            os.killpg(m.pgid, signal.SIGKILL)
