"""Docker at the edge: find a BuildKit-capable CLI, build, inspect, run and remove containers.

The only module that puts a docker command line together: everything else says what it wants as
typed operations (`Container` + `Docker.start`/`run_to_end`/`exec`/`remove_container`, ...), and
every container it starts is named, labelled with its role and owner, and removed on every path.
Every call goes through `pipeline.cmd`. Real GPU runners have `docker buildx`; the development
machines have Debian's docker 20.10, whose built-in BuildKit is reached with DOCKER_BUILDKIT=1
(a newer static client earlier on PATH, without buildx, cannot build with BuildKit at all).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packaging.version import InvalidVersion, Version

from pipeline import cmd
from pipeline.docker.gc import (
    OWNER_HOST_LABEL,
    OWNER_PID_LABEL,
    OWNER_START_LABEL,
    Owned,
    dead_containers,
    owner_labels,
    process_alive,
)
from pipeline.docker.gpuaccess import (
    GpuAccess,
    GpuAccessSettingError,
    cdi_spec_dirs,
    cdi_spec_kinds,
    choose_gpu_access,
    gpu_access_setting,
    gpu_flags,
    missing_gpu_access_hint,
)
from pipeline.errors import CheckFailed, InfraError, InputError

if TYPE_CHECKING:
    from pipeline.registry.oci import Credentials

__all__ = [
    "CLASSIC_STORE",
    "CONTAINERD_STORE",
    "ROLE_LABEL",
    "Container",
    "Docker",
    "DockerCli",
    "ImageInfo",
    "Mount",
    "detect_cli",
    "run_argv",
]

ROLE_LABEL = "io.stackproof.role"  # server | probe | doctor | kernels | sidecar

# What `docker inspect .Id` is depends on the daemon's image store: the config digest on the classic
# (graphdriver) store, the manifest (or index) digest on the containerd image store, which current
# Docker releases use by default.
CLASSIC_STORE = "classic"
CONTAINERD_STORE = "containerd"
_PUSHED_DIGEST = re.compile(r"digest: (sha256:[0-9a-f]{64})")

Runner = Callable[[Sequence[str], dict[str, str]], "cmd.CommandResult"]

# Docker 23 made BuildKit the default builder and moved it into the buildx plugin; before that
# the classic CLI reached the daemon's built-in BuildKit with DOCKER_BUILDKIT=1.
_LAST_CLASSIC_MAJOR = 22
_INSTALL_HINT = "install docker buildx, or Debian's docker.io (20.10) whose CLI reaches BuildKit with DOCKER_BUILDKIT=1"


@dataclass(frozen=True, kw_only=True)
class DockerCli:
    path: str
    mode: str  # "buildx" or "classic-buildkit"
    version: str

    def build_argv(self) -> list[str]:
        return [self.path, "buildx", "build", "--load"] if self.mode == "buildx" else [self.path, "build"]

    @property
    def build_env(self) -> dict[str, str]:
        return {} if self.mode == "buildx" else {"DOCKER_BUILDKIT": "1"}


def _default_runner(argv: Sequence[str], env: dict[str, str]) -> cmd.CommandResult:
    return cmd.run(argv, env=env, check=False, quiet=True, timeout=30)


def candidate_paths() -> list[str]:
    """Every `docker` on PATH, then the distribution's, without duplicates."""
    found: list[str] = []
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        path = os.path.join(directory, "docker")
        if os.access(path, os.X_OK) and os.path.realpath(path) not in map(os.path.realpath, found):
            found.append(path)
    if os.access("/usr/bin/docker", os.X_OK) and os.path.realpath("/usr/bin/docker") not in map(
        os.path.realpath, found
    ):
        found.append("/usr/bin/docker")
    return found


