"""FlashInfer autotune caches: parse them safely, map M to buckets, apply per-arch policies.

Cache entry keys are `str((op, runner_class, nearest_profile, extras))`: a Python tuple repr that
names torch dtypes (`torch.float8_e4m3fn`), so it is not a literal. `parse_key` reads it with
`ast.parse` and turns names into strings; nothing is ever evaluated. Each key's winner is a runner
class and a tactic: a cuBLAS int, a cuDNN `[engine, [[knob, value], ...]]`, a CUTLASS -1.

Every layout FlashInfer has written (`FORMATS`, each with the FlashInfer version and file:line it
comes from) is read into one `AutotuneCache` of `Entry` values:
- the legacy JSON file, `_metadata` + `str(key) -> value`, where the value grew from
  `[runner, tactic]` (0.6.x) to `[runner, tactic, profiling_policy]` (0.7.2.post1) and
  `[runner, tactic, profiling_policy, selection]` (0.7.4). vLLM names it `autotune_configs.json`
  under a hash folder (0.26-0.32) or `autotune_configs_dp{d}_rank{r}.json` (0.33, per rank);
- the managed v2 store (0.7.x `autotune_v2`): `<root>/v2/<env_hash>/manifest.json` (the metadata)
  and one `entries/<sha256(key)[:24]>.json` per key, `{"key", "runner", "tactic",
  "profiling_policy"?, "key_fields"?}`.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pipeline.errors import InputError
from pipeline.guard.jsonfile import read_json
from pipeline.result import CheckResult, Status
from verify.kernels.policies import POLICIES_FILE, Policy, judge_policy, load_policies

__all__ = [
    "FORMATS",
    "POLICIES_FILE",
    "AutotuneCache",
    "CacheFormat",
    "Entry",
    "Policy",
    "hybrid_buckets",
    "judge_cache",
    "load_policies",
    "map_to_hybrid_bucket",
    "parse_key",
    "read_cache",
    "read_store",
    "winners",
]

RESERVED = ("_metadata", "_generation", "_records")
MANIFEST = "manifest.json"
STORE_SCHEMA = "v2"


@dataclass(frozen=True, kw_only=True)
class CacheFormat:
    """One on-disk shape of FlashInfer's autotune winners, from the release that first wrote it."""

    name: str  # AutotuneCache.format
    since: str  # the FlashInfer version read
    shape: str
    source: str  # FlashInfer file:line at that version


# Read from the released wheels; the fixtures under tests/fixtures/autotune are files these writers produced.
FORMATS = (
    CacheFormat(
        name="0.6.16",
        since="0.6.16.post3",
        shape="legacy file: _metadata + str(key) -> [runner, tactic]",
        source="the real H200 files (tests/fixtures/autotune); 0.6.16.x writes no _generation",
    ),
    CacheFormat(
        name="0.6.18+",
        since="0.6.18.post1",
        shape="legacy file, plus _generation (sha256 of the rest) and maybe _records",
        source="flashinfer/autotuner/autotuner.py:2459 save_configs, values :2513,2527, _generation :2635",
    ),
    CacheFormat(
        name="0.7.2+",
        since="0.7.2.post1",
        shape="legacy file, values [runner, tactic, profiling_policy]",
        source="flashinfer/autotuner/autotuner.py:3471 save_configs, values :3528-3547; load :3804",
    ),
    CacheFormat(
        name="0.7.4+",
        since="0.7.4",
        shape="legacy file, values [runner, tactic, profiling_policy?, selection?]",
        source="flashinfer/autotuner/autotuner.py:4597 save_configs, values :4653-4681; load :4936-4945",
    ),
    CacheFormat(
        name="managed-v2",
        since="0.7.2.post1",
        shape="<root>/v2/<sha256(manifest)[:16]>/manifest.json + entries/<sha256(key)[:24]>.json",
        source="flashinfer/autotune_cache.py:357-388 (env hash, entry path, manifest), :432-466 publish (0.7.4); "
        ":279-303, :343 (0.7.2.post1)",
    ),
)

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
    # 0.7.x provenance: how the winner was measured (`AutoTuner._profiling_policy`, e.g.
    # ("cuda_graph_profile_replays", None, "l2_cache_policy", "hot")) and, from 0.7.4, how it was
    # chosen (`AutoTuner._selection_record`: time_ms, runner_up_ms, margin, candidates).
    policy: tuple[Any, ...] | None = None
    selection: dict[str, Any] | None = None
    source: str | None = None  # the store's entry file it came from (managed store only)

    @property
    def shape(self) -> str:
        return f"N={self.n},K={self.k}" if self.profile is None else f"profile {self.profile}"


