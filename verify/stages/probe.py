"""Run the in-image probe (in a container of the image, or on this host) and type its JSON.

The probe file itself (`inimage_probe.py`) is stdlib-only and is bind-mounted read-only into the
container; it is never part of an image. `ProbeReport.parse` is the one place that reads its JSON.
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

from pipeline import cmd
from pipeline.docker.client import Container, Docker, Mount
from pipeline.errors import CheckFailed, InfraError
from pipeline.findings import Distribution, ImportOutcome, ProbeReport, TorchInfo
from verify.runtime import Runtime, as_runtime

__all__ = ["PROBE_FILE", "Distribution", "ImportOutcome", "ProbeReport", "TorchInfo", "probe_host", "probe_image"]

PROBE_FILE = Path(__file__).resolve().parents[1] / "probes" / "inimage_probe.py"
PROBE_ROLE = "probe"  # the imports probe, the doctor and the kernel probe: short-lived, --network none


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
