"""The verified matrix as data: receipts -> a typed site (cells x hosts squares, cell pages, compares).

Pure: every function here takes parsed JSON and returns frozen dataclasses. Reading files and
registries is `sources.py`; drawing is `plots.py`; HTML is `render.py`.

A square shows only what a receipt says. A cell with no receipt on a host is "not verified" there,
never filled in from another host, another image or a fixture.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.errors import InputError
from pipeline.matrix.model import STAGES
from pipeline.receipt import RECEIPT_KIND, RECEIPT_SCHEMA_VERSION, receipt_problems

__all__ = [
    "ORIGIN_BENCHMARK",
    "ORIGIN_RECEIPT_ONLY",
    "ORIGIN_REGISTRY",
    "ORIGIN_RUN_DIR",
    "TRIO",
    "Compare",
    "Host",
    "LoadRaw",
    "Receipt",
    "Site",
    "Square",
    "build_site",
    "parse_receipt",
]

TRIO = ("vllm", "flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache")
# What the index's version filter and the compare page's pins table look at.
VERSIONED = (*TRIO, "torch", "nvidia-cudnn-cu13")
STATUSES = ("PASS", "FAIL", "INCONCLUSIVE", "NOT_REPRODUCED", "EXPECTED_FAIL")
STATUS_LABELS = {
    "PASS": "PASS",
    "FAIL": "FAIL",
    "INCONCLUSIVE": "INCONCLUSIVE",
    "NOT_REPRODUCED": "NOT REPRODUCED",
    "EXPECTED_FAIL": "expected failure seen",
}
ORIGIN_RUN_DIR = "run directory"
ORIGIN_RECEIPT_ONLY = "receipt file"
ORIGIN_REGISTRY = "registry"
ORIGIN_BENCHMARK = "generated for the benchmark"


@dataclass(frozen=True, kw_only=True)
class LoadRaw:
    """The load stage's raw series, from the run directory's requests.jsonl and scrapes.jsonl."""

    ttft_ms: tuple[float, ...]
    itl_ms: tuple[float, ...]
    # (seconds from the load's start, output tokens/s since the previous scrape, requests in flight)
    timeline: tuple[tuple[float, float, int], ...]


@dataclass(frozen=True, kw_only=True)
class Host:
    key: str
    summary: str
    arch: str  # sm90, sm120, ... from the GPUs' compute capability; "cpu" without a GPU
    gpus: tuple[str, ...]
    driver: str

    @property
    def label(self) -> str:
        """The column's name: "H200 (sm90)", "2x H200 (sm90)", or "CPU" for a host without GPU."""
        if not self.gpus:
            return "CPU"
        names = sorted(set(self.gpus))
        short = ", ".join(n.removeprefix("NVIDIA ").strip() for n in names)
        count = f"{len(self.gpus)}x " if len(self.gpus) > 1 else ""
        return f"{count}{short} ({self.arch})"


@dataclass(frozen=True, kw_only=True)
class Receipt:
    """What the site shows of one receipt; `document` is the receipt itself, linked as it was."""

    id: str  # the first 12 hex digits of the receipt's sha256: stable page and file names
    source: str  # the file or registry reference it was read from
    origin: str  # one of the ORIGIN_* labels, shown beside every number taken from it
    cell: str
    arm: str | None
    status: str  # PASS | FAIL | INCONCLUSIVE | NOT_REPRODUCED | EXPECTED_FAIL (a known-bad cell that failed)
    status_reason: str
    expected_failure: str | None
    image_ref: str
    image_id: str
    runtime: str  # where its servers ran: "docker" (an image's containers) or "host" (a host environment)
    host: Host
    started_at: str
    seconds: float
    versions: Mapping[str, str]
    stages: tuple[tuple[str, str, float], ...]  # (stage, status, seconds)
    overrides: Mapping[str, Mapping[str, Any]]  # name -> {pinned, installed, index}
    intentional_overrides: tuple[Any, ...]
    determinism: tuple[tuple[str, str, str], ...]  # (check, status, message)
    load: Mapping[str, Any] | None
    autotune: tuple[Mapping[str, Any], ...]  # winners tables: {op, n, k, rows: [{m_bucket, runner, tactic}]}
    events: tuple[Mapping[str, Any], ...]  # the load's watchdog events (stall verdicts)
    artifacts: Mapping[str, Mapping[str, str]]  # stage -> name -> path on the verifying host
    document: Mapping[str, Any]
    raw: LoadRaw | None = None  # None: only the receipt is at hand (no run directory)
    files: Mapping[str, bytes] = field(default_factory=dict)  # server_log, junit, summary when present

    @property
    def date(self) -> str:
        return self.started_at[:10]

    @property
    def label(self) -> str:
        return f"{self.cell}{' / ' + self.arm if self.arm else ''} on {self.host.summary}, {self.started_at}"

    def latency(self, metric: str, quantile: str) -> float | None:
        return _finite(_dig(self.load, "latency_ms", metric, quantile))

    @property
    def complete(self) -> bool:
        return {s for s, _, _ in self.stages} >= set(STAGES)

    @property
    def tok_s(self) -> float | None:
        return _finite(_dig(self.load, "throughput", "output_tok_s"))


