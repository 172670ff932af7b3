"""Where a server runs: the runtime seam (a docker container, or a process group on the host).

A check never calls docker or `subprocess` to reach a server: it describes what to run as a
`pipeline.docker.client.Container` (the command, its environment, the paths it reads and writes) and hands
it to a `Runtime`, which starts it, follows its log, says whether it still runs, lists the PIDs of
its processes (as the host sees them, for NVML and py-spy), runs a command beside it, copies out
what it wrote, and removes it with nothing left. Two runtimes implement it:

- `DockerRuntime` (verify/runtime/docker.py): today's containers, unchanged;
- `HostRuntime` (verify/runtime/host.py): a process group on this host, in a Python environment
  built from the cell's lock (`pipeline.host.env`) or given with `--python`.

A Kubernetes runtime would be a third implementation of the same methods (docs/kubernetes.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from pipeline.cmd import CommandResult
from pipeline.docker.client import Container, Docker
from verify.forensics.cpucost import CpuReader

__all__ = ["RUNTIMES", "Runtime", "as_runtime"]

RUNTIMES = ("docker", "host")


class Runtime(Protocol):
    """The operations the checks need on a server (or a probe), by the name its `Container` gives."""

    @property
    def kind(self) -> str:
        """ "docker" or "host": recorded in the receipt."""

    def start(self, container: Container) -> None:
        """Start it detached; the name is reserved first, so an interrupt can still remove it."""

    def run_to_end(self, container: Container, *, timeout: float) -> CommandResult:
        """Run it attached until it exits, then remove it: its output, whatever its exit code."""

    def state(self, name: str) -> tuple[str, int]:
        """(status, exit code): "running", "created", "exited"; ("missing", -1) when it is gone."""

    def follow_logs(self, name: str, on_line: Callable[[str], None], *, timeout: float) -> None:
        """Its output, line by line, until it is removed (then this returns)."""

    def exec(self, name: str, argv: Sequence[str], *, timeout: float = 30) -> CommandResult:
        """Run `argv` beside it, with its environment and its view of the paths."""

    def copy_out(self, name: str, path: str, dest: Path) -> bool:
        """Copy `path` (as the server sees it) to the new local path `dest`; False when absent."""

    def seen_as(self, name: str, path: str) -> str:
        """Where the server itself sees `path` (a container path): what its log will print."""

    def pids(self, name: str) -> list[int]:
        """Host PIDs of every process of the server (what NVML reports per process)."""

    def cpu_reader(self, name: str) -> CpuReader | str:
        """What reads the server's CPU time and RSS, or why nothing can."""

    def dump_stacks(
        self, name: str, *, image: str, script: Sequence[str], py_spy: Path, timeout: float
    ) -> CommandResult:
        """Run the stack-dump `script` (argv after the interpreter; `{py_spy}` stands for the binary)
        where it can ptrace the server's processes."""

    def remove(self, name: str) -> None:
        """End it and everything it started; safe to call twice and for a name never started."""


def as_runtime(where: Runtime | Docker) -> Runtime:
    """A `Docker` stands for the docker runtime on it."""
    if isinstance(where, Docker):
        from verify.runtime.docker import DockerRuntime

        return DockerRuntime(where)
    return where