@dataclass(frozen=True, kw_only=True)
class AutotuneCache:
    file: Path  # the legacy file, or the managed store's manifest.json
    metadata: dict[str, str]  # the legacy `_metadata`, or the store's manifest
    entries: tuple[Entry, ...]
    generation: str | None
    layout: str = "legacy"  # "legacy" (one JSON file) or "managed-v2" (a store directory)

    @property
    def format(self) -> str:
        """Which writer's shape this is (`FORMATS`): the store, else the longest value seen, else
        `_generation` (0.6.18.x writes it, 0.6.16.x does not)."""
        if self.layout == "managed-v2":
            return "managed-v2"
        if any(e.selection is not None for e in self.entries):
            return "0.7.4+"
        if any(e.policy is not None for e in self.entries):
            return "0.7.2+"
        return "0.6.18+" if self.generation else "0.6.16"

    @property
    def store(self) -> Path | None:
        """The store's environment directory (<root>/v2/<env_hash>), for a managed store."""
        return self.file.parent if self.layout == "managed-v2" else None


def read_cache(path: Path, *, files: tuple[str, ...] = ()) -> AutotuneCache:
    """Any layout: a legacy file; a store directory, its manifest.json, its v2 folder or a root
    holding one store; or a directory holding one legacy file named by one of the glob patterns
    `files` (the engine's names, e.g. vLLM's `**/autotune_configs.json`: the serving driver's)."""
    if path.is_dir():
        found = _one_cache(path, files)
        return read_store(found.parent) if found.name == MANIFEST else _read_legacy(found)
    if path.name == MANIFEST:
        return read_store(path.parent)
    return _read_legacy(path)


def _one_cache(path: Path, files: tuple[str, ...]) -> Path:
    """The one manifest.json or legacy file in a directory; located errors for none or several."""
    if (path / MANIFEST).is_file():
        return path / MANIFEST
    store_glob = f"*/{MANIFEST}" if path.name == STORE_SCHEMA else f"{STORE_SCHEMA}/*/{MANIFEST}"
    # vLLM keeps its file in the root or one config-hash folder below it: `**/` is read as at most
    # one level, so naming a large directory by mistake never walks its whole tree.
    shallow = [g for pattern in files for g in _shallow(pattern)]
    patterns = tuple(dict.fromkeys((store_glob, *shallow)))
    found = sorted({p for pattern in patterns for p in path.glob(pattern) if p.is_file()})
    if len(found) == 1:
        return found[0]
    if found:
        names = ", ".join(str(p.relative_to(path)) for p in found[:8]) + (", ..." if len(found) > 8 else "")
        raise InputError(f"{path}: {len(found)} autotune caches ({names}): name one")
    raise InputError(f"{path}: no FlashInfer autotune cache here (looked for {', '.join(patterns)})")


def _shallow(pattern: str) -> tuple[str, ...]:
    if pattern.startswith("**/"):
        return (pattern[3:], f"*/{pattern[3:]}")
    return (pattern,)


def _read_legacy(file: Path) -> AutotuneCache:
    document = read_json(file, "autotune cache", mapping=False)
    if not isinstance(document, dict) or "_metadata" not in document:
        raise InputError(f"{file}: not a FlashInfer autotune cache (no _metadata)")
    if not isinstance(document["_metadata"], dict):
        raise InputError(f"{file}: _metadata: must be a JSON object, not a FlashInfer autotune cache")
    entries = []
    for key, value in document.items():
        if key in RESERVED:
            continue
        where = f"{file}: entry {key[:80]!r}"
        # [runner, tactic] up to 0.6.x; 0.7.2.post1 appends the profiling policy, 0.7.4 the
        # selection record after it (autotuner.py:4653-4681), and its loader takes value[2] as a
        # tuple and value[3] only if it is a dict (autotuner.py:4941-4945).
        if not (isinstance(value, list) and 2 <= len(value) <= 4):
            raise InputError(f"{where}: value: not [runner, tactic, policy?, selection?]")
        policy = value[2] if len(value) > 2 else None
        selection = value[3] if len(value) > 3 else None
        entries.append(_entry(where, key, value[0], value[1], policy, selection))
    metadata = {k: str(v) for k, v in (document.get("_metadata") or {}).items()}
    return AutotuneCache(
        file=file,
        metadata=metadata,
        entries=tuple(entries),
        generation=document.get("_generation"),
    )


