"""Autotune cache policies: which (op, runner) may not win a bucket, on which stacks, and how loudly.

A policy is selected by arch and by the versions the cache records (`_metadata`: cuDNN's backend
version as an integer, 92301 = 9.23.1, and FlashInfer's), and says `fail` (the runner is known to
fault there) or `warn` (selected where nobody has proven it faults or not: the soak arm to run is
named). The seed (vllm-project/vllm#55571): cuDNN's bmm_fp8 runner on SM12x faulted with FlashInfer
before 0.6.18 and cuDNN below 9.23.1. FlashInfer 0.6.18's gate keeps cuDNN out of the auto
candidates only below cuDNN 9.23.1 (flashinfer/gemm/gemm_base.py:10480-10494, :4158-4165 @0.7.4);
torch 2.14.x pins cuDNN 9.24.0.43, so on those images cuDNN is a candidate again, and FlashInfer
0.7.0's workspace fix (#4666) may or may not be what it needed: unproven until a soak says.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from pipeline.errors import MatrixError
from pipeline.matrix.yamlsrc import load_yaml
from pipeline.result import CheckResult, Status

__all__ = ["POLICIES_FILE", "Policy", "applicable", "judge_policy", "load_policies"]

POLICIES_FILE = Path(__file__).with_name("autotune_policies.yaml")
_KEYS = ("id", "when", "forbid", "why", "refs", "verdict", "soak")
_WHEN = ("arch", "cudnn_below", "cudnn_at_least", "flashinfer")


@dataclass(frozen=True, kw_only=True)
class Policy:
    id: str
    arch: tuple[str, ...]
    cudnn_below: int | None
    forbid: tuple[tuple[str, str], ...]  # (op, runner)
    why: str
    refs: tuple[str, ...]
    cudnn_at_least: int | None = None
    flashinfer: str | None = None  # a version specifier on the cache's FlashInfer
    verdict: str = "fail"  # fail: known to fault here; warn: selected, unproven (run `soak`)
    soak: str = ""
    line: int = 0  # where the policy's entry starts in its file (an audit finding cites it)


def _spec(value: Any, where: str, problems: list[str]) -> str | None:
    if value is None:
        return None
    try:
        SpecifierSet(str(value))
    except InvalidSpecifier:
        problems.append(f"{where}: {value!r} is not a version specifier")
    return str(value)


@cache
def load_policies(file: Path = POLICIES_FILE) -> tuple[Policy, ...]:
    src = load_yaml(file)
    problems: list[str] = []
    result = []
    for i, entry in enumerate((src.data or {}).get("policies") or []):
        problems += [f"{src.where(('policies', i, key))}: unknown key" for key in entry if key not in _KEYS]
        when = entry.get("when") or {}
        problems += [f"{src.where(('policies', i, 'when', k))}: unknown key" for k in when if k not in _WHEN]
        verdict = str(entry.get("verdict", "fail"))
        if verdict not in ("fail", "warn"):
            problems.append(f"{src.where(('policies', i, 'verdict'))}: must be fail or warn, got {verdict!r}")
        forbid = tuple((str(f["op"]), str(f["runner"])) for f in entry.get("forbid") or [])
        result.append(
            Policy(
                id=str(entry.get("id")),
                arch=tuple(when.get("arch") or ()),
                cudnn_below=when.get("cudnn_below"),
                cudnn_at_least=when.get("cudnn_at_least"),
                flashinfer=_spec(when.get("flashinfer"), src.where(("policies", i, "when", "flashinfer")), problems),
                verdict=verdict,
                forbid=forbid,
                why=str(entry.get("why", "")),
                refs=tuple(entry.get("refs") or ()),
                soak=str(entry.get("soak", "")),
                line=src.lines.get(("policies", i), 0),
            )
        )
    if problems:
        raise MatrixError(problems)
    return tuple(result)


def _fi_holds(spec: str | None, version: str | None) -> bool:
    if spec is None or version is None:
        return True  # an unknown FlashInfer satisfies the condition: the policy still watches
    try:
        return SpecifierSet(spec).contains(Version(version), prereleases=True)
    except InvalidVersion:
        return True


def applicable(
    policies: tuple[Policy, ...], arch: str, cudnn: int | None, flashinfer: str | None = None
) -> list[Policy]:
    """Policies for `arch` whose conditions hold. An unknown cuDNN satisfies `cudnn_below` (the
    faulting stack is assumed) but not `cudnn_at_least`; an unknown FlashInfer satisfies any."""
    return [
        p
        for p in policies
        if (not p.arch or arch in p.arch)
        and not (p.cudnn_below is not None and cudnn is not None and cudnn >= p.cudnn_below)
        and not (p.cudnn_at_least is not None and (cudnn is None or cudnn < p.cudnn_at_least))
        and _fi_holds(p.flashinfer, flashinfer)
    ]


def judge_policy(
    entries: list[Any],
    metadata: dict[str, Any],
    *,
    arch: str,
    policies: tuple[Policy, ...],
    extra_forbid: tuple[tuple[str, str], ...] = (),
    allow: tuple[tuple[str, str], ...] = (),
) -> CheckResult:
    """The `policy` check of one cache's winners (`Entry` rows of verify/kernels/autotune.py)."""
    cudnn = _int(metadata.get("cudnn_version"))
    chosen = applicable(policies, arch, cudnn, metadata.get("flashinfer_version"))
    by_id = {p.id: p for p in chosen}
    forbidden: dict[tuple[str, str], str] = {}
    for policy in chosen:  # the first policy that names a pair is the one cited (the file's order)
        for pair in policy.forbid:
            forbidden.setdefault(pair, policy.id)
    forbidden.update({pair: "cell" for pair in extra_forbid})
    for pair in allow:
        forbidden.pop(pair, None)
    if not forbidden:
        return CheckResult(
            name="policy",
            status=Status.SKIP,
            message=f"no autotune policy applies to {arch or 'this arch'} "
            f"with cuDNN {metadata.get('cudnn_version', '?')}",
        )
    offending = [e for e in entries if (e.op, e.runner) in forbidden]
    # The M=512 bucket first: it serves M=257..512, the prefill shapes of vllm-project/vllm#55571.
    offending.sort(key=lambda e: (e.m_bucket != 512, e.op, e.n, e.k, e.m_bucket))
    rows = [
        {"op": e.op, "runner": e.runner, "m_bucket": e.m_bucket, "n": e.n, "k": e.k, "tactic": e.tactic}
        | {"policy": forbidden[(e.op, e.runner)]}
        for e in offending
    ]
    evidence: dict[str, Any] = {
        "policies": [p.id for p in chosen],
        "forbidden": [f"{op}:{runner}" for op, runner in forbidden],
        "offending": rows,
    }
    if not offending:
        return CheckResult(
            name="policy",
            status=Status.PASS,
            evidence=evidence,
            message=f"no forbidden runner wins any bucket ({', '.join(evidence['forbidden'])})",
        )
    failing = [
        e
        for e in offending
        if by_id.get(forbidden[(e.op, e.runner)]) is None or by_id[forbidden[(e.op, e.runner)]].verdict == "fail"
    ]
    first = (failing or offending)[0]
    more = f" (and {len(offending) - 1} more)" if len(offending) > 1 else ""
    policy_id = forbidden[(first.op, first.runner)]
    where = f"{first.runner} wins {first.op} at M bucket {first.m_bucket} ({first.shape})"
    if failing:
        return CheckResult(
            name="policy", status=Status.FAIL, evidence=evidence, message=f"{where}, forbidden by {policy_id}{more}"
        )
    policy = by_id[policy_id]
    evidence["soak"] = policy.soak
    version = f"{metadata.get('cudnn_version', '?')}, FlashInfer {metadata.get('flashinfer_version', '?')}"
    return CheckResult(
        name="policy",
        status=Status.WARN,
        evidence=evidence,
        message=(
            f"cuDNN selected, unproven on this cuDNN ({version}): "
            f"{where}{more}; {policy.id}: soak to decide ({policy.soak})"
        ),
    )


def _verdict(by_id: dict[str, Policy], policy_id: str) -> str:
    policy = by_id.get(policy_id)
    return policy.verdict if policy is not None else "fail"


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None
