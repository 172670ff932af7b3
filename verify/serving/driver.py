"""What a check needs to know about a serving engine, as data and pure functions.

A driver is one frozen `ServingDriver` value in its own module (verify/serving/vllm.py, sglang.py):
how the engine is launched from a cell's serve spec, which HTTP paths it answers, the Prometheus
names its progress and token counters have, the log line that means "ready", the markers of a dead
engine, the titles of its processes (for NVML and py-spy), the variables that steer its kernels and
autotuning, and where its version is read from. Facts that moved between releases are kept as
`Since` entries, keyed by the first version they hold for, each with the upstream file:line it rests
on; `at_version` picks the one in force. Nothing here does I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from packaging.version import InvalidVersion, Version

from pipeline.matrix.model import Arm, ServeSpec

__all__ = [
    "AutotuneFacts",
    "CompileCacheFacts",
    "Endpoints",
    "LaunchSpec",
    "MetricNames",
    "ServingDriver",
    "Since",
    "at_version",
]

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class Since(Generic[T]):
    """A fact that holds from `version` on (until a later entry replaces it), and where it was read."""

    version: str
    value: T
    source: str  # upstream file:line at that version


def at_version(facts: tuple[Since[T], ...], version: str | None) -> Since[T] | None:
    """The entry in force at `version`: the latest whose version is not above it. An unknown or
    unparsable version takes the newest entry (today's stack is the likelier one); a version older
    than every entry takes none."""
    if not facts:
        return None
    ordered = sorted(facts, key=lambda f: Version(f.version))
    try:
        wanted = Version(version) if version else None
    except InvalidVersion:
        wanted = None
    if wanted is None:
        return ordered[-1]
    # Compare release numbers only: 0.28.0+cpu and 0.33.0rc1 hold the facts of their release line.
    release = Version(".".join(str(p) for p in wanted.release))
    held = [f for f in ordered if Version(f.version) <= release]
    return held[-1] if held else None


@dataclass(frozen=True, kw_only=True)
class Endpoints:
    """The HTTP paths the checks use; every engine here speaks the OpenAI-compatible API."""

    health: str = "/health"
    models: str = "/v1/models"
    completions: str = "/v1/completions"
    chat: str = "/v1/chat/completions"
    metrics: str = "/metrics"


@dataclass(frozen=True, kw_only=True)
class MetricNames:
    """Prometheus sample names (as scraped, counters with their `_total`), summed over engines.

    `steps` counts engine iterations where the engine exports such a counter; None where it does
    not, and then progress is read from generated tokens alone (`verify/load/progress.py`)."""

    generated: str
    prompt: str
    running: str
    waiting: str
    steps: str | None = None
    step_tokens: str | None = None
    source: str = ""  # upstream file:line of the definitions

    def all(self) -> tuple[str, ...]:
        return tuple(n for n in (self.generated, self.prompt, self.running, self.waiting, self.steps) if n)


@dataclass(frozen=True, kw_only=True)
class AutotuneFacts:
    """How the engine's FlashInfer autotune cache is placed, announced and laid out."""

    cache_env: str  # the variable naming the cache root inside the server
    controlled_env: tuple[str, ...]  # removed for a tuning server unless the arm sets them
    announcements: tuple[str, ...]  # regexes with a `path` group: the log line naming the file or root
    files: tuple[str, ...]  # glob patterns under the root for the cache file(s) it writes
    disabled_line: str | None = None  # the line saying tuning was switched off
    empty_line: str | None = None  # the line saying tuning ran and wrote nothing (no op of the model tunes)
    # What must hold for the engine to reach tuning at all, said when the log shows it never did
    # (no announcement, no disabled line): the likeliest cause is then outside the engine's flags.
    gate: str | None = None


@dataclass(frozen=True, kw_only=True)
class CompileCacheFacts:
    """How the engine treats a warm compile cache (pipeline/matrix/compilecache.py) at a release."""

    # A regex on the server log: the engine found the cache's artifact, failed to load it and
    # compiled again (the warm slot was filled but not used).
    reload_failed: str


@dataclass(frozen=True, kw_only=True)
class LaunchSpec:
    """What a launch needs: the cell's serve spec and arm, and where to listen."""

    serve: ServeSpec
    arm: Arm | None
    host: str
    port: int


@dataclass(frozen=True, kw_only=True)
class ServingDriver:
    name: str  # the value of `serve.engine`
    title: str  # for messages: "vLLM", "SGLang"
    distributions: tuple[str, ...]  # whose installed version is the engine's, first found wins
    imports: tuple[str, ...]  # the modules the imports probe tries by default ("name?" = optional)
    launch: Callable[[LaunchSpec], tuple[str, ...]]  # the server's argv
    ready_line: str  # a regex on the server log: the engine says it is ready
    endpoints: Endpoints = field(default_factory=Endpoints)
    # The health path runs a generation through the engine (so a wedged engine makes it time out or
    # answer 503 while the models and metrics paths still answer): the stall probe reads it so.
    health_runs_engine: bool = False
    metrics: tuple[Since[MetricNames], ...] = ()
    dead_markers: tuple[str, ...] = ()  # text of a dead engine, in an error body or the log
    # The body a request to a dead engine gets, per release: evidence only (verify/load/death.py tells
    # the death by behaviour); `matrix audit` checks it reaches the client (verify/audit/meanings.py).
    dead_bodies: tuple[Since[tuple[str, ...]], ...] = ()
    process_titles: tuple[str, ...] = ()  # /proc cmdline prefixes of the engine's processes
    engine_process: str = ""  # the one that runs the model loop (py-spy's first stop)
    env_prefixes: tuple[str, ...] = ()  # the engine's own variables (the imports probe records them)
    batch_invariant_env: str | None = None  # set to 1: greedy answers must not depend on the batch
    disabled_kernels_env: str | None = None  # a comma-separated list of kernel classes not to use
    autotune: tuple[Since[AutotuneFacts], ...] = ()
    compile_cache: tuple[Since[CompileCacheFacts], ...] = ()
    ignore_eos_field: str | None = "ignore_eos"  # the request extension for fixed output lengths
    # Extra fields of the greedy determinism completion (vLLM: tokens as ids, so any tokenizer compares).
    greedy_extras: tuple[tuple[str, object], ...] = ()
    rulesets: tuple[str, ...] = ()  # built-in log rule sets (verify/logs/logrules.yaml) for this engine
    version_source: str = ""  # where the version comes from, for reports
    # The engine's own release images (`repository:vX.Y.Z[-suffix]`) and, per release, the exact pins
    # its wheel declares for the packages the audit reads (`stackproof matrix audit` on such a base).
    release_image: str | None = None
    release_pins: Mapping[str, Mapping[str, str]] = field(default_factory=dict, hash=False)
    release_wheel_glibc: str = "manylinux_2_28"  # the wheel tag the release images' glibc installs

    def version(self, installed: Mapping[str, str | None]) -> str | None:
        """The engine's version from installed distributions (name -> version)."""
        return next((v for name in self.distributions if (v := installed.get(name))), None)

    def metric_names(self, version: str | None) -> MetricNames:
        found = at_version(self.metrics, version)
        if found is None:
            raise LookupError(f"{self.title} {version}: no metric names known for this release")
        return found.value

    def autotune_at(self, version: str | None) -> AutotuneFacts | None:
        """The autotune facts at this version; None when the engine has no FlashInfer autotune cache."""
        found = at_version(self.autotune, version)
        return found.value if found else None

    def compile_cache_at(self, version: str | None) -> CompileCacheFacts | None:
        """How the engine treats a warm compile cache at this version; None when nothing is known."""
        found = at_version(self.compile_cache, version)
        return found.value if found else None

    def release_of_image(self, image: str) -> str | None:
        """`lmsysorg/sglang:v0.5.18-cu130` -> `0.5.18` for this engine's release images, else None."""
        if self.release_image is None:
            return None
        repository, _, tag = image.partition("@")[0].rpartition(":")
        if repository.removeprefix("docker.io/") != self.release_image:
            return None
        match = re.fullmatch(r"v(\d+\.\d+\.\d+(?:\.post\d+)?)(?:-[\w.-]+)?", tag)
        return match.group(1) if match else None

    def batch_invariant(self, env: Mapping[str, str]) -> bool:
        return self.batch_invariant_env is not None and env.get(self.batch_invariant_env) == "1"

    def argv(self, serve: ServeSpec, arm: Arm | None, *, host: str, port: int) -> tuple[str, ...]:
        return self.launch(LaunchSpec(serve=serve, arm=arm, host=host, port=port))
