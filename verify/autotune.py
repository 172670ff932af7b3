"""FlashInfer autotune cache files: parse them safely, map M to buckets, apply per-arch policies.

Cache entry keys are `str((op, runner_class, nearest_profile, extras))`: a Python tuple repr that
names torch dtypes (`torch.float8_e4m3fn`), so it is not a literal. `parse_key` reads it with
`ast.parse` and turns names into strings; nothing is ever evaluated. Values are
`[runner_class, tactic]` for the winning runner of that bucket: a cuBLAS int, a cuDNN
`[engine, [[knob, value], ...]]`, a CUTLASS -1.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from pipeline.errors import InputError, MatrixError
from pipeline.jsonfile import read_json
from pipeline.result import CheckResult, Status
from pipeline.yamlsrc import load_yaml

__all__ = [
    "POLICIES_FILE",
    "AutotuneCache",
    "Entry",
    "Policy",
    "hybrid_buckets",
    "judge_cache",
    "load_policies",
    "map_to_hybrid_bucket",
    "parse_key",
    "read_cache",
    "winners",
]

POLICIES_FILE = Path(__file__).with_name("autotune_policies.yaml")
RESERVED = ("_metadata", "_generation", "_records")

# FlashInfer's hybrid bucket mapping (fused_moe/utils.py, identical in 0.6.16 and 0.6.18).
_PHASE1_END, _PHASE2_STEP, _PHASE2_END, _PHASE3_STEP, _PHASE3_END = 256, 256, 2048, 512, 4096


def _next_power_of_2(x: int) -> int:
    return 1 if x <= 1 else 1 << (x - 1).bit_length()


def _ceil_to_step(x: int, step: int) -> int:
    return ((x + step - 1) // step) * step


def map_to_hybrid_bucket(x: int) -> int:
    """The bucket a runtime M is served from: 405..482 -> 512, 513 -> 768, 4097 -> 8192."""
    if x <= 0:
        return 1
    if x <= _PHASE1_END:
        return _next_power_of_2(x)
    if x <= _PHASE2_END:
        return _ceil_to_step(x, _PHASE2_STEP)
    if x <= _PHASE3_END:
        return _ceil_to_step(x, _PHASE3_STEP)
    return _next_power_of_2(x)


def hybrid_buckets(max_tokens: int, min_tokens: int = 1) -> tuple[int, ...]:
    """The buckets tuned for a dummy run of `max_tokens` (vLLM's max_num_batched_tokens)."""
    buckets: list[int] = []
    m = _next_power_of_2(min_tokens)
    while m <= min(max_tokens, _PHASE1_END):
        buckets.append(m)
        m *= 2
    for start, step, end in (
        (_PHASE1_END + _PHASE2_STEP, _PHASE2_STEP, _PHASE2_END),
        (_PHASE2_END + _PHASE3_STEP, _PHASE3_STEP, _PHASE3_END),
    ):
        m = start
        while m <= min(max_tokens, end):
            buckets.append(m)
            m += step
    m = _PHASE3_END * 2
    while m <= max_tokens:
        buckets.append(m)
        m *= 2
    if max_tokens not in buckets:
        buckets.append(max_tokens)
    return tuple(b for b in buckets if b >= min_tokens)


# -- parsing -------------------------------------------------------------------------------------


def parse_key(key: str) -> tuple[Any, ...]:
    """`"('fp8_gemm', 'CudnnFp8GemmRunner', ((1, 512, 5120), ...), (torch.float8_e4m3fn, ...))"` -> a
    tuple of str/int/tuples, dtype names as strings. Raises ValueError on anything else."""
    try:
        tree = ast.parse(key, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not a cache key: {key[:80]!r}") from exc
    value = _literal(tree.body)
    if not isinstance(value, tuple):
        raise ValueError(f"not a cache key tuple: {key[:80]!r}")
    return value


def _literal(node: ast.AST) -> Any:
    if isinstance(node, ast.Tuple):
        return tuple(_literal(e) for e in node.elts)
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, int | str | float)):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        operand = _literal(node.operand)
        if isinstance(operand, int | float):
            return -operand
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_literal(node.value)}.{node.attr}"
    raise ValueError(f"unexpected {type(node).__name__} in a cache key")


