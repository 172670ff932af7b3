"""Docker at the edge: find a BuildKit-capable CLI, build, inspect, run and remove containers.

Every call goes through `pipeline.cmd`. Real GPU runners have `docker buildx`; the development
machines have Debian's docker 20.10, whose built-in BuildKit is reached with DOCKER_BUILDKIT=1
(a newer static client earlier on PATH, without buildx, cannot build with BuildKit at all).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from pipeline import cmd
from pipeline.errors import InfraError

__all__ = ["DockerCli", "Engine", "ImageInfo", "detect_cli"]

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


class Engine:
    """The docker operations the pipeline needs, on one CLI."""

    def __init__(self, cli: DockerCli) -> None:
        self.cli = cli

    @classmethod
    def connect(cls) -> Engine:
        """Detect the CLI and make sure a daemon answers; exit code 3 with a hint when none does."""
        engine = cls(_detect_cli_cached())
        result = cmd.run(
            [engine.cli.path, "info", "--format", "{{.ServerVersion}}"], check=False, quiet=True, timeout=30
        )
        if result.returncode != 0 or not result.stdout.strip():
            raise InfraError(
                "no docker daemon answers: start one (e.g. `dockerd --bridge=none --iptables=false`, see README) "
                f"and retry.\n{result.stderr.strip()[-500:]}"
            )
        return engine

    def docker(self, *args: str, timeout: float = 120, check: bool = True, quiet: bool = False) -> cmd.CommandResult:
        return cmd.run([self.cli.path, *args], timeout=timeout, check=check, quiet=quiet)

    def image(self, ref: str) -> ImageInfo | None:
        result = self.docker("image", "inspect", ref, check=False, quiet=True)
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

    def pull(self, ref: str, *, timeout: float = 3600) -> None:
        """Pull an image, its progress streamed to stderr."""
        argv = [self.cli.path, "pull", ref]
        cmd.stream(argv, on_line=lambda line: print(f"[pull] {line}", file=sys.stderr, flush=True), timeout=timeout)

    def copy_out(self, container: str, path: str, dest: Path, *, timeout: float = 300) -> bool:
        """Copy `path` out of a container (running or stopped) to the new host path `dest`.

        Files a container writes belong to its user (root, with FlashInfer's 0600 modes): read
        through docker, they land owned by whoever runs this, so an ordinary runner user can read
        and delete them. False when the container has no such path."""
        result = self.docker("cp", f"{container}:{path}", str(dest), check=False, quiet=True, timeout=timeout)
        missing = ("No such container:path", "Could not find the file")  # docker 20.10, docker 26
        if result.returncode != 0 and not any(text in result.stderr for text in missing):
            raise InfraError(f"docker cp {container}:{path} failed: {result.stderr.strip()[-500:]}")
        return result.returncode == 0

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
        timeout: float = 3600,
    ) -> cmd.CommandResult:
        argv = [*self.cli.build_argv(), "--network", "host", "--progress", "plain", "--tag", tag]
        if self.cli.mode == "buildx":
            argv += ["--platform", platform]
        for name, path in sorted(secrets.items()):
            argv += ["--secret", f"id={name},src={path}"]
        for name, value in sorted(labels.items()):
            argv += ["--label", f"{name}={value}"]
        if no_cache:
            argv.append("--no-cache")
        argv.append(str(context))
        return cmd.stream(argv, env=self.cli.build_env, on_line=on_line, timeout=timeout)

    def import_rootfs(self, tarball: Path, tag: str, changes: Sequence[str]) -> str:
        argv = ["image", "import"]
        for change in changes:
            argv += ["--change", change]
        return self.docker(*argv, str(tarball), tag, timeout=600).stdout.strip()

    def created_since(self, since: float, label: str) -> list[str]:
        """Names of containers carrying `label` created since `since` (epoch seconds), from the
        daemon's event log: proof of what was, or was never, started."""
        result = self.docker(
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