def _dig(value: Any, *path: str) -> Any:
    """`value[a][b]...`, None where a level is missing or not an object (a hostile receipt's shapes)."""
    for part in path:
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _finite(value: Any) -> float | None:
    """A number the pages and plots can show: finite, never a bool; anything else is no number."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


@dataclass(frozen=True, kw_only=True)
class Square:
    cell: str
    host: Host
    receipt: Receipt | None  # None: not verified on this host
    others: int  # further receipts of this cell on this host (other arms, older dates)


@dataclass(frozen=True, kw_only=True)
class Compare:
    id: str
    cell: str
    a: Receipt
    b: Receipt
    why: str  # "two hosts", "two dates", "two arms"


@dataclass(frozen=True, kw_only=True)
class Site:
    cells: tuple[str, ...]
    cell_arch: Mapping[str, str]  # the cell's arch when known (the matrix, else its receipts' hosts)
    hosts: tuple[Host, ...]
    squares: Mapping[tuple[str, str], Square]  # (cell, host key)
    receipts: tuple[Receipt, ...]
    by_cell: Mapping[str, tuple[Receipt, ...]]  # newest first
    compares: Mapping[str, tuple[Compare, ...]]  # cell -> compare pages

    def square(self, cell: str, host: Host) -> Square:
        return self.squares[(cell, host.key)]


# -- parsing -----------------------------------------------------------------------------------------


def parse_receipt(
    document: Any,
    *,
    source: str,
    origin: str,
    raw: LoadRaw | None = None,
    files: Mapping[str, bytes] | None = None,
) -> Receipt:
    """A receipt's JSON -> Receipt, or InputError naming the source and the path of the field that
    is wrong: every field the site reads is read through `_Getter`, typed, never as a bare dict."""
    if not isinstance(document, dict):
        raise InputError(f"{source}: not a receipt (a JSON {type(document).__name__}, not an object)")
    if document.get("kind") != RECEIPT_KIND:
        raise InputError(f"{source}: kind: {document.get('kind')!r}, not {RECEIPT_KIND!r}")
    if document.get("schema_version") != RECEIPT_SCHEMA_VERSION:
        version = document.get("schema_version")
        raise InputError(f"{source}: schema_version: {version!r}; this report reads {RECEIPT_SCHEMA_VERSION}")
    get = _Getter(document, source)
    status = get.text("status")
    if status not in STATUSES[:4]:
        raise InputError(f"{source}: status: {status!r}, not one of {', '.join(STATUSES[:4])}")
    get.optional("outcome", dict), get.optional("runtime", dict)  # objects when present: named if not
    expected = get.optional("outcome.expected_failure", str)
    stages = get.items("stages")
    for i, stage in enumerate(stages):
        if not isinstance(stage, dict) or not isinstance(stage.get("stage"), str):
            raise InputError(f"{source}: stages[{i}]: not a stage object")
    checks: dict[tuple[str, Any], dict[str, Any]] = {}
    for i, stage in enumerate(stages):
        for j, check in enumerate(get.optional(f"stages[{i}].checks", list) or ()):
            if isinstance(check, dict):
                checks[(stage["stage"], check.get("name"))] = check
            else:
                raise InputError(f"{source}: stages[{i}].checks[{j}]: not a check object")
    overrides = _sub(checks.get(("imports", "overrides")), "evidence", source, "stages[imports].checks[overrides]")
    requirements = _sub(checks.get(("imports", "requirements")), "evidence", source, "stages[imports].checks")
    intentional = requirements.get("intentional_overrides") or ()
    if not isinstance(intentional, list | tuple):
        raise InputError(f"{source}: imports requirements evidence.intentional_overrides: expected a list")
    load = get.optional("load", dict)
    events = _at(load or {}, "events", list, source, "load.events") or ()
    image = get.obj("image")
    cell = get.text("cell")
    believed, reason = believed_status(document, status, cell, source)
    if status == "FAIL" and expected:
        believed = "EXPECTED_FAIL"  # a known-bad cell whose failure was seen: the check works
    return Receipt(
        id=receipt_id(document),
        source=source,
        origin=origin,
        cell=cell,
        arm=get.optional("arm", str),
        status=believed,
        status_reason=reason or str(get.optional("status_reason", str) or ""),
        expected_failure=str(expected) if expected else None,
        image_ref=str(_at(image, "ref", str, source, "image.ref") or ""),
        image_id=str(_at(image, "id", str, source, "image.id") or ""),
        runtime=str(_at(image, "runtime", str, source, "image.runtime") or "docker"),  # older receipts: docker
        host=_host(get.obj("host"), source),
        started_at=get.text("started_at"),
        seconds=get.number("seconds"),
        versions={str(k): str(v) for k, v in (get.optional("runtime.distributions", dict) or {}).items()},
        stages=tuple(
            (s["stage"], str(s.get("status")), get.number(f"stages[{i}].seconds")) for i, s in enumerate(stages)
        ),
        overrides={str(k): v for k, v in overrides.items() if isinstance(v, dict)},
        intentional_overrides=tuple(intentional),
        determinism=tuple(
            (str(name), str(c.get("status")), str(c.get("message") or ""))
            for (stage, name), c in checks.items()
            if stage == "load" and str(name).startswith("determinism")
        ),
        load=load,
        autotune=_autotune(document.get("autotune"), source),
        events=tuple(e for e in events if isinstance(e, dict)),
        artifacts={
            s["stage"]: {str(k): str(v) for k, v in (get.optional(f"stages[{i}].artifacts", dict) or {}).items()}
            for i, s in enumerate(stages)
        },
        document=document,
        raw=raw,
        files=dict(files or {}),
    )


def believed_status(document: Mapping[str, Any], status: str, cell: str, source: str) -> tuple[str, str | None]:
    """The status the site may show, and why it differs from the receipt's own (None: it does not).

    A receipt is data anyone can edit: a PASS is shown only when its stages give that PASS by the
    receipt rules (every stage ran, none failed: `pipeline.receipt.receipt_problems`) and the image
    it names is the cell's (`stackproof/CELL:TAG`, a sha256 image id). Anything else that claims PASS
    is shown INCONCLUSIVE, with the reason."""
    if status != "PASS":
        return status, None
    problems = receipt_problems(dict(document))
    found = document.get("image")
    image: Mapping[str, Any] = found if isinstance(found, dict) else {}
    ref, image_id = str(image.get("ref") or ""), str(image.get("id") or "")
    repository = ref.rsplit("@", 1)[0].rsplit(":", 1)[0] if ":" in ref.rsplit("/", 1)[-1] else ref.rsplit("@", 1)[0]
    if repository.startswith("stackproof/") and repository != f"stackproof/{cell}":
        problems.append(f"it names the image {ref}, not one of cell {cell}")
    if not _IMAGE_ID.fullmatch(image_id):
        problems.append(f"its image id {image_id[:80]!r} is not a sha256 digest")
    if problems:
        return "INCONCLUSIVE", "claims PASS, but " + "; ".join(problems)
    return status, None


_IMAGE_ID = re.compile(r"sha256:[0-9a-f]{64}")


def _sub(value: Any, key: str, source: str, where: str) -> dict[str, Any]:
    found = (value or {}).get(key) if isinstance(value, dict) else None
    if found is None:
        return {}
    if not isinstance(found, dict):
        raise InputError(f"{source}: {where}.{key}: a {type(found).__name__}, expected an object")
    return found


def _at(mapping: Mapping[str, Any], key: str, kind: type | tuple[type, ...], source: str, where: str) -> Any:
    value = mapping.get(key)
    if value is not None and not isinstance(value, kind):
        raise InputError(f"{source}: {where}: a {type(value).__name__}, expected {_kind_name(kind)}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {str: "a string", dict: "an object", list: "a list", int: "a number", float: "a number"}
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(dict.fromkeys(names.get(k, k.__name__) for k in kinds))


def receipt_id(document: Mapping[str, Any]) -> str:
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


class _Getter:
    """Fields by path (`outcome.expected_failure`, `stages[2].seconds`), each missing or mistyped
    required one, and each mistyped optional one, named by its path in the receipt."""

    def __init__(self, document: Mapping[str, Any], source: str) -> None:
        self.document, self.source = document, source

    def _walk(self, path: str) -> Any:
        value: Any = self.document
        for part in re.findall(r"[^.\[\]]+", path):
            if isinstance(value, dict):
                value = value.get(part)
            elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
                value = value[int(part)]
            else:
                return None
        return value

    def _get(self, key: str, kind: type, name: str) -> Any:
        value = self._walk(key)
        if not isinstance(value, kind) or isinstance(value, bool) is not (kind is bool):
            found = "missing" if value is None else f"a {type(value).__name__}"
            raise InputError(f"{self.source}: {key}: {found}, expected {name}")
        return value

    def optional(self, key: str, kind: type) -> Any:
        value = self._walk(key)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            raise InputError(f"{self.source}: {key}: a {type(value).__name__}, expected {_kind_name(kind)}")
        return value

    def number(self, key: str) -> float:
        """An optional finite number, 0 when absent."""
        value = self._walk(key)
        if value is None:
            return 0.0
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise InputError(f"{self.source}: {key}: {str(value)[:40]!r}, expected a finite number")
        return float(value)

    def text(self, key: str) -> str:
        return str(self._get(key, str, "a string"))

    def obj(self, key: str) -> dict[str, Any]:
        value: dict[str, Any] = self._get(key, dict, "an object")
        return value

    def items(self, key: str) -> list[Any]:
        value: list[Any] = self._get(key, list, "a list")
        return value


def _autotune(tables: Any, source: str) -> tuple[Mapping[str, Any], ...]:
    if tables is None:
        return ()
    if not isinstance(tables, list):
        raise InputError(f"{source}: autotune: a {type(tables).__name__}, expected a list of winners tables")
    for i, table in enumerate(tables):
        where = f"{source}: autotune[{i}]"
        if not isinstance(table, dict) or not {"op", "n", "k", "rows"} <= table.keys():
            raise InputError(f"{where}: expected {{op, n, k, rows}}")
        for key in ("n", "k"):
            if isinstance(table[key], bool) or not isinstance(table[key], int):
                raise InputError(f"{where}.{key}: {str(table[key])[:40]!r}, expected an integer")
        for j, row in enumerate(table["rows"] if isinstance(table["rows"], list) else [None]):
            if not isinstance(row, dict) or not isinstance(row.get("m_bucket"), int) or "runner" not in row:
                raise InputError(f"{where}.rows[{j}]: expected {{m_bucket: int, runner, tactic}}")
    return tuple(tables)


def _host(host: Mapping[str, Any], source: str) -> Host:
    key = host.get("key")
    if not isinstance(key, str) or not key:
        raise InputError(f"{source}: host.key: missing, expected the host fingerprint")
    gpus = [g for g in host.get("gpus") or () if isinstance(g, dict)]
    caps = sorted({str(g.get("compute_capability", "")) for g in gpus} - {""})
    arch = ",".join("sm" + c.replace(".", "") for c in caps) if caps else "cpu"
    return Host(
        key=key,
        summary=str(host.get("summary") or key),
        arch=arch,
        gpus=tuple(str(g.get("name", "?")) for g in gpus),
        driver=str(host.get("driver") or "none"),
    )


def load_raw(requests: Iterable[Mapping[str, Any]], scrapes: Iterable[Mapping[str, Any]]) -> LoadRaw:
    """The distributions and the timeline from requests.jsonl and scrapes.jsonl records (load requests only)."""
    ttft: list[float] = []
    itl: list[float] = []
    for record in requests:
        if record.get("kind", "load") != "load" or record.get("error_class"):
            continue
        if (first := _finite(record.get("ttft"))) is not None:
            ttft.append(first * 1000)
        listed = record.get("itl")
        gaps: list[Any] = listed if isinstance(listed, list) else []
        itl.extend(x * 1000 for x in map(_finite, gaps) if x is not None)
    timeline: list[tuple[float, float, int]] = []
    previous: tuple[float, float] | None = None
    for scrape in scrapes:
        at, generated = _finite(scrape.get("t")), _finite(scrape.get("generated"))
        if at is None:
            continue
        rate = 0.0
        if generated is not None:
            if previous is not None and at > previous[0]:
                rate = max(0.0, (generated - previous[1]) / (at - previous[0]))
            previous = (float(at), float(generated))
        in_flight = _finite(scrape.get("in_flight"))
        timeline.append((at, rate, int(in_flight) if in_flight is not None and 0 <= in_flight < 1e9 else 0))
    return LoadRaw(ttft_ms=tuple(ttft), itl_ms=tuple(itl), timeline=tuple(timeline))


# -- the site ----------------------------------------------------------------------------------------


def build_site(
    receipts: Sequence[Receipt], *, cells: Sequence[str] = (), cell_arch: Mapping[str, str] | None = None
) -> Site:
    """Cells x hosts. `cells` adds rows with no receipt (shown "not verified") and, when given, is the
    row order; receipts of other cells still get rows after them (a receipt is never hidden)."""
    unique = {r.id: r for r in receipts}  # the same receipt from two places is one receipt
    ordered = sorted(unique.values(), key=lambda r: (r.started_at, r.id), reverse=True)
    rows = list(dict.fromkeys([*cells, *sorted({r.cell for r in ordered})]))
    hosts = {r.host.key: r.host for r in sorted(ordered, key=lambda r: (_arch_order(r.host.arch), r.host.summary))}
    by_cell = {cell: tuple(r for r in ordered if r.cell == cell) for cell in rows}
    squares: dict[tuple[str, str], Square] = {}
    for cell in rows:
        for host in hosts.values():
            mine = prefer([r for r in by_cell[cell] if r.host.key == host.key])
            main = next((r for r in mine if r.arm is None), mine[0] if mine else None)
            squares[(cell, host.key)] = Square(cell=cell, host=host, receipt=main, others=max(0, len(mine) - 1))
    arch = dict(cell_arch or {})
    for cell in rows:
        if cell not in arch:
            seen = sorted({r.host.arch for r in by_cell[cell]})
            arch[cell] = ",".join(seen) if seen else "unknown"
    return Site(
        cells=tuple(rows),
        cell_arch=arch,
        hosts=tuple(hosts.values()),
        squares=squares,
        receipts=tuple(ordered),
        by_cell=by_cell,
        compares={cell: compares_of(cell, by_cell[cell]) for cell in rows},
    )


def _arch_order(arch: str) -> tuple[int, str]:
    """CPU hosts first, then GPUs by compute capability (sm90 before sm100), not by spelling."""
    digits = "".join(ch for ch in arch.split(",")[0] if ch.isdigit())
    return (int(digits) if digits else 0, arch)


def prefer(receipts: Sequence[Receipt]) -> list[Receipt]:
    """Full verifications first, each group newest first: a later `--stages imports` check of the same
    image proves less than the full run before it, and must not hide that run's square."""
    return sorted(receipts, key=lambda r: (r.complete, r.started_at, r.id), reverse=True)