@dataclass(frozen=True, kw_only=True)
class Entry:
    op: str
    runner: str
    m_bucket: int  # M of A's profile, -1 for an op whose profiles are not read as a GEMM's
    n: int
    k: int
    tactic: Any
    extras: tuple[Any, ...]
    key: str
    profile: str | None = None  # the raw profile, for an op not read as a GEMM: entries stay apart

    @property
    def shape(self) -> str:
        return f"N={self.n},K={self.k}" if self.profile is None else f"profile {self.profile}"


@dataclass(frozen=True, kw_only=True)
class AutotuneCache:
    file: Path
    metadata: dict[str, str]
    entries: tuple[Entry, ...]
    generation: str | None

    @property
    def format(self) -> str:
        """0.6.18.x writes `_generation` (and maybe `_records`); 0.6.16.x writes neither."""
        return "0.6.18+" if self.generation else "0.6.16"


def read_cache(file: Path) -> AutotuneCache:
    document = read_json(file, "autotune cache", mapping=False)
    if not isinstance(document, dict) or "_metadata" not in document:
        raise InputError(f"{file}: not a FlashInfer autotune cache (no _metadata)")
    if not isinstance(document["_metadata"], dict):
        raise InputError(f"{file}: _metadata: must be a JSON object, not a FlashInfer autotune cache")
    entries = []
    for key, value in document.items():
        if key in RESERVED:
            continue
        try:
            parts = parse_key(key)
            op, runner, profile, extras = parts[0], parts[1], parts[2], parts[3] if len(parts) > 3 else ()
        except (ValueError, IndexError) as exc:
            raise InputError(f"{file}: entry {key[:80]!r}: {exc}") from exc
        if not (isinstance(value, list) and len(value) == 2):
            raise InputError(f"{file}: entry {key[:80]!r}: value is not [runner, tactic]")
        dims = _gemm_dims(str(op), profile)
        m_bucket, n, k = dims or (-1, -1, -1)
        entries.append(
            Entry(
                op=str(op),
                runner=str(value[0]),
                m_bucket=m_bucket,
                n=n,
                k=k,
                tactic=value[1],
                extras=tuple(extras) if isinstance(extras, tuple) else (),
                key=key,
                profile=None if dims else repr(profile),
            )
        )
        if value[0] != runner:
            raise InputError(f"{file}: entry {key[:80]!r}: key names {runner}, value names {value[0]}")
    metadata = {k: str(v) for k, v in (document.get("_metadata") or {}).items()}
    return AutotuneCache(
        file=file,
        metadata=metadata,
        entries=tuple(entries),
        generation=document.get("_generation"),
    )


# Ops whose A operand is 2-D and FP4-packed, two values a byte: A=(M, K/2), B=(K/2, N). FlashInfer
# 0.6.18.post1 gemm/gemm_base.py mm_fp4 (L7172-7230): `b` is `b_fp4.T` and the output is
# (a.shape[0], b.shape[1]); its autotuned op is "fp4_gemm".
_PACKED_FP4_OPS = ("fp4_gemm",)


def _gemm_dims(op: str, profile: Any) -> tuple[int, int, int] | None:
    """(M bucket, N, K) of a GEMM profile, or None for a profile this reader does not understand.

    bmm-style ops profile A=(1, M, K), B=(1, K, N); FP4 GEMMs profile 2-D packed operands.
    """
    try:
        a, b = profile[0], profile[1]
        if len(a) == 3 and len(b) == 3:
            return int(a[1]), int(b[2]), int(a[2])
        if op in _PACKED_FP4_OPS and len(a) == 2 and len(b) == 2:
            return int(a[0]), int(b[1]), 2 * int(a[1])
    except (TypeError, IndexError, ValueError):
        pass
    return None


def winners(cache_: AutotuneCache) -> dict[tuple[str, int, int], list[Entry]]:
    """(op, N, K) -> entries sorted by M bucket: which runner (and tactic) serves each bucket.

    Entries of an op not read as a GEMM share (op, -1, -1) and are told apart by their raw profile.
    """
    table: dict[tuple[str, int, int], list[Entry]] = {}
    for entry in cache_.entries:
        table.setdefault((entry.op, entry.n, entry.k), []).append(entry)
    return {key: sorted(rows, key=lambda e: (e.m_bucket, e.profile or "")) for key, rows in sorted(table.items())}


# -- policies ------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Policy:
    id: str
    arch: tuple[str, ...]
    cudnn_below: int | None
    forbid: tuple[tuple[str, str], ...]  # (op, runner)
    why: str
    refs: tuple[str, ...]


