"""Start a cell's model server, wait for it, and always remove it.

What is started (the argv), what "ready" means (the health path) and how the one proof completion
is asked are the serving engine's driver's (verify/serving/); where it runs (a container, or a
process group on this host) is the runtime's (verify/runtime/); this module is the server's life.

`Server` is a context manager: the server gets a name chosen before it starts, so even an
interrupt that lands while the start is in flight can be cleaned up by name. The server log is
streamed to a file (and the terminal) for the whole life of the server.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal

from pipeline.console import console
from pipeline.docker.client import Container, Docker, Mount
from pipeline.errors import CheckFailed
from pipeline.host.modelstore import model_mounts
from pipeline.matrix.compilecache import CONTAINER_DIR, CacheUse, CompileCache, compile_cache_from_env
from pipeline.matrix.model import Arm, Cell, ServeSpec
from verify.forensics.stall import COREDUMP_DIR, coredump_env
from verify.logs.logscan import LogWatcher
from verify.runtime import Runtime, as_runtime
from verify.runtime.docker import DockerRuntime
from verify.runtime.host import HostRuntime
from verify.serving import driver_for
from verify.serving.driver import ServingDriver
from verify.serving.openai import ServerCalls

__all__ = ["Readiness", "Server", "ServerFactory", "SharedServer", "engine_version", "free_port", "serve_argv"]

HOST = "127.0.0.1"  # servers bind loopback only; traffic never leaves this machine
RUN_LABEL = "io.stackproof.run"
SERVER_ROLE = "server"
POLL_SECONDS = 1.0
# After /health answers, how long the log follower gets to write the driver's ready line to the
# run's log: the engine printed it before it served, but the follower (a `docker logs -f` or a file
# tail polled every 0.2 s, on a busy host) can be behind, and the log is judged from that file.
READY_LINE_GRACE_S = 15.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def serve_argv(serve: ServeSpec, arm: Arm | None, port: int) -> list[str]:
    """The server command, from the cell's engine driver, bound to 127.0.0.1 on `port`."""
    return list(driver_for(serve).argv(serve, arm, host=HOST, port=port))


def engine_version(cell: Cell, driver: ServingDriver) -> str | None:
    """The engine's release as the cell pins it (Cell.pinned_versions); None when the cell
    pins none (a release image's own): the driver's facts then take their newest entry."""
    return driver.version(cell.pinned_versions())


class ServerFailed(CheckFailed):
    """The server did not become ready or did not answer; carries the last log lines."""

    def __init__(self, reason: str, server: Server) -> None:
        self.reason = reason
        self.last_lines = server.last_lines().splitlines()
        self.log_path = server.log_path
        super().__init__(
            f"{server.cell.id}: {reason}. Last log lines:\n{server.last_lines()}\nfull log: {server.log_path}"
        )


@dataclass(frozen=True, kw_only=True)
class Readiness:
    seconds: float
    url: str


