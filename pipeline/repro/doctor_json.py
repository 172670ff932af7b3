"""The JSON of `stackproof doctor --json` (or of `verify/probes/doctor_probe.py`) -> `Report`."""

from __future__ import annotations

from typing import Any

from packaging.utils import canonicalize_name

from pipeline.errors import InputError
from pipeline.repro.facts import Finding, Gpu, Kind, Report, Seen
from pipeline.repro.util import OFFICIAL_USAGE_SOURCE, _check_version, _full_commit, _seen


def _from_doctor(doc: dict[str, Any], name: str) -> Report:
    if "doctor_schema" in doc:
        if doc["doctor_schema"] != 1:
            raise InputError(f"{name}: doctor_schema {doc['doctor_schema']!r} is not 1 (this tool reads 1)")
        probe = doc.get("probe")
        if not isinstance(probe, dict):
            raise InputError(f"{name}: the doctor output has no Python stack (probe_error: {doc.get('probe_error')})")
    else:
        probe, doc = doc, {}
    if probe.get("probe_schema") != 1 or not isinstance(probe.get("distributions"), list):
        raise InputError(f"{name}: probe.probe_schema {probe.get('probe_schema')!r} is not 1, or no distributions")
    findings: list[Finding] = []
    packages = []
    for dist in probe["distributions"]:
        canonical = str(canonicalize_name(dist["name"]))
        if dist.get("installer") == "stackproof":
            findings.append(
                Finding(
                    topic=canonical,
                    kind=Kind.NOTE,
                    message=f"{canonical} {dist['version']} is a metadata alias a stackproof recipe wrote: not pinned",
                )
            )
            continue
        _check_version(name, None, canonical, dist["version"])
        packages.append((canonical, Seen(value=dist["version"])))
    torch = probe.get("torch") or {}
    gpu = doc.get("gpu") or {}
    gpus = tuple(Gpu(name=d.get("name", ""), capability=d.get("capability"), line=None) for d in gpu.get("devices", ()))
    if not gpus and torch.get("gpus"):
        gpus = tuple(Gpu(name=g["name"], capability=g.get("capability"), line=None) for g in torch["gpus"])
    if not gpus and gpu.get("error"):
        findings.append(Finding(topic="GPU", kind=Kind.NOTE, message=f"no GPU where doctor ran ({gpu['error']})"))
    host = doc.get("host") or {}
    env = {k: Seen(value=v) for k, v in (probe.get("env") or {}).items()}
    cudnn_host = doc.get("cudnn_host") or {}
    stackproof = doc.get("stackproof") or {}
    dists = dict(packages)
    usage = env.get("VLLM_USAGE_SOURCE")
    return Report(
        source=name,
        kind="doctor",
        packages=tuple(sorted(packages)),
        complete=True,
        gpus=gpus,
        driver=_seen(gpu.get("driver")),
        cuda_driver=_seen(gpu.get("cuda_driver")),
        kernel=_seen(host.get("kernel")),
        machine=_seen((probe.get("python") or {}).get("machine") or host.get("machine")),
        python=_seen((probe.get("python") or {}).get("version")),
        torch_cuda=_seen(torch.get("cuda")),
        nvcc=_seen((doc.get("nvcc") or {}).get("version")),
        cudnn=_seen(cudnn_version_text(torch.get("cudnn"))),
        cudnn_libraries=tuple(cudnn_host.get("versions") or ()),
        vllm=dists.get("vllm"),
        official=usage if usage and usage.value == OFFICIAL_USAGE_SOURCE else None,
        image=_seen(stackproof.get("image")),
        build_commit=_full_commit(env.get("VLLM_BUILD_COMMIT")),
        cell=_seen(stackproof.get("cell")),
        env=tuple(sorted(env.items())),
        container=bool((host.get("container") or {}).get("detected")) if host else None,
        findings=tuple(findings),
    )


def cudnn_version_text(value: object) -> str | None:
    """torch.backends.cudnn.version() -> "9.20.0" (91900-style from cuDNN 9, 8902-style before)."""
    if not isinstance(value, int) or value <= 0:
        return None
    if value >= 90000:
        return f"{value // 10000}.{value % 10000 // 100}.{value % 100}"
    return f"{value // 1000}.{value % 1000 // 100}.{value % 100}"