@cache
def load_policies(file: Path = POLICIES_FILE) -> tuple[Policy, ...]:
    src = load_yaml(file)
    problems: list[str] = []
    result = []
    for i, entry in enumerate((src.data or {}).get("policies") or []):
        for key in entry:
            if key not in ("id", "when", "forbid", "why", "refs"):
                problems.append(f"{src.where(('policies', i, key))}: unknown key")
        when = entry.get("when") or {}
        forbid = tuple((str(f["op"]), str(f["runner"])) for f in entry.get("forbid") or [])
        result.append(
            Policy(
                id=str(entry.get("id")),
                arch=tuple(when.get("arch") or ()),
                cudnn_below=when.get("cudnn_below"),
                forbid=forbid,
                why=str(entry.get("why", "")),
                refs=tuple(entry.get("refs") or ()),
            )
        )
    if problems:
        raise MatrixError(problems)
    return tuple(result)


def applicable(policies: tuple[Policy, ...], arch: str, cudnn: int | None) -> list[Policy]:
    """Policies for `arch` whose cuDNN condition holds (an unknown cuDNN satisfies it)."""
    return [
        p
        for p in policies
        if (not p.arch or arch in p.arch)
        and not (p.cudnn_below is not None and cudnn is not None and cudnn >= p.cudnn_below)
    ]


def judge_cache(
    cache_: AutotuneCache,
    *,
    arch: str,
    policies: tuple[Policy, ...],
    expected: dict[str, str | None] | None = None,
    extra_forbid: tuple[tuple[str, str], ...] = (),
    allow: tuple[tuple[str, str], ...] = (),
) -> list[CheckResult]:
    """The policy verdict, and whether the cache was written by the environment under test."""
    checks = []
    if expected:
        differ = {
            k: {"cache": cache_.metadata.get(k), "image": v}
            for k, v in expected.items()
            if v is not None and cache_.metadata.get(k) not in (v, "*")
        }
        if differ:
            checks.append(
                CheckResult(
                    name="cache-environment",
                    status=Status.INCONCLUSIVE,
                    evidence=differ,
                    message="the cache was written in another environment ("
                    + ", ".join(f"{k}: {d['cache']} vs {d['image']}" for k, d in differ.items())
                    + "): FlashInfer ignores it, so it proves nothing here",
                )
            )
        else:
            checks.append(
                CheckResult(
                    name="cache-environment",
                    status=Status.PASS,
                    message="cache metadata matches the image under test",
                    evidence=expected,
                )
            )
    cudnn = _int(cache_.metadata.get("cudnn_version"))
    chosen = applicable(policies, arch, cudnn)
    forbidden = {pair: p.id for p in chosen for pair in p.forbid}
    forbidden.update({pair: "cell" for pair in extra_forbid})
    for pair in allow:
        forbidden.pop(pair, None)
    if not forbidden:
        checks.append(
            CheckResult(
                name="policy",
                status=Status.SKIP,
                message=f"no autotune policy applies to {arch or 'this arch'} "
                f"with cuDNN {cache_.metadata.get('cudnn_version', '?')}",
            )
        )
        return checks
    offending = [e for e in cache_.entries if (e.op, e.runner) in forbidden]
    # The M=512 bucket first: it serves M=257..512, the prefill shapes of vllm-project/vllm#55571.
    offending.sort(key=lambda e: (e.m_bucket != 512, e.op, e.n, e.k, e.m_bucket))
    evidence: dict[str, Any] = {
        "policies": [p.id for p in chosen],
        "forbidden": [f"{op}:{runner}" for op, runner in forbidden],
        "offending": [
            {
                "op": e.op,
                "runner": e.runner,
                "m_bucket": e.m_bucket,
                "n": e.n,
                "k": e.k,
                "tactic": e.tactic,
                "policy": forbidden[(e.op, e.runner)],
            }
            for e in offending
        ],
    }
    if offending:
        first = offending[0]
        more = f" (and {len(offending) - 1} more)" if len(offending) > 1 else ""
        checks.append(
            CheckResult(
                name="policy",
                status=Status.FAIL,
                evidence=evidence,
                message=f"{first.runner} wins {first.op} at M bucket {first.m_bucket} ({first.shape}), forbidden by "
                f"{forbidden[(first.op, first.runner)]}{more}",
            )
        )
    else:
        checks.append(
            CheckResult(
                name="policy",
                status=Status.PASS,
                evidence=evidence,
                message=f"no forbidden runner wins any bucket ({', '.join(evidence['forbidden'])})",
            )
        )
    return checks


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