def detect_cli(candidates: Sequence[str] | None = None, runner: Runner = _default_runner) -> DockerCli:
    """The first candidate that can build with BuildKit: buildx anywhere beats a classic CLI."""
    candidates = candidate_paths() if candidates is None else candidates
    if not candidates:
        raise InfraError(f"no docker CLI on PATH: {_INSTALL_HINT}")
    classic: DockerCli | None = None
    seen = []
    for path in candidates:
        result = runner([path, "version", "--format", "{{.Client.Version}}"], {})
        version = result.stdout.strip().splitlines()[0] if result.stdout.strip() else "unknown"
        seen.append(f"{path} ({version})")
        if runner([path, "buildx", "version"], {}).returncode == 0:
            return DockerCli(path=path, mode="buildx", version=version)
        if classic is None and _is_classic(version):
            help_text = runner([path, "build", "--help"], {"DOCKER_BUILDKIT": "1"}).stdout
            if "--secret" in help_text:
                classic = DockerCli(path=path, mode="classic-buildkit", version=version)
    if classic is not None:
        return classic
    raise InfraError(f"no BuildKit-capable docker CLI among {', '.join(seen)}: {_INSTALL_HINT}")


def _detect_cli_cached() -> DockerCli:
    """`detect_cli`, remembered per set of candidate binaries (path, size, mtime) in the tool's cache:
    five subprocesses saved on every command, redone as soon as a docker binary changes."""
    from pipeline.cache import cache_dir

    candidates = candidate_paths()
    stamp = []
    for path in candidates:
        st = os.stat(os.path.realpath(path))
        stamp.append(f"{path}:{st.st_size}:{st.st_mtime_ns}")
    record = cache_dir() / "docker-cli.json"
    try:
        saved = json.loads(record.read_text())
        if saved.get("stamp") == stamp:
            return DockerCli(**saved["cli"])
    except (OSError, ValueError, TypeError, KeyError):
        pass
    cli = detect_cli(candidates)
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(
            json.dumps({"stamp": stamp, "cli": {"path": cli.path, "mode": cli.mode, "version": cli.version}})
        )
    except OSError:
        pass
    return cli


def _is_classic(version: str) -> bool:
    try:
        return Version(version.split("+")[0].split("-")[0]).major <= _LAST_CLASSIC_MAJOR
    except InvalidVersion:
        return False


@dataclass(frozen=True, kw_only=True)
class ImageInfo:
    id: str
    repo_digests: tuple[str, ...]
    labels: dict[str, str]
    size: int
    env: tuple[tuple[str, str], ...] = ()  # the image config's ENV, as the container starts with it


@dataclass(frozen=True, kw_only=True)
class Mount:
    """A host path bind-mounted into a container (read-only unless said otherwise)."""

    source: Path | str
    target: str
    read_only: bool = True