def read_store(store: Path) -> AutotuneCache:
    """The managed v2 store at <root>/v2/<env_hash> (flashinfer/autotune_cache.py, 0.7.x).

    FlashInfer addresses an environment's directory by sha256 of its canonical manifest
    (autotune_cache.py:362-369, 0.7.4) and an entry's file by sha256 of its key (:377-379); it
    serves an entry only if its embedded key is the one looked up (:400-403). A file at another
    name is one FlashInfer never reads, so it is malformed here, not a winner.
    """
    manifest_file = store / MANIFEST
    manifest = read_json(manifest_file, "managed autotune store manifest", mapping=False)
    if not isinstance(manifest, dict):
        raise InputError(f"{manifest_file}: must be a JSON object (the store's environment)")
    if manifest.get("cache_schema") != STORE_SCHEMA:
        raise InputError(f"{manifest_file}: cache_schema: {manifest.get('cache_schema')!r}, expected {STORE_SCHEMA!r}")
    env_hash = hashlib.sha256(json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]
    # A copied store may be renamed; only a directory named like an env hash must be this one.
    if re.fullmatch(r"[0-9a-f]{16}", store.name) and store.name != env_hash:
        raise InputError(f"{manifest_file}: manifest hashes to {env_hash}, not to its directory {store.name}")
    entries = []
    for file in sorted((store / "entries").glob("*.json")):
        document = read_json(file, "managed autotune store entry", mapping=False)
        if not isinstance(document, dict):
            raise InputError(f"{file}: must be a JSON object {{key, runner, tactic, profiling_policy?}}")
        for field in ("key", "runner", "tactic"):
            if field not in document:
                raise InputError(f"{file}: {field}: missing")
        key = document["key"]
        if not isinstance(key, str):
            raise InputError(f"{file}: key: must be a string")
        expected = hashlib.sha256(key.encode()).hexdigest()[:24]
        if file.stem != expected:
            raise InputError(f"{file}: key: hashes to {expected}.json, so FlashInfer never reads this entry")
        policy = document.get("profiling_policy")
        entry = _entry(f"{file}", key, document["runner"], document["tactic"], policy, None, fields="field")
        entries.append(replace(entry, source=str(file)))
    return AutotuneCache(
        file=manifest_file,
        metadata={k: str(v) for k, v in manifest.items()},
        entries=tuple(entries),
        generation=None,
        layout="managed-v2",
    )


def _entry(
    where: str, key: str, runner: Any, tactic: Any, policy: Any, selection: Any, *, fields: str = "value"
) -> Entry:
    """One winner; `where` names the file (and key) and `fields` how its parts are called there."""
    names = (
        ("runner", "profiling_policy") if fields == "field" else ("value[0] (runner)", "value[2] (profiling policy)")
    )
    try:
        parts = parse_key(key)
        op, key_runner, profile, extras = parts[0], parts[1], parts[2], parts[3] if len(parts) > 3 else ()
    except (ValueError, IndexError) as exc:
        raise InputError(f"{where}: key: {exc}") from exc
    if not isinstance(runner, str):
        raise InputError(f"{where}: {names[0]}: must be a runner class name")
    if runner != key_runner:
        raise InputError(f"{where}: {names[0]}: key names {key_runner}, {fields} names {runner}")
    if policy is not None and not isinstance(policy, list):
        raise InputError(f"{where}: {names[1]}: must be a list")
    if selection is not None and not isinstance(selection, dict):
        raise InputError(f"{where}: value[3] (selection): must be an object")
    dims = _gemm_dims(str(op), profile)
    m_bucket, n, k = dims or (-1, -1, -1)
    return Entry(
        op=str(op),
        runner=runner,
        m_bucket=m_bucket,
        n=n,
        k=k,
        tactic=tactic,
        extras=tuple(extras) if isinstance(extras, tuple) else (),
        key=key,
        profile=None if dims else repr(profile),
        policy=tuple(policy) if policy is not None else None,
        selection=selection,
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


# -- policies (verify/kernels/policies.py) -------------------------------------------------------


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
    checks = [_cache_environment(cache_, expected)] if expected else []
    checks.append(
        judge_policy(
            list(cache_.entries),
            dict(cache_.metadata),
            arch=arch,
            policies=policies,
            extra_forbid=extra_forbid,
            allow=allow,
        )
    )
    return checks


def _cache_environment(cache_: AutotuneCache, expected: dict[str, str | None]) -> CheckResult:
    """Whether the cache's metadata names the environment under test: FlashInfer ignores a cache that does not."""
    differ = {
        k: {"cache": cache_.metadata.get(k), "image": v}
        for k, v in expected.items()
        if v is not None and cache_.metadata.get(k) not in (v, "*")
    }
    if differ:
        return CheckResult(
            name="cache-environment",
            status=Status.INCONCLUSIVE,
            evidence=differ,
            message="the cache was written in another environment ("
            + ", ".join(f"{k}: {d['cache']} vs {d['image']}" for k, d in differ.items())
            + "): FlashInfer ignores it, so it proves nothing here",
        )
    return CheckResult(
        name="cache-environment",
        status=Status.PASS,
        message="cache metadata matches the image under test",
        evidence=expected,
    )


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
