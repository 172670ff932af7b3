"""Run the in-image probe (in a container of the image, or on this host) and type its JSON.

The probe file itself (`inimage_probe.py`) is stdlib-only and is bind-mounted read-only into the
container; it is never part of an image. `ProbeReport.parse` is the one place that reads its JSON.
"""

from __future__ import annotations

import json
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from pipeline import cmd
from pipeline.docker.client import Container, Docker, Mount
from pipeline.errors import CheckFailed, InfraError
from verify.runtime import Runtime, as_runtime

__all__ = ["PROBE_FILE", "Distribution", "ImportOutcome", "ProbeReport", "probe_host", "probe_image"]

PROBE_FILE = Path(__file__).resolve().parents[1] / "probes" / "inimage_probe.py"
PROBE_SCHEMA = 1
PROBE_ROLE = "probe"  # the imports probe, the doctor and the kernel probe: short-lived, --network none


@dataclass(frozen=True, kw_only=True)
class Distribution:
    name: str  # canonical
    version: str
    location: str
    installer: str
    requires: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class ImportOutcome:
    module: str
    ok: bool
    absent: bool
    optional: bool
    error_type: str
    message: str
    traceback: tuple[str, ...]
    seconds: float
    log: tuple[str, ...] = ()  # the import's stderr tail (probes before it was kept have none)

    @property
    def quoted(self) -> str:
        return f"{self.error_type}: {self.message}"


@dataclass(frozen=True, kw_only=True)
class TorchInfo:
    version: str
    cuda: str | None
    cudnn: int | None
    cuda_available: bool
    gpus: tuple[dict[str, Any], ...]


@dataclass(frozen=True, kw_only=True)
class ProbeReport:
    python_version: str
    platform: str
    machine: str
    distributions: tuple[Distribution, ...]
    imports: tuple[ImportOutcome, ...]
    torch: TorchInfo | None
    env: tuple[tuple[str, str], ...]
    raw: dict[str, Any]

    def dist(self, name: str) -> Distribution | None:
        wanted = canonicalize_name(name)
        return next((d for d in self.distributions if d.name == wanted), None)

    def env_value(self, name: str) -> str | None:
        return dict(self.env).get(name)

    @classmethod
    def parse(cls, document: dict[str, Any]) -> ProbeReport:
        if document.get("probe_schema") != PROBE_SCHEMA:
            raise CheckFailed(f"probe output has probe_schema {document.get('probe_schema')!r}, not {PROBE_SCHEMA}")
        torch = document.get("torch")
        return cls(
            python_version=document["python"]["version"],
            platform=document["python"]["platform"],
            machine=document["python"]["machine"],
            distributions=tuple(
                Distribution(
                    name=str(canonicalize_name(d["name"])),
                    version=d["version"],
                    location=d["location"],
                    installer=d["installer"],
                    requires=tuple(d["requires"]),
                )
                for d in document["distributions"]
            ),
            imports=tuple(
                ImportOutcome(
                    module=name,
                    ok=bool(o["ok"]),
                    absent=bool(o.get("absent")),
                    optional=bool(o.get("optional")),
                    error_type=o.get("type", ""),
                    message=o.get("message", ""),
                    traceback=tuple(o.get("traceback", ())),
                    seconds=float(o.get("seconds", 0.0)),
                    log=tuple(o.get("log", ())),
                )
                for name, o in sorted(document["imports"].items())
            ),
            torch=None
            if torch is None
            else TorchInfo(
                version=torch["version"],
                cuda=torch.get("cuda"),
                cudnn=torch.get("cudnn"),
                cuda_available=bool(torch.get("cuda_available")),
                gpus=tuple(torch.get("gpus", ())),
            ),
            env=tuple(sorted(document["env"].items())),
            raw=document,
        )


def probe_image(
    runtime: Runtime | Docker,
    image: str,
    *,
    python: str,
    modules: tuple[str, ...],
    env: dict[str, str],
    gpus: str | None = None,
    timeout: float = 600,
) -> ProbeReport:
    """Run the probe with the image's own `python`, with the env the server would get, on the
    runtime the server would run on (the host runtime: in the environment it was given).

    No network (`--network none`, docker only): importing must not need one. The container is
    named up front so an interrupt can still remove it.
    """
    container = Container(
        image=image,
        name=f"stackproof-probe-{uuid.uuid4().hex[:12]}",
        role=PROBE_ROLE,
        command=(python, "/stackproof/probe.py", "--modules", ",".join(modules)),
        env=tuple(sorted(env.items())),
        mounts=(Mount(source=PROBE_FILE, target="/stackproof/probe.py"),),
        network="none",
        gpus=gpus,
    )
    print(f"imports: probing {image} ({', '.join(modules)})", file=sys.stderr)
    result = as_runtime(runtime).run_to_end(container, timeout=timeout)
    return _parse_output(result.stdout, result.stderr, result.returncode, where=image)


def probe_host(python: str, *, modules: tuple[str, ...], timeout: float = 600) -> ProbeReport:
    """Host mode: the same probe on the Python environment `python` belongs to."""
    result = cmd.run([python, str(PROBE_FILE), "--modules", ",".join(modules)], timeout=timeout, check=False)
    return _parse_output(result.stdout, result.stderr, result.returncode, where=python)


def _parse_output(stdout: str, stderr: str, returncode: int, *, where: str) -> ProbeReport:
    try:
        document = json.loads(stdout)
    except ValueError as exc:
        tail = "\n".join((stdout + stderr).strip().splitlines()[-20:])
        if "No such file" in stderr or "not found" in stderr:
            raise CheckFailed(f"the probe could not run in {where} (exit code {returncode}): {tail}") from exc
        raise InfraError(f"the probe in {where} printed no JSON (exit code {returncode}):\n{tail}") from exc
    return ProbeReport.parse(document)
