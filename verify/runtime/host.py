"""The host runtime: each server a process group of this host, in a given Python environment.

What a container gives a server, the host runtime gives it this way:

- **its own processes**: a new session (`start_new_session`), so the server and every child it
  starts are one process group, ended together; each also carries the run's mark in its environment
  (pipeline/host/proc.py), so a killed run's processes are found later by the next run or `stackproof gc`;
- **its own environment**: only what the cell's `Container` names, plus a short list of host
  variables a process needs to run at all (`PASSED_FROM_HOST`), plus secrets by name
  (`env_from_host`); the tool's own variables never reach it;
- **a clean filesystem of its own**: HOME, TMPDIR and XDG_CACHE_HOME are a fresh directory per
  server (vLLM's compile cache, torch's inductor files and FlashInfer's JIT land there), removed
  with it, so every start is a first start as in a new container;
- **the container paths it is told**: a mount's target, a scratch volume and a file of the built
  environment's `files/` (`pipeline.host.env`: it stands in for the image's `/`) are host paths here;
  every argv word and variable value naming such a path is rewritten to the host path (`PathMap`),
  and `seen_as` tells the checks what the server will print.

Not given on the host: network isolation (a probe's `network: none`) and `--shm-size`; the receipt
names the runtime, so a reader knows.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.cache import cache_dir
from pipeline.cmd import CommandResult
from pipeline.docker.client import Container
from pipeline.errors import InfraError
from pipeline.host.proc import Marked, dead_runs, end_run, group_members, marked_processes, owner_marks
from verify.forensics.cpucost import CpuReader, ProcessTreeReader

__all__ = ["PASSED_FROM_HOST", "HostRuntime", "PathMap", "remove_dead_host_runs"]

# What a process needs from the host to run at all (locale, the user, the loader's and CUDA's
# paths on a bare-metal GPU host); everything else the server gets is the cell's.
PASSED_FROM_HOST = ("PATH", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TERM", "LD_LIBRARY_PATH")
PASSED_PREFIXES = ("LC_", "CUDA_HOME", "CUDA_PATH", "NVIDIA_")
RUNS_DIR = "host-runs"  # under the cache directory: one directory per server, removed with it
POLL_S = 0.2


@dataclass(frozen=True)
class PathMap:
    """Container paths and the host paths that stand for them, longest first."""

    pairs: tuple[tuple[str, str], ...] = ()

    def with_pairs(self, more: Mapping[str, str]) -> PathMap:
        merged = dict(self.pairs) | dict(more)
        return PathMap(tuple(sorted(merged.items(), key=lambda kv: -len(kv[0]))))

    def host(self, value: str) -> str:
        """`value` with a leading container path replaced by its host path (unchanged otherwise)."""
        for inside, outside in self.pairs:
            if value == inside or value.startswith(inside.rstrip("/") + "/"):
                return outside + value[len(inside) :]
        return value

    def host_anywhere(self, text: str) -> str:
        """Every occurrence replaced, for a shell script given to `exec` (the paths are ours, absolute
        and distinctive: /stackproof/..., a scratch volume's path)."""
        for inside, outside in self.pairs:
            text = text.replace(inside, outside)
        return text


@dataclass(kw_only=True)
class _Server:
    name: str
    process: subprocess.Popen[bytes] | None
    pgid: int | None
    home: Path  # this server's private directory: log, scratch volumes, HOME, TMPDIR
    log: Path
    env: dict[str, str]
    paths: PathMap
    removed: threading.Event = field(default_factory=threading.Event)
    exit_code: int | None = None  # when it could not even start (127: no such command)


@dataclass
class HostRuntime:
    """Servers as process groups, with `python`'s environment first on PATH.

    `files_root`: the built environment's `files/`, whose top-level entries stand for the image's
    same-named paths (`/models/tiny-llama` -> `<env>/files/models/tiny-llama`); None for an
    environment given with `--python`, whose paths are the host's own."""

    python: Path
    files_root: Path | None = None
    image_env: tuple[tuple[str, str], ...] = ()  # what an image of the cell would have as ENV
    cache_key: str | None = None  # its slot in a site's compile cache (HostEnv.compile_cache_key); None: `python`
    runs_dir: Path = field(default_factory=lambda: cache_dir() / RUNS_DIR)
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    kind: str = "host"
    _servers: dict[str, _Server] = field(default_factory=dict)
    _collected: bool = False  # dead runs are ended once per runtime, not at every start

    # -- starting ---------------------------------------------------------------------------------

    def start(self, container: Container) -> None:
        server = self._prepare(container)
        self._servers[container.name] = server  # reserved before the start: remove() finds it
        argv = [server.paths.host(word) for word in container.command]
        executable = shutil.which(argv[0], path=server.env["PATH"])
        if executable is None:
            server.log.write_text(f"stackproof: {argv[0]!r} is not on the environment's PATH ({server.env['PATH']})\n")
            server.exit_code = 127
            return
        with server.log.open("ab") as log:
            server.process = subprocess.Popen(
                [executable, *argv[1:]],
                env=server.env,
                cwd=server.home,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own session and process group: ended as one
            )
        server.pgid = server.process.pid

    def run_to_end(self, container: Container, *, timeout: float) -> CommandResult:
        """A probe: attached, its stdout and stderr apart, removed after, interrupted or not."""
        server = self._prepare(container)
        self._servers[container.name] = server
        argv = [server.paths.host(word) for word in container.command]
        started = time.monotonic()
        try:
            done = subprocess.run(
                argv,
                env=server.env,
                cwd=server.home,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                start_new_session=True,
                check=False,
            )
        except FileNotFoundError as exc:
            return _result(tuple(argv), 127, "", f"{exc}", time.monotonic() - started)
        except subprocess.TimeoutExpired as exc:
            raise InfraError(f"{container.name}: {argv[0]} did not finish within {timeout:.0f}s") from exc
        finally:
            self.remove(container.name)
        return _result(tuple(argv), done.returncode, done.stdout, done.stderr, time.monotonic() - started)

    def _prepare(self, container: Container) -> _Server:
        """The server's directory, its path map and its environment (pure but for the mkdirs)."""
        if not self._collected:  # a killed earlier run's servers go first (their ports, their GPU memory)
            self.collect_garbage()
            self._collected = True
        home = self.runs_dir / container.name
        if home.exists():
            shutil.rmtree(home)
        (home / "home").mkdir(parents=True)
        # TMPDIR short and apart: vLLM binds ZMQ IPC sockets there, and a socket path has at most
        # 107 bytes (sockaddr_un); one under the cache directory is longer (seen on cpu-tiny-host).
        tmp = Path(tempfile.mkdtemp(prefix="sp-", dir=self.environ.get("TMPDIR") or "/tmp"))
        (home / "tmpdir").write_text(str(tmp))
        (home / "owner").write_text(owner_marks(container.name)["STACKPROOF_OWNER"])
        paths = self._paths(container, home)
        env = self._environment(container, home, tmp, paths)
        return _Server(
            name=container.name, process=None, pgid=None, home=home, log=home / "server.out", env=env, paths=paths
        )

    def _paths(self, container: Container, home: Path) -> PathMap:
        pairs: dict[str, str] = {}
        if self.files_root is not None and self.files_root.is_dir():
            pairs |= {f"/{entry.name}": str(entry) for entry in self.files_root.iterdir()}
        pairs |= {mount.target: str(mount.source) for mount in container.mounts}
        for number, inside in enumerate(container.volumes):
            scratch = home / "volumes" / str(number)
            scratch.mkdir(parents=True)
            pairs[inside] = str(scratch)
        return PathMap().with_pairs(pairs)

    def _environment(self, container: Container, home: Path, tmp: Path, paths: PathMap) -> dict[str, str]:
        host = self.environ
        env = {k: v for k, v in host.items() if k in PASSED_FROM_HOST or k.startswith(PASSED_PREFIXES)}
        bin_dir = str(self.python.parent)
        env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH") or os.defpath])
        if (self.python.parent.parent / "pyvenv.cfg").exists():
            env["VIRTUAL_ENV"] = str(self.python.parent.parent)
        env |= {
            "HOME": str(home / "home"),
            "TMPDIR": str(tmp),
            "XDG_CACHE_HOME": str(home / "home" / ".cache"),
        }
        env |= {name: paths.host(value) for name, value in (*self.image_env, *container.env)}
        env |= {name: host[name] for name in container.env_from_host if name in host}  # secrets, by name
        if container.gpus and container.gpus != "all":
            env["CUDA_VISIBLE_DEVICES"] = container.gpus.removeprefix("device=").strip('"')
        env |= owner_marks(container.name)
        return env

    # -- watching ---------------------------------------------------------------------------------

    def state(self, name: str) -> tuple[str, int]:
        server = self._servers.get(name)
        if server is None or server.removed.is_set():
            return "missing", -1
        if server.exit_code is not None:
            return "exited", server.exit_code
        if server.process is None:
            return "created", -1
        code = server.process.poll()
        return ("running", -1) if code is None else ("exited", code)

    def follow_logs(self, name: str, on_line: Callable[[str], None], *, timeout: float) -> None:
        """Tail the server's output file until the server is removed (or has exited and all is read)."""
        server = self._servers.get(name)
        if server is None:
            return
        deadline = time.monotonic() + timeout
        with server.log.open("rb") as log:
            pending = b""
            while time.monotonic() < deadline:
                chunk = log.read(1 << 16)
                if chunk:
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        on_line(line.decode(errors="replace").rstrip("\r"))
                    continue
                if server.removed.is_set() or self.state(name)[0] == "exited":
                    break
                time.sleep(POLL_S)
            if pending:
                on_line(pending.decode(errors="replace"))

    def pids(self, name: str) -> list[int]:
        server = self._servers.get(name)
        if server is None or server.pgid is None:
            return []
        members = set(group_members(server.pgid)) | {m.pid for m in marked_processes() if m.run == name}
        return sorted(members)

    def cpu_reader(self, name: str) -> CpuReader | str:
        if not self.pids(name):
            return "the server has no running process"
        return ProcessTreeReader(pids=lambda: self.pids(name))

    # -- reaching in ------------------------------------------------------------------------------

    def exec(self, name: str, argv: Sequence[str], *, timeout: float = 30) -> CommandResult:
        server = self._servers.get(name)
        if server is None or self.state(name)[0] != "running":
            return _result(tuple(argv), 1, "", f"{name} is not running", 0.0)
        words = [server.paths.host_anywhere(word) for word in argv]
        started = time.monotonic()
        try:
            done = subprocess.run(
                words, env=server.env, cwd=server.home, capture_output=True, text=True, timeout=timeout, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return _result(tuple(words), 1, "", f"{type(exc).__name__}: {exc}", time.monotonic() - started)
        return _result(tuple(words), done.returncode, done.stdout, done.stderr, time.monotonic() - started)

    def copy_out(self, name: str, path: str, dest: Path) -> bool:
        server = self._servers.get(name)
        if server is None:
            return False
        source = Path(server.paths.host(path))
        if source.is_dir():
            shutil.copytree(source, dest, symlinks=True, dirs_exist_ok=True)
            return True
        if source.is_file():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest)
            return True
        return False

    def seen_as(self, name: str, path: str) -> str:
        server = self._servers.get(name)
        return server.paths.host(path) if server else path

    def dump_stacks(
        self, name: str, *, image: str, script: Sequence[str], py_spy: Path, timeout: float
    ) -> CommandResult:
        """The dump script with this host's python, limited to the server's PIDs (the host's /proc
        shows every user's processes, a container's only its own). py-spy needs ptrace rights over
        them: the same user, and `kernel.yama.ptrace_scope` 0 (or root); the script reports a refusal."""
        server_pids = ",".join(str(pid) for pid in self.pids(name))
        argv = [str(self.python), *(str(py_spy) if arg == "{py_spy}" else arg for arg in script), server_pids]
        started = time.monotonic()
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return _result(tuple(argv), 124, "", f"the stack dump did not end within {timeout:.0f}s", timeout)
        return _result(tuple(argv), done.returncode, done.stdout, done.stderr, time.monotonic() - started)

    # -- ending -----------------------------------------------------------------------------------

    def remove(self, name: str) -> None:
        """SIGTERM the group, then SIGKILL whatever is left of it or carries its mark; reap; delete
        its directory. Nothing of it runs when this returns."""
        server = self._servers.get(name)
        if server is None or server.removed.is_set():
            return
        end_run(name, pgid=server.pgid)
        if server.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.process.wait(timeout=5)
        server.removed.set()
        time.sleep(POLL_S * 2)  # the log follower reads to the end before the file goes
        _remove_home(server.home)

    def collect_garbage(self) -> list[str]:
        """End the marked processes whose owner is gone, and remove dead runs' directories."""
        return remove_dead_host_runs(self.runs_dir)


def _result(argv: Sequence[str], code: int, stdout: str, stderr: str, seconds: float) -> CommandResult:
    return CommandResult(argv=tuple(argv), returncode=code, stdout=stdout, stderr=stderr, seconds=seconds)


def remove_dead_host_runs(runs_dir: Path | None = None) -> list[str]:
    """What `stackproof gc` and every host-runtime start do: the servers of runs killed with SIGKILL."""
    runs_dir = runs_dir or cache_dir() / RUNS_DIR
    ended = []
    for run, processes in dead_runs(marked_processes()).items():
        end_run(run, pgid=processes[0].pgid)
        ended.append(run)
    live = {m.run for m in marked_processes()}
    if runs_dir.is_dir():
        for home in runs_dir.iterdir():
            owner = (home / "owner").read_text() if (home / "owner").is_file() else ""
            if home.name not in live and not _owner_alive(owner):
                _remove_home(home)
                if home.name not in ended:
                    ended.append(home.name)
    return ended


def _remove_home(home: Path) -> None:
    """A server's directory and its TMPDIR (which lives apart, see `_prepare`)."""
    tmp = home / "tmpdir"
    if tmp.is_file():
        shutil.rmtree(tmp.read_text().strip(), ignore_errors=True)
    shutil.rmtree(home, ignore_errors=True)


def _owner_alive(owner: str) -> bool:
    return Marked(pid=0, pgid=0, run="", owner=owner).owner_alive(socket.gethostname())