class Server:
    """One server for one cell (and arm), on a runtime; removed on every exit path."""

    def __init__(
        self,
        runtime: Runtime | Docker,
        cell: Cell,
        image: str,
        *,
        out_dir: Path,
        arm: Arm | None = None,
        extra_env: dict[str, str] | None = None,
        port: int | None = None,
        watcher: LogWatcher | None = None,
        volumes: dict[Path, str] | None = None,
        unset_env: tuple[str, ...] = (),
        scratch: tuple[str, ...] = (),
        on_start: Callable[[Server], None] | None = None,
        compile_cache: CompileCache | Literal["site"] | None = "site",
    ) -> None:
        if cell.serve is None:
            raise CheckFailed(f"cell {cell.id!r} has no serve spec")
        self.runtime = as_runtime(runtime)
        self.cell = cell
        self.serve = cell.serve
        self.driver = driver_for(cell.serve)
        self.image = image
        self.arm = arm
        self.extra_env = extra_env or {}
        self.port = port or free_port()
        self.run_id = uuid.uuid4().hex[:12]
        self.name = f"stackproof-{cell.id}-{self.run_id}"[:128]
        self.out_dir = out_dir
        self.log_path = out_dir / "server.log"
        # 2000 lines: the load stage reads an engine death's cause above its tracebacks (verify/load/death.py).
        self.tail: deque[str] = deque(maxlen=2000)
        self.watcher = watcher
        self.volumes = volumes or {}  # host path -> container path
        self.unset_env = unset_env  # image ENV names to remove for this run (`env -u`)
        # Container paths backed by anonymous volumes (host runtime: the server's own directory):
        # written by the server, read out with `copy_out`, removed with it.
        self.scratch = scratch
        self.on_start = on_start  # told of every start, e.g. to count server starts per run
        # The site's compile/JIT cache (pipeline/matrix/compilecache.py): "site" reads STACKPROOF_COMPILE_CACHE
        # (which `--compile-cache` sets); None starts cold whatever the site says.
        self.compile_cache = compile_cache_from_env(os.environ) if compile_cache == "site" else compile_cache
        self.cache_use: CacheUse | None = None  # set at start: the slot, and whether it was warm
        # How this engine release treats a warm slot (verify/serving/vllm.py: compile_cache).
        self.cache_facts = self.driver.compile_cache_at(engine_version(cell, self.driver))
        self._follower: threading.Thread | None = None
        self._ready_line = re.compile(self.driver.ready_line)
        self._ready_line_logged = threading.Event()  # the follower wrote the driver's ready line
        self._started = False

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    # -- lifecycle --------------------------------------------------------------------------------

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.remove()

    def start(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._started = True  # from here on, remove() must run even if `docker run` is interrupted
        if isinstance(self.compile_cache, CompileCache):
            self.cache_use = self.compile_cache.use(self._image_key())
            warmth = "warm" if self.cache_use.warm else "cold"
            print(f"{self.cell.id}: compile cache {self.cache_use.slot} ({warmth})", file=sys.stderr)
        if self.on_start is not None:
            self.on_start(self)
        self.runtime.start(self.container())
        where = "container" if self.runtime.kind == "docker" else "process group"
        print(f"{self.cell.id}: server {where} {self.name} on {self.base_url}, log: {self.log_path}", file=sys.stderr)
        self._follower = threading.Thread(target=self._follow_logs, name=f"logs-{self.name}", daemon=True)
        self._follower.start()

    def _image_key(self) -> str:
        """What the compile cache's slot is keyed by: the image id on docker (a tag can move to
        another image); on the host, the environment's compiled packages (HostRuntime.cache_key), else
        its reference."""
        if isinstance(self.runtime, DockerRuntime):
            info = self.runtime.docker.image(self.image)
            if info is not None:
                return info.id
        if isinstance(self.runtime, HostRuntime) and self.runtime.cache_key:
            return self.runtime.cache_key
        return self.image

    def container(self) -> Container:
        """What this server's `docker run` says: the cell's env, its volumes, the model store, and
        the compile cache's slot when the site gives one (the cell's own env wins over its variables)."""
        store = model_mounts(self.serve)  # hf: models: the store read-only, offline, HF_TOKEN by name
        cache = dict(self.cache_use.env) if self.cache_use else {}  # under the cell's: a cell's own value wins
        env = {**cache, **self.cell.serve_env(self.arm), **self.extra_env, **dict(store.env)}  # the store's win
        scratch = self.scratch
        if self.serve.forensics.cuda_coredump:  # ready for a user-triggered CUDA core dump (verify/forensics/stall.py)
            env.update(coredump_env())
            scratch = (*scratch, COREDUMP_DIR)
        command = serve_argv(self.serve, self.arm, self.port)
        if self.unset_env:  # docker run cannot remove an image's ENV; `env -u` can
            command = ["env", *(arg for name in self.unset_env for arg in ("-u", name)), *command]
        mounts = [Mount(source=host, target=path, read_only=False) for host, path in sorted(self.volumes.items())]
        mounts += [Mount(source=host, target=path) for host, path in store.volumes]
        if self.cache_use is not None:
            mounts.append(Mount(source=self.cache_use.slot, target=CONTAINER_DIR, read_only=False))
        return Container(
            image=self.image,
            name=self.name,
            role=SERVER_ROLE,
            command=tuple(command),
            labels=((RUN_LABEL, self.run_id), ("io.stackproof.cell", self.cell.id)),
            env=tuple(sorted(env.items())),
            env_from_host=store.env_names,
            mounts=tuple(mounts),
            volumes=scratch,
            gpus=self.serve.gpus,
            shm_size=self.serve.shm_size,
        )

    def copy_out(self, path: str, dest: Path) -> bool:
        """Copy a path the server wrote (a container path) to `dest` (see `Runtime.copy_out`)."""
        return self.runtime.copy_out(self.name, path, dest)

    def seen_as(self, path: str) -> str:
        """Where the server sees a container path: what its log prints for it."""
        return self.runtime.seen_as(self.name, path)

    def remove(self) -> None:
        """Remove the container by name; safe to call twice, and when it never started."""
        if not self._started:
            return
        self._started = False
        self.runtime.remove(self.name)
        if self._follower is not None:
            self._follower.join(timeout=10)
        print(f"{self.cell.id}: server {self.name} removed", file=sys.stderr)

    def _follow_logs(self) -> None:
        with self.log_path.open("a") as log:

            def on_line(line: str) -> None:
                log.write(line + "\n")
                log.flush()
                if not self._ready_line_logged.is_set() and self._ready_line.search(line):
                    self._ready_line_logged.set()  # once: the load's lines need no search after it
                self.tail.append(line)
                if self.watcher is not None:
                    self.watcher.feed(line)
                console().feed("server", self.cell.id, line)

            # It ends when the server is removed; the log so far is kept.
            self.runtime.follow_logs(self.name, on_line, timeout=24 * 3600)

    # -- state ------------------------------------------------------------------------------------

    def state(self) -> tuple[str, int]:
        """(status, exit code); ('missing', -1) when the server is gone."""
        return self.runtime.state(self.name)

    def last_lines(self, n: int = 40) -> str:
        return "\n".join(list(self.tail)[-n:])

    def wait_ready(self, timeout: float | None = None) -> Readiness:
        """Poll the health path until 200; fail fast when the container exits, give up at the timeout."""
        timeout = timeout or self.serve.readiness_timeout_s
        started = time.monotonic()
        health = self.driver.endpoints.health
        with (
            console().phase("server", self.cell.id, log=self.log_path) as phase,
            ServerCalls(self.base_url, self.driver) as calls,
        ):
            while True:
                status, code = self.state()
                if status not in ("running", "created"):
                    time.sleep(0.5)  # let the log follower catch the last lines
                    raise ServerFailed(
                        f"the server {status} (exit code {code}) before it was ready, "
                        f"after {time.monotonic() - started:.0f}s",
                        self,
                    )
                fatal = self.watcher.fatal if self.watcher else None
                if fatal is not None:
                    raise ServerFailed(
                        f"failure signature {fatal.id} ({fatal.title}) at server log line {fatal.line_no}, "
                        f"after {time.monotonic() - started:.0f}s: {fatal.line.strip()[:300]}",
                        self,
                    )
                if calls.healthy():
                    seconds = time.monotonic() - started
                    self._await_ready_line()
                    phase.done(f"ready at {self.base_url}")
                    return Readiness(seconds=round(seconds, 1), url=self.base_url)
                now = time.monotonic()
                if now - started > timeout:
                    raise ServerFailed(f"not ready after {timeout:.0f}s (readiness_timeout)", self)
                phase.update(f"{phase.lines} log lines, waiting for {health} (up to {timeout:.0f}s)")
                time.sleep(POLL_SECONDS)

    def _await_ready_line(self) -> None:
        """Let the log follower catch up to the engine's ready line, so the log judged next (startup's
        rules, the contract test) holds it. Bounded: a line that never comes is the rules' to report."""
        if self._follower is None:
            return
        deadline = time.monotonic() + READY_LINE_GRACE_S
        while not self._ready_line_logged.wait(0.1) and time.monotonic() < deadline and self._follower.is_alive():
            pass

    def complete(
        self, prompt: str = "The capital of France is", max_tokens: int = 16, timeout: float = 120
    ) -> dict[str, object]:
        """One real completion: proof that the engine, not just the API, works."""
        with ServerCalls(self.base_url, self.driver, timeout=timeout) as calls:
            try:
                model = calls.model_id()
            except CheckFailed as exc:
                raise ServerFailed(f"completion failed: {exc}", self) from exc
            answer = calls.complete({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
        if answer.status is None:
            raise ServerFailed(f"completion failed: {answer.error}", self)
        if not answer.ok:
            raise ServerFailed(f"completion answered {answer.error}", self)
        body = answer.body
        try:
            usage = body.get("usage") or {}
            choice = body["choices"][0]
            text = choice["text"]
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise ServerFailed(
                f"completion body unreadable ({type(exc).__name__}: {exc}): {str(body)[:300]}", self
            ) from exc
        if not usage.get("completion_tokens"):
            raise ServerFailed(f"completion returned no tokens: {body}", self)
        return {
            "model": model,
            "prompt": prompt,
            "text": text,
            "completion_tokens": usage["completion_tokens"],
            "finish_reason": choice.get("finish_reason"),
            "seconds": answer.seconds,
        }


# What makes a stage's server: `Server` itself, or a stand-in with its signature (unit tests).
ServerFactory = Callable[..., Server]


class SharedServer:
    """A ready server one stage hands to later ones (startup to autotune and load), so it starts once.

    The verify run owns it: whatever happens between the stages, `close()` in its `finally`
    removes the container. It also counts every server the run started (`note_start`).
    """

    def __init__(self) -> None:
        self.server: Server | None = None
        self.started: list[str] = []
        self.cache_uses: list[dict[str, object]] = []  # per start: the compile cache, warm or not

    def note_start(self, server: Server) -> None:
        self.started.append(server.name)
        use = server.cache_use.to_json() if server.cache_use else {"used": False, "warm": False}
        self.cache_uses.append({"server": server.name, **use})

    def note_not_reused(self, server: Server, line: str) -> None:
        """The engine of a warm start said it failed to load the slot's artifact and compiled
        again (`line`, from its log): the receipt says the warm cache was not reused."""
        for use in self.cache_uses:
            if use.get("server") == server.name:
                use.update(reused=False, reload_failure=line[:500])

    def keep(self, server: Server) -> None:
        self.server = server

    def peek(self) -> Server | None:
        """The kept server, left kept, if its container still runs."""
        if self.server is not None and self.server.state()[0] != "running":
            self.close()
        return self.server

    def take(self) -> Server | None:
        """The kept server if its container still runs; a dead one is removed and not handed on."""
        server = self.peek()
        self.server = None
        return server

    def close(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.remove()