@dataclass(frozen=True, kw_only=True)
class Container:
    """One container of ours, as data: what `docker run` is told, and nothing else.

    `command[0]` is the entrypoint (an image's own ENTRYPOINT never wraps ours). `env` values reach
    argv, so they are never secrets: a secret is passed by name only (`env_from_host`, `--env NAME`),
    its value taken from this process's environment by docker itself. `volumes` are anonymous
    volumes (container paths), removed with the container."""

    image: str
    name: str
    role: str
    command: tuple[str, ...]
    labels: tuple[tuple[str, str], ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    env_from_host: tuple[str, ...] = ()
    mounts: tuple[Mount, ...] = ()
    volumes: tuple[str, ...] = ()
    network: str = "host"  # "none" for probes: importing must not need a network
    gpus: str | None = None
    gpu_access: GpuAccess | None = None  # how `gpus` reaches docker run; None: `--gpus` (Docker.start fills it)
    shm_size: str | None = None
    pid: str | None = None  # `container:NAME`: share that container's PID namespace (a debugging sidecar)
    cap_add: tuple[str, ...] = ()


def run_argv(container: Container, *, detach: bool) -> list[str]:
    """The `docker run` arguments (after the CLI's path) for `container`: pure."""
    argv = ["run", *(["--detach"] if detach else []), "--name", container.name, "--network", container.network]
    labels = [f"{ROLE_LABEL}={container.role}", *(f"{k}={v}" for k, v in container.labels), *owner_labels()]
    argv += [arg for label in labels for arg in ("--label", label)]  # owner: `stackproof gc` finds orphans
    if container.pid:
        argv += ["--pid", container.pid]
    argv += [arg for cap in container.cap_add for arg in ("--cap-add", cap)]
    if container.shm_size:
        argv += ["--shm-size", container.shm_size]
    if container.gpus:
        argv += gpu_flags(container.gpu_access, container.gpus)
    for key, value in sorted(container.env):
        argv += ["--env", f"{key}={value}"]
    for name in container.env_from_host:
        argv += ["--env", name]
    for mount in container.mounts:
        argv += ["--volume", f"{mount.source}:{mount.target}{':ro' if mount.read_only else ''}"]
    for path in container.volumes:
        argv += ["--volume", path]
    entrypoint, *args = container.command
    return [*argv, "--entrypoint", entrypoint, container.image, *args]


class Docker:
    """The docker operations the pipeline needs, on one CLI."""

    def __init__(self, cli: DockerCli) -> None:
        self.cli = cli
        self.chosen_gpu_access: GpuAccess | None = None  # once a GPU container ran: how it got its GPUs

    def gpu_access(self, env: dict[str, str] | None = None) -> GpuAccess:
        """How this daemon gives containers GPUs (pipeline/docker/gpuaccess.py), decided once: exit 3
        naming what to install when it gives none, exit 2 for a bad site setting."""
        if self.chosen_gpu_access is not None:
            return self.chosen_gpu_access
        try:
            setting = gpu_access_setting(os.environ if env is None else env)
        except GpuAccessSettingError as e:
            raise InputError(str(e)) from None
        info = self.info()
        if isinstance(info, str):
            raise InfraError(f"`docker info` failed, so GPU access cannot be told: {info[-300:]}")
        chosen = choose_gpu_access(info, cdi_spec_kinds(cdi_spec_dirs(info)), setting)
        if chosen is None:
            raise InfraError(missing_gpu_access_hint(info, setting))
        self.chosen_gpu_access = chosen
        return chosen

    def _with_gpu_access(self, container: Container) -> Container:
        if not container.gpus or container.gpu_access is not None:
            return container
        return replace(container, gpu_access=self.gpu_access())

    @classmethod
    def connect(cls) -> Docker:
        """Detect the CLI and make sure a daemon answers; exit code 3 with a hint when none does."""
        docker = cls(_detect_cli_cached())
        result = cmd.run(
            [docker.cli.path, "info", "--format", "{{.ServerVersion}}"], check=False, quiet=True, timeout=30
        )
        if result.returncode != 0 or not result.stdout.strip():
            raise InfraError(
                "no docker daemon answers: start one (e.g. `dockerd --bridge=none --iptables=false`, "
                f"see docs/setup.md) and retry.\n{result.stderr.strip()[-500:]}"
            )
        return docker

    def _docker(self, *args: str, timeout: float = 120, check: bool = True, quiet: bool = False) -> cmd.CommandResult:
        return cmd.run([self.cli.path, *args], timeout=timeout, check=check, quiet=quiet)

    # -- containers -------------------------------------------------------------------------------

    def start(self, container: Container, *, timeout: float = 120) -> None:
        """`docker run --detach`; the caller removes it (`remove_container`) on every path."""
        self._docker(*run_argv(self._with_gpu_access(container), detach=True), timeout=timeout)

    def run(self, container: Container, *, timeout: float, check: bool = True) -> cmd.CommandResult:
        """Run `container` attached until it exits and keep it (to copy out of it): inside `removing`."""
        return self._docker(*run_argv(self._with_gpu_access(container), detach=False), timeout=timeout, check=check)

    def run_to_end(self, container: Container, *, timeout: float) -> cmd.CommandResult:
        """Run `container` attached until it exits, then remove it, interrupted or not: its output,
        whatever its exit code (the caller judges it)."""
        with self.removing(container.name):
            return self.run(container, timeout=timeout, check=False)

    @contextlib.contextmanager
    def removing(self, name: str) -> Iterator[str]:
        """Remove the container `name` (and its anonymous volumes) when the block ends, on every path."""
        try:
            yield name
        finally:
            self.remove_container(name)

    def remove_container(self, name: str) -> None:
        """Remove a container and its anonymous volumes; nothing when it is not there."""
        self._docker("rm", "--force", "--volumes", name, check=False, quiet=True, timeout=60)

    def container_state(self, name: str) -> tuple[str, int]:
        """(status, exit code) from docker inspect; ('missing', -1) when the container is gone."""
        fmt = "{{.State.Status}} {{.State.ExitCode}}"
        result = self._docker("inspect", "--format", fmt, name, check=False, quiet=True, timeout=30)
        if result.returncode != 0:
            return "missing", -1
        status, _, code = result.stdout.strip().partition(" ")
        return status, int(code or -1)

    def container_pid(self, name: str) -> int | None:
        """The host PID of the container's init process (`.State.Pid`), whose cgroup is the
        container's; None when the container is gone or not running."""
        result = self._docker("inspect", "--format", "{{.State.Pid}}", name, check=False, quiet=True, timeout=30)
        text = result.stdout.strip()
        return int(text) if result.returncode == 0 and text.isdigit() and int(text) > 0 else None

    def follow_logs(self, name: str, on_line: Callable[[str], None], *, timeout: float) -> None:
        """Stream the container's output, line by line, until it is removed (then it returns)."""
        with contextlib.suppress(Exception):  # `docker logs` fails once the container is gone
            cmd.stream([self.cli.path, "logs", "--follow", name], on_line=on_line, timeout=timeout)

    def exec(self, name: str, argv: Sequence[str], *, timeout: float = 30) -> cmd.CommandResult:
        """Run `argv` inside the running container `name`; its result, whatever its exit code."""
        return self._docker("exec", name, *argv, check=False, quiet=True, timeout=timeout)

    def owned_containers(self) -> list[Owned] | None:
        """Every container that names an owner (see pipeline/docker/gc.py); None when docker cannot say."""
        labels = (OWNER_HOST_LABEL, OWNER_PID_LABEL, OWNER_START_LABEL)
        fmt = "\t".join(["{{.ID}}", "{{.Names}}", *(f'{{{{.Label "{k}"}}}}' for k in labels)])
        argv = ["ps", "--all", "--no-trunc", "--filter", f"label={OWNER_PID_LABEL}", "--format", fmt]
        result = self._docker(*argv, quiet=True, timeout=60, check=False)
        if result.returncode != 0:
            return None
        rows = [line.split("\t") for line in result.stdout.splitlines()]
        return [Owned(id=p[0], name=p[1], host=p[2], pid=p[3], start=p[4]) for p in rows if len(p) == 5]

    def collect_garbage(self) -> list[str]:
        """Remove the containers of dead runs on this host (pipeline/docker/gc.py); return their names."""
        containers = self.owned_containers()
        if containers is None:  # collecting garbage never stops the run that asked for it
            return []
        removed = []
        for c in dead_containers(containers, host=socket.gethostname(), alive=process_alive):
            self.remove_container(c.id)
            removed.append(c.name)
        return removed

    # -- the daemon and images --------------------------------------------------------------------

    def info(self) -> dict[str, Any] | str:
        """`docker info` as JSON; the CLI's error text when the daemon does not answer."""
        result = self._docker("info", "--format", "{{json .}}", check=False, quiet=True, timeout=30)
        if result.returncode != 0:
            return (result.stderr or result.stdout).strip()
        try:
            document = json.loads(result.stdout)
        except ValueError:
            return result.stdout.strip()[-500:]
        return document if isinstance(document, dict) else str(document)

    def image_config(self, ref: str, *, timeout: float = 60) -> dict[str, Any] | None:
        """`docker image inspect` of one image as JSON; None when it is not here."""
        argv = ("image", "inspect", "--format", "{{json .}}", ref)
        result = self._docker(*argv, check=False, quiet=True, timeout=timeout)
        if result.returncode != 0:
            return None
        document = json.loads(result.stdout)
        return document if isinstance(document, dict) else None

    def image(self, ref: str) -> ImageInfo | None:
        result = self._docker("image", "inspect", ref, check=False, quiet=True)
        if result.returncode != 0:
            return None
        data: dict[str, Any] = json.loads(result.stdout)[0]
        return ImageInfo(
            id=data["Id"],
            repo_digests=tuple(data.get("RepoDigests") or ()),
            labels=dict((data.get("Config") or {}).get("Labels") or {}),
            size=int(data.get("Size", 0)),
            env=tuple(
                (name, value)
                for name, _, value in (item.partition("=") for item in (data.get("Config") or {}).get("Env") or ())
            ),
        )

    def pull(self, ref: str, *, timeout: float = 3600, login: Credentials | None = None) -> None:
        """Pull an image, its progress streamed to stderr (`login`: see `push`)."""
        argv = [self.cli.path, "pull", ref]
        with _docker_config(ref, login) as env:
            cmd.stream(
                argv,
                env=env,
                on_line=lambda line: print(f"[pull] {line}", file=sys.stderr, flush=True),
                timeout=timeout,
            )

    def push(self, ref: str, *, timeout: float = 3600, login: Credentials | None = None) -> str:
        """Push a registry-qualified tag; the manifest (or index) digest the registry stored.

        `login`: credentials that are not in docker's own config (STACKPROOF_REGISTRY_USER): they reach
        the CLI through a private, temporary DOCKER_CONFIG (mode 0600), never through argv."""
        lines: list[str] = []

        def on_line(line: str) -> None:
            lines.append(line)
            print(f"[push] {line}", file=sys.stderr, flush=True)

        with _docker_config(ref, login) as env:
            cmd.stream([self.cli.path, "push", ref], env=env, on_line=on_line, timeout=timeout)
        match = next((m for line in reversed(lines) if (m := _PUSHED_DIGEST.search(line))), None)
        if match is None:
            raise CheckFailed(f"docker push {ref}: no digest in its output")
        return match.group(1)

    def tag(self, source: str, target: str) -> None:
        self._docker("tag", source, target, quiet=True)

    def remove_image(self, ref: str) -> None:
        """Remove a tag (or digest reference); nothing when it is not there."""
        self._docker("rmi", ref, check=False, quiet=True)

    def image_store(self) -> str:
        """CONTAINERD_STORE when the daemon keeps images in containerd (`.Id` = manifest digest), else CLASSIC_STORE."""
        result = self._docker("info", "--format", "{{json .DriverStatus}}", check=False, quiet=True, timeout=30)
        return CONTAINERD_STORE if "io.containerd.snapshotter" in result.stdout else CLASSIC_STORE

    def server_version(self) -> str | None:
        """The daemon's version (`26.1.5`), None when it does not answer."""
        result = self._docker("version", "--format", "{{.Server.Version}}", check=False, quiet=True, timeout=30)
        return result.stdout.strip() or None

    def platform(self) -> str:
        """The daemon's platform as OCI writes it (`linux/amd64`)."""
        result = self._docker("version", "--format", "{{.Server.Os}}/{{.Server.Arch}}", quiet=True, timeout=30)
        return result.stdout.strip() or "linux/amd64"

    def copy_out(self, container: str, path: str, dest: Path, *, timeout: float = 300) -> bool:
        """Copy `path` out of a container (running or stopped) to the new host path `dest`.

        Files a container writes belong to its user (root, with FlashInfer's 0600 modes): read
        through docker, they land owned by whoever runs this, so an ordinary runner user can read
        and delete them. False when the container has no such path."""
        result = self._docker("cp", f"{container}:{path}", str(dest), check=False, quiet=True, timeout=timeout)
        missing = ("No such container:path", "Could not find the file")  # docker 20.10, docker 26
        if result.returncode != 0 and not any(text in result.stderr for text in missing):
            raise InfraError(f"docker cp {container}:{path} failed: {result.stderr.strip()[-500:]}")
        return result.returncode == 0

    def container_pids(self, container: str) -> list[int]:
        """Host PIDs of every process in a running container (`docker top`): what NVML reports per
        process. Empty when the container is gone."""
        result = self._docker("top", container, "-eo", "pid", check=False, quiet=True, timeout=30)
        if result.returncode != 0:
            return []
        return [int(word) for word in result.stdout.split() if word.isdigit()]

    def pid_sidecar(
        self,
        target: str,
        *,
        image: str,
        argv: Sequence[str],
        binds: dict[Path, str],
        labels: dict[str, str],
        timeout: float,
    ) -> cmd.CommandResult:
        """Run `argv` in a throw-away container that shares `target`'s PID namespace with ptrace
        rights (`--pid=container:T --cap-add SYS_PTRACE`): how a debugger reaches the processes of a
        running server without anything added to its image. `binds` are mounted read-only; no
        network. The sidecar is named before it starts and removed on every path, an interrupt too.
        """
        sidecar = Container(
            image=image,
            name=f"{target}-sidecar-{uuid.uuid4().hex[:8]}"[:128],
            role="sidecar",
            command=tuple(argv),
            labels=(("io.stackproof.target", target), *sorted(labels.items())),
            mounts=tuple(Mount(source=host, target=inside) for host, inside in sorted(binds.items())),
            network="none",
            pid=f"container:{target}",
            cap_add=("SYS_PTRACE",),
        )
        return self.run_to_end(sidecar, timeout=timeout)  # a timeout raises; the sidecar is removed all the same

    def build(
        self,
        context: Path,
        *,
        tag: str,
        platform: str,
        secrets: dict[str, Path],
        labels: dict[str, str],
        on_line: Callable[[str], None],
        no_cache: bool = False,
        cache_ref: str | None = None,
        timeout: float = 3600,
    ) -> cmd.CommandResult:
        """`cache_ref`: a registry reference buildx reads its layer cache from and writes it back to
        (`mode=max`: every stage's layers); only given where `registry_cache_supported()`."""
        argv = [*self.cli.build_argv(), "--network", "host", "--progress", "plain", "--tag", tag]
        if self.cli.mode == "buildx":
            argv += ["--platform", platform]
        if cache_ref is not None:
            argv += ["--cache-from", f"type=registry,ref={cache_ref}"]
            argv += ["--cache-to", f"type=registry,ref={cache_ref},mode=max,ignore-error=true"]
        for name, path in sorted(secrets.items()):
            argv += ["--secret", f"id={name},src={path}"]
        for name, value in sorted(labels.items()):
            argv += ["--label", f"{name}={value}"]
        if no_cache:
            argv.append("--no-cache")
        argv.append(str(context))
        return cmd.stream(argv, env=self.cli.build_env, on_line=on_line, timeout=timeout)

    def registry_cache_supported(self) -> tuple[bool, str]:
        """Whether builds can keep their layer cache in a registry, and why (not).

        Only buildx exports cache (the classic CLI's built-in BuildKit has inline cache only); its
        `docker` driver exports it only on the containerd image store, other drivers always."""
        if self.cli.mode != "buildx":
            return False, f"{self.cli.path} ({self.cli.version}) has no buildx"
        result = self._docker("buildx", "inspect", check=False, quiet=True, timeout=60)
        match = re.search(r"^Driver:\s*(\S+)", result.stdout, re.MULTILINE)
        driver = match.group(1) if match else "unknown"
        if driver == "docker" and self.image_store() != CONTAINERD_STORE:
            return False, "buildx's docker driver exports cache only on the containerd image store"
        return True, f"buildx {driver} driver"

    def import_rootfs(self, tarball: Path, tag: str, changes: Sequence[str]) -> str:
        argv = ["image", "import"]
        for change in changes:
            argv += ["--change", change]
        return self._docker(*argv, str(tarball), tag, timeout=1800).stdout.strip()

    def load_archive(self, archive: Path) -> str:
        """`docker load` of a docker or OCI image archive: its output (the `Loaded image` lines)."""
        return self._docker("image", "load", "--input", str(archive), timeout=1800).stdout

    def created_since(self, since: float, label: str) -> list[str]:
        """Names of containers carrying `label` created since `since` (epoch seconds), from the
        daemon's event log: proof of what was, or was never, started."""
        result = self._docker(
            "events",
            "--since",
            f"{since:.0f}",
            "--until",
            f"{time.time() + 1:.0f}",
            "--filter",
            "type=container",
            "--filter",
            "event=create",
            "--filter",
            f"label={label}",
            "--format",
            "{{.Actor.Attributes.name}}",
            timeout=60,
            quiet=True,
        )
        return result.stdout.split()


@contextlib.contextmanager
def _docker_config(ref: str, login: Credentials | None) -> Iterator[dict[str, str] | None]:
    """The environment for a docker CLI call that must log in as `login` to `ref`'s registry."""
    if login is None:
        yield None
        return
    host = ref.split("/", 1)[0]
    with tempfile.TemporaryDirectory(prefix="stackproof-docker-config-") as directory:
        path = Path(directory) / "config.json"
        auth = base64.b64encode(f"{login.username}:{login.secret}".encode()).decode()
        entry = {"identitytoken": login.secret} if login.identity_token else {"auth": auth}
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"auths": {host: entry}}, f)
        yield {"DOCKER_CONFIG": directory}