def compares_of(cell: str, receipts: Sequence[Receipt]) -> tuple[Compare, ...]:
    """Each receipt against the previous one of its host and arm (two dates), and the newest of each
    (host, arm) against the newest of all (two hosts, two arms): linear in the receipts, never all
    pairs (150 hosts gave 11,175 pages as pairs; a reader compares against the reference)."""
    newest: dict[tuple[str, str | None], Receipt] = {}
    pairs: dict[tuple[str, str], Compare] = {}
    for receipt in receipts:  # newest first
        newest.setdefault((receipt.host.key, receipt.arm), receipt)
    # two dates: consecutive receipts of one (host, arm)
    series: dict[tuple[str, str | None], list[Receipt]] = {}
    for receipt in receipts:
        series.setdefault((receipt.host.key, receipt.arm), []).append(receipt)
    for runs in series.values():
        for later, earlier in itertools.pairwise(runs):
            pairs[(earlier.id, later.id)] = _compare(cell, earlier, later, "two dates")
    heads = list(newest.values())
    reference = heads[0] if heads else None
    for b in heads[1:]:
        a = reference
        assert a is not None
        why = "two hosts" if a.host.key != b.host.key else "two arms"
        if a.host.key != b.host.key and a.arm != b.arm:
            why = "two hosts, two arms"
        pairs.setdefault((b.id, a.id), _compare(cell, b, a, why))
    return tuple(pairs.values())


