"""The docker runtime: each server a container, reached through `pipeline.docker.client.Docker`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.cmd import CommandResult
from pipeline.docker.client import Container, Docker
from verify.forensics.cpucost import CpuReader, reader_for

__all__ = ["PY_SPY_IN_SIDECAR", "DockerRuntime"]

PY_SPY_IN_SIDECAR = "/stackproof-tools/py-spy"


@dataclass(frozen=True)
class DockerRuntime:
    docker: Docker
    kind: str = "docker"

    def start(self, container: Container) -> None:
        self.docker.start(container)

    def run_to_end(self, container: Container, *, timeout: float) -> CommandResult:
        return self.docker.run_to_end(container, timeout=timeout)

    def state(self, name: str) -> tuple[str, int]:
        return self.docker.container_state(name)

    def follow_logs(self, name: str, on_line: Callable[[str], None], *, timeout: float) -> None:
        self.docker.follow_logs(name, on_line, timeout=timeout)

    def exec(self, name: str, argv: Sequence[str], *, timeout: float = 30) -> CommandResult:
        return self.docker.exec(name, argv, timeout=timeout)

    def copy_out(self, name: str, path: str, dest: Path) -> bool:
        return self.docker.copy_out(name, path, dest)

    def seen_as(self, name: str, path: str) -> str:
        return path  # inside the container, a container path is itself

    def pids(self, name: str) -> list[int]:
        return self.docker.container_pids(name)

    def cpu_reader(self, name: str) -> CpuReader | str:
        # A container is a cgroup: its CPU time counts every process in it, workers included.
        return reader_for(lambda: self.docker.container_pid(name))

    def dump_stacks(
        self, name: str, *, image: str, script: Sequence[str], py_spy: Path, timeout: float
    ) -> CommandResult:
        """In a sidecar of the server's image that shares its PID namespace with ptrace rights."""
        argv = ["python3", *(PY_SPY_IN_SIDECAR if arg == "{py_spy}" else arg for arg in script)]
        return self.docker.pid_sidecar(
            name, image=image, argv=argv, binds={py_spy.resolve(): PY_SPY_IN_SIDECAR}, labels={}, timeout=timeout
        )

    def remove(self, name: str) -> None:
        self.docker.remove_container(name)
