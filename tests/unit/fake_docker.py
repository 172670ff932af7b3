"""A real `Docker` whose docker CLI is never run: it records each command line the typed operations
put together (so unit tests see the real argv) and answers every call with `stdout`, exit code 0."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipeline import cmd
from pipeline.docker.client import Docker, DockerCli


class RecordingDocker(Docker):
    def __init__(self, stdout: str = "") -> None:
        super().__init__(DockerCli(path="docker", mode="classic-buildkit", version="20.10.24"))
        self.stdout = stdout
        self.calls: list[tuple[str, ...]] = []

    def _docker(self, *args: str, **_: Any) -> cmd.CommandResult:
        self.calls.append(args)
        return cmd.CommandResult(argv=args, returncode=0, stdout=self.stdout, stderr="", seconds=0.0)

    def follow_logs(self, name: str, on_line: Callable[[str], None], *, timeout: float) -> None:
        """No container, so no log: the follower ends at once."""


class ReplayDocker(RecordingDocker):
    """A RecordingDocker whose one container is running (`docker inspect` says so) and whose log is
    `log`'s lines, replayed to whoever follows it: a server container without docker, for the
    stages' unit tests (the HTTP side is tests/unit/fake_openai.py)."""

    def __init__(self, log: str) -> None:
        super().__init__(stdout="running 0")
        self.log = log

    def follow_logs(self, name: str, on_line: Callable[[str], None], *, timeout: float) -> None:
        for line in self.log.splitlines():
            on_line(line)

    def container_pids(self, container: str) -> list[int]:
        return []
