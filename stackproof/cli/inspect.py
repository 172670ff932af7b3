"""`stackproof inspect log|autotune`: judge a file someone hands over (a log, an autotune cache)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.errors import InputError
from stackproof.cli.common import Command, arg
from stackproof.cli.common import emit as _emit
from stackproof.cli.common import jsonable as _jsonable
from stackproof.cli.common import load as _load

if TYPE_CHECKING:
    pass

__all__ = ["COMMANDS"]


def _inspect_log(args: argparse.Namespace) -> int:
    """Exit 1 when the log names a failure, 0 otherwise (clean, or inconclusive), 2 on bad input.

    The diagnosis (verify/logs/diagnosis.py) names the failure class, the incident only when its
    preconditions are shown, the facts and the last exception; docs/inspect-log.md is the JSON.
    Without --cell no expectation applies; with it, the cell's rules (and built-in sets) do.
    """
    from pipeline.result import CheckResult, Status
    from verify.logs.diagnosis import cell_facts, diagnose
    from verify.logs.logscan import Facts, judge, open_log, rules_for, scan

    cell = arm = None
    if args.cell:
        matrix, _ = _load(args)
        cell = matrix.cell(args.cell)
        arm = cell.arm(args.arm) if args.arm else None
    rules = rules_for(cell, arm, Facts(serve=True, arch=cell.arch, flashinfer=None, cudnn=None)) if cell else ()
    name = "stdin" if str(args.file) == "-" else str(args.file)
    try:
        with open_log(args.file) as data:
            problem = _not_a_text_log(data)
            if problem:
                raise InputError(f"{name}: {problem}")
            undecodable = _undecodable(data)
            diagnosis = diagnose(data, facts=cell_facts(cell, arm) if cell else ())
            rule_matches = scan(data, rules, ()) if rules else []
            size = len(data)
    except IsADirectoryError as exc:
        raise InputError(f"{name}: is a directory, not a log file") from exc
    except OSError as exc:
        raise InputError(f"{name}: cannot read: {exc.strerror or exc}") from exc
    if undecodable:
        print(
            f"stackproof: {name}: line {undecodable[1]}: {undecodable[0]} byte sequence(s) are not UTF-8; "
            "read as U+FFFD",
            file=sys.stderr,
        )
    checks = [c for c in judge(rule_matches, rules, source=name) if c.name != "signatures"] if rules else []
    status = Status.FAIL if diagnosis.verdict == "failed" else Status.PASS
    checks.append(CheckResult(name="diagnosis", status=status, message=diagnosis.summary()))
    failed = any(c.status is Status.FAIL for c in checks)
    verdict = (
        "failed" if failed else ("inconclusive" if any(c.status is Status.INCONCLUSIVE for c in checks) else "clean")
    )
    matches = [m.to_json() for m in rule_matches if m.kind != "evidence"]
    matches += [
        {"id": m.id.split(":")[1], "kind": "class", "line": m.line_no, "text": m.line}
        for m in diagnosis.matches
        if m.kind != "signature"
    ]
    if diagnosis.incident is not None:
        matches += [
            m.to_json() | {"kind": "incident"}
            for m in diagnosis.matches
            if m.kind == "signature" and m.id == diagnosis.incident.id
        ]
    document = {
        "schema_version": 2,
        "file": name,
        "bytes": size,
        "undecodable": None if not undecodable else {"sequences": undecodable[0], "first_line": undecodable[1]},
        "verdict": verdict,
        "failed": failed,
        "diagnosis": diagnosis.to_json(),
        "matches": sorted(matches, key=lambda m: m["line"])[:200],
        "checks": [_jsonable(c) for c in checks],
    }
    try:
        _emit(args, document, _diagnosis_text(name, verdict, diagnosis, checks))
    except BrokenPipeError:
        # The reader left (`| head`, `| grep -q`): the verdict still decides the exit code, and
        # stdout goes to /dev/null so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    # Exit 1 only for a named failure (a class, an incident, a cell's rule): a script can tell a
    # failing log from an excerpt that proves nothing either way (verdict inconclusive, exit 0).
    return 1 if verdict == "failed" else 0


def _not_a_text_log(data: Any) -> str | None:
    """Why these bytes cannot be a log (nothing, or binary), or None."""
    if len(data) == 0:
        return "empty: there is no log to inspect"
    head = bytes(data[:8192])
    if b"\0" in head:
        return (
            f"binary data (a NUL byte at offset {head.index(bytes(1))}), not a text log; decompress or extract it first"
        )
    return None


def _undecodable(data: Any, limit: int = 16 << 20) -> tuple[int, int] | None:
    """(count, line of the first) of the byte sequences that are not UTF-8 in the first `limit` bytes."""
    from verify.logs.logtext import decode

    head = bytes(data[:limit])
    _, count, first = decode(head)
    if not count or first is None:
        return None
    return count, head.count(b"\n", 0, first) + 1


def _diagnosis_text(name: str, verdict: str, diagnosis: Any, checks: list[Any]) -> str:
    lines = [f"{name}: {verdict.upper()}: {diagnosis.summary()}"]
    hit = diagnosis.primary
    if hit is not None:
        where = f" ({hit.process})" if hit.process else ""
        lines += [f"  line {hit.line_no}{where}: {hit.text[:300]}", f"  what: {hit.what}", f"  next: {hit.next}"]
    if diagnosis.incident is not None:
        lines.append(f"  shown by: {'; '.join(diagnosis.incident.shown_by)}")
        lines.append(f"  workaround: {diagnosis.incident.workaround}")
    for c in diagnosis.candidates:  # an incident the text shows, its preconditions unknown (issue 44)
        lines.append(f"  candidate (not the diagnosis): {c.text}")
        lines += [f"    check {check}" for check in c.checks]
    e = diagnosis.last_exception
    if e is not None:
        frame = f" at {e.frame.file}:{e.frame.line} in {e.frame.function}" if e.frame else ""
        process = f", {e.process}" if e.process else ""
        lines.append(f"  last exception (line {e.line_no}{process}): {e.type}: {e.message[:200]}{frame}")
    if diagnosis.startup.completed is not None:
        state = "completed" if diagnosis.startup.completed else diagnosis.startup.note
        shown = f"last step shown {diagnosis.startup.last_phase} (line {diagnosis.startup.line_no})"
        lines.append(f"  startup: {state}, {shown}")
    if diagnosis.facts:
        lines.append("  facts: " + ", ".join(f"{f.name}={f.value} ({f.source})" for f in diagnosis.facts[:20]))
    lines += [f"  also: {h.id} (line {h.line_no}, {h.count}x)" for h in diagnosis.classes[1:6]]
    lines += [f"  warning: {h.id}: {h.title} (line {h.line_no}, {h.count}x)" for h in diagnosis.warnings[:6]]
    lines += [f"{c.status:<12} {c.name}: {c.message[:300]}" for c in checks]
    return "\n".join(lines)


def _inspect_autotune(args: argparse.Namespace) -> int:
    """Exit 1 when a policy is violated."""
    from pipeline.result import Status
    from verify.kernels.autotune import FORMATS, judge_cache, load_policies, map_to_hybrid_bucket, read_cache, winners
    from verify.serving import autotune_file_patterns
    from verify.stages.autotune import winners_table

    cache = read_cache(args.file, files=autotune_file_patterns())
    written_by = next(f for f in FORMATS if f.name == cache.format)
    policies = load_policies()
    if args.policy:
        unknown = set(args.policy) - {p.id for p in policies}
        if unknown:
            known = ", ".join(p.id for p in policies)
            raise InputError(f"--policy: unknown {', '.join(sorted(unknown))} (known: {known})")
        policies = tuple(p for p in policies if p.id in args.policy)
    checks = judge_cache(cache, arch=args.arch, policies=policies)
    table = winners(cache)
    read = cache.file if cache.layout == "legacy" else cache.file.parent
    lines = [
        f"{args.file}: FlashInfer autotune cache, {len(cache.entries)} entries, format {cache.format} "
        f"({written_by.shape}; FlashInfer {written_by.since}: {written_by.source})"
    ]
    lines += [f"  read: {read}"] if read != args.file else []
    lines += [f"  {k}: {v}" for k, v in cache.metadata.items()]
    tables = winners_table(cache)
    buckets_for: dict[str, object] = {}
    for (op, n, k), rows in table.items():
        lines.append(f"{op} N={n} K={k}:" if n >= 0 else f"{op} (profiles not read as a GEMM's):")
        lines += [
            f"  M<={e.m_bucket:<6} {e.runner:<24} tactic {json.dumps(e.tactic)}"
            if e.profile is None
            else f"  {e.profile[:120]}: {e.runner} tactic {json.dumps(e.tactic)}"
            for e in rows
        ]
    for m in args.m:
        bucket = map_to_hybrid_bucket(m)
        served = {
            f"{op} N={n} K={k}": next((e.runner for e in rows if e.m_bucket == bucket), None)
            for (op, n, k), rows in table.items()
        }
        buckets_for[str(m)] = {"bucket": bucket, "runners": served}
        lines.append(f"M={m} -> bucket {bucket}: " + ", ".join(f"{s}: {r}" for s, r in served.items()))
    document = {
        "file": str(args.file),
        "read": str(read),
        "format": cache.format,
        "layout": cache.layout,
        "format_source": {"flashinfer": written_by.since, "shape": written_by.shape, "source": written_by.source},
        "metadata": cache.metadata,
        "tables": tables,
        "buckets_for": buckets_for,
        "checks": [_jsonable(c) for c in checks],
    }
    lines += [f"{c.status:<12} {c.name}: {c.message}" for c in checks]
    _emit(args, document, "\n".join(lines))
    return 1 if any(c.status is Status.FAIL for c in checks) else 0


COMMANDS = (
    Command(
        path=("inspect", "log"),
        help="what failed in a log: class, incident, facts, last exception",
        handler=_inspect_log,
        args=(
            arg("file", type=Path, help="a log file, a pipe or FIFO, or - for standard input"),
            arg("--cell", default=None, help="also apply this cell's rules (and its built-in rule sets)"),
            arg("--arm", default=None),
        ),
    ),
    Command(
        path=("inspect", "autotune"),
        help="winners per op, shape and M bucket + policy verdict",
        handler=_inspect_autotune,
        args=(
            arg(
                "file",
                type=Path,
                help="a legacy cache file (any FlashInfer 0.6-0.7 value shape, per-rank files too), or a "
                "managed v2 store: its directory, its manifest.json, or a root holding one v2/<hash> store",
            ),
            arg("--arch", default="", help="the GPU arch the cache is judged for (sm90, sm120, sm121...)"),
            arg("--policy", action="append", default=None, help="apply only these policies (by id)"),
            arg("--m", type=int, action="append", default=[], help="also say which bucket serves this M"),
        ),
    ),
)