def _compare(cell: str, a: Receipt, b: Receipt, why: str) -> Compare:
    return Compare(id=f"{a.id}-vs-{b.id}", cell=cell, a=a, b=b, why=why)


# -- what changed between two receipts -----------------------------------------------------------------

NUMBERS = (
    ("output tok/s", ("throughput", "output_tok_s")),
    ("TTFT p50 ms", ("latency_ms", "ttft", "p50")),
    ("TTFT p99 ms", ("latency_ms", "ttft", "p99")),
    ("TPOT p50 ms", ("latency_ms", "tpot", "p50")),
    ("ITL p50 ms", ("latency_ms", "itl", "p50")),
    ("ITL p99 ms", ("latency_ms", "itl", "p99")),
    ("E2E p50 ms", ("latency_ms", "e2el", "p50")),
    ("clean questions", ("questions", "clean")),
)


def number(receipt: Receipt, path: Sequence[str]) -> float | None:
    return _finite(_dig(receipt.load, *path))


def pin_rows(a: Receipt, b: Receipt) -> list[tuple[str, str, str, bool]]:
    """(what, a, b, changed) for the image, host and every distribution either receipt names."""
    rows = [
        ("image id", a.image_id, b.image_id),
        ("host", a.host.summary, b.host.summary),
        ("arm", a.arm or "(none)", b.arm or "(none)"),
    ]
    names = list(dict.fromkeys([*VERSIONED, *a.versions, *b.versions]))
    rows += [(n, a.versions.get(n, "-"), b.versions.get(n, "-")) for n in names if n in a.versions or n in b.versions]
    return [(what, x, y, x != y) for what, x, y in rows]


def winner_map(receipt: Receipt) -> dict[tuple[str, int, int, int], str]:
    """(op, N, K, M bucket) -> runner."""
    out: dict[tuple[str, int, int, int], str] = {}
    for table in receipt.autotune:
        for row in table.get("rows") or ():
            if isinstance(row, dict):
                key = (
                    str(table.get("op")),
                    int(table.get("n", -1)),
                    int(table.get("k", -1)),
                    int(row.get("m_bucket", -1)),
                )
                out[key] = str(row.get("runner"))
    return out


def winner_changes(a: Receipt, b: Receipt) -> list[tuple[str, int, int, int, str, str]]:
    wa, wb = winner_map(a), winner_map(b)
    return [
        (*key, wa.get(key, "-"), wb.get(key, "-"))
        for key in sorted(wa.keys() | wb.keys())
        if wa.get(key) != wb.get(key)
    ]
