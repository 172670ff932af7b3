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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.errors import InputError
from pipeline.findings import LoadSummary
from pipeline.host.geometry import HostFingerprint
from pipeline.matrix.model import STAGES
from pipeline.receipt import Receipt, receipt_problems

__all__ = [
    "ORIGIN_BENCHMARK",
    "ORIGIN_RECEIPT_ONLY",
    "ORIGIN_REGISTRY",
    "ORIGIN_RUN_DIR",
    "TRIO",
    "Compare",
    "Host",
    "LoadRaw",
    "Shown",
    "Site",
    "Square",
    "build_site",
    "parse_receipt",
    "show",
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
class Shown:
    """One receipt as the site shows it: the typed receipt (`receipt`, pipeline.receipt.Receipt,
    the one model every reader goes through) and what the site adds: where it came from, the
    status the site believes, its host's column, and the file as it was (`document`, linked)."""

    receipt: Receipt
    id: str  # the first 12 hex digits of the receipt's sha256: stable page and file names
    source: str  # the file or registry reference it was read from
    origin: str  # one of the ORIGIN_* labels, shown beside every number taken from it
    status: str  # PASS | FAIL | INCONCLUSIVE | NOT_REPRODUCED | EXPECTED_FAIL (a known-bad cell that failed)
    status_reason: str
    host: Host
    document: Mapping[str, Any]
    raw: LoadRaw | None = None  # None: only the receipt is at hand (no run directory)
    files: Mapping[str, bytes] = field(default_factory=dict)  # server_log, junit, summary when present

    @property
    def cell(self) -> str:
        return self.receipt.cell

    @property
    def arm(self) -> str | None:
        return self.receipt.arm

    @property
    def expected_failure(self) -> str | None:
        found = self.receipt.outcome.expected_failure
        return str(found) if found else None

    @property
    def image_ref(self) -> str:
        return self.receipt.image.ref

    @property
    def image_id(self) -> str:
        return self.receipt.image.id

    @property
    def runtime(self) -> str:  # where its servers ran: "docker" (an image's containers) or "host"
        return self.receipt.image.runtime

    @property
    def started_at(self) -> str:
        return self.receipt.started_at

    @property
    def seconds(self) -> float:
        return self.receipt.seconds

    @property
    def versions(self) -> Mapping[str, str]:
        found = self.receipt.runtime.distributions if self.receipt.runtime else {}
        return {str(k): str(v) for k, v in found.items()}

    @property
    def stages(self) -> tuple[tuple[str, str, float], ...]:  # (stage, status, seconds)
        return tuple((s.stage, str(s.status), s.seconds) for s in self.receipt.stages)

    @property
    def overrides(self) -> Mapping[str, Mapping[str, Any]]:  # name -> {pinned, installed, index}
        found = _evidence(self.receipt, "imports", "overrides")
        return {str(k): v for k, v in found.items() if isinstance(v, dict)}

    @property
    def intentional_overrides(self) -> tuple[Any, ...]:
        return tuple(_evidence(self.receipt, "imports", "requirements").get("intentional_overrides") or ())

    @property
    def determinism(self) -> tuple[tuple[str, str, str], ...]:  # (check, status, message)
        return tuple(
            (c.name, str(c.status), c.message)
            for s in self.receipt.stages
            if s.stage == "load"
            for c in s.checks
            if c.name.startswith("determinism")
        )

    @property
    def load(self) -> LoadSummary | None:
        return self.receipt.load.summary if self.receipt.load else None

    @property
    def autotune(self) -> tuple[Mapping[str, Any], ...]:  # {op, n, k, rows: [{m_bucket, runner, tactic}]}
        return self.receipt.autotune or ()

    @property
    def events(self) -> tuple[Mapping[str, Any], ...]:  # the load's watchdog events (stall verdicts)
        return self.load.events if self.load else ()

    @property
    def artifacts(self) -> Mapping[str, Mapping[str, str]]:  # stage -> name -> path on the verifying host
        return {s.stage: dict(s.artifacts) for s in self.receipt.stages}

    @property
    def date(self) -> str:
        return self.started_at[:10]

    @property
    def label(self) -> str:
        return f"{self.cell}{' / ' + self.arm if self.arm else ''} on {self.host.summary}, {self.started_at}"

    def latency(self, metric: str, quantile: str) -> float | None:
        return self.load.latency(metric, quantile) if self.load else None

    @property
    def complete(self) -> bool:
        return {s for s, _, _ in self.stages} >= set(STAGES)

    @property
    def tok_s(self) -> float | None:
        return _finite(self.load.throughput.output_tok_s) if self.load else None


def _evidence(receipt: Receipt, stage: str, check: str) -> dict[str, Any]:
    found = next((c.evidence for s in receipt.stages if s.stage == stage for c in s.checks if c.name == check), {})
    return dict(found)


def _finite(value: Any) -> float | None:
    """A number the pages and plots can show: finite, never a bool; anything else is no number."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


@dataclass(frozen=True, kw_only=True)
class Square:
    cell: str
    host: Host
    receipt: Shown | None  # None: not verified on this host
    others: int  # further receipts of this cell on this host (other arms, older dates)


@dataclass(frozen=True, kw_only=True)
class Compare:
    id: str
    cell: str
    a: Shown
    b: Shown
    why: str  # "two hosts", "two dates", "two arms"


@dataclass(frozen=True, kw_only=True)
class Site:
    cells: tuple[str, ...]
    cell_arch: Mapping[str, str]  # the cell's arch when known (the matrix, else its receipts' hosts)
    hosts: tuple[Host, ...]
    squares: Mapping[tuple[str, str], Square]  # (cell, host key)
    receipts: tuple[Shown, ...]
    by_cell: Mapping[str, tuple[Shown, ...]]  # newest first
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
) -> Shown:
    """A receipt's JSON -> Shown, through the one receipt model (`Receipt.parse`: InputError naming
    the source and the path of the field that is wrong)."""
    return show(Receipt.parse(document, source=source), document, source=source, origin=origin, raw=raw, files=files)


def show(
    receipt: Receipt,
    document: Mapping[str, Any],
    *,
    source: str,
    origin: str,
    raw: LoadRaw | None = None,
    files: Mapping[str, bytes] | None = None,
) -> Shown:
    """The typed `receipt` (read from `document`, linked as it was) as the site shows it."""
    intentional = _evidence(receipt, "imports", "requirements").get("intentional_overrides") or ()
    if not isinstance(intentional, list | tuple):
        raise InputError(f"{source}: imports requirements evidence.intentional_overrides: expected a list")
    believed, reason = believed_status(receipt, document)
    if receipt.status == "FAIL" and receipt.outcome.expected_failure:
        believed = "EXPECTED_FAIL"  # a known-bad cell whose failure was seen: the check works
    return Shown(
        receipt=receipt,
        id=receipt_id(document),
        source=source,
        origin=origin,
        status=believed,
        status_reason=reason or receipt.status_reason,
        host=_host(receipt.host),
        document=document,
        raw=raw,
        files=dict(files or {}),
    )


def believed_status(receipt: Receipt, document: Mapping[str, Any]) -> tuple[str, str | None]:
    """The status the site may show, and why it differs from the receipt's own (None: it does not).

    A receipt is data anyone can edit: a PASS is shown only when its stages give that PASS by the
    receipt rules (every stage ran, none failed: `pipeline.receipt.receipt_problems`) and the image
    it names is the cell's (`stackproof/CELL:TAG`, a sha256 image id). Anything else that claims PASS
    is shown INCONCLUSIVE, with the reason."""
    if receipt.status != "PASS":
        return receipt.status, None
    problems = receipt_problems(dict(document))
    ref, image_id, cell = receipt.image.ref, receipt.image.id, receipt.cell
    repository = ref.rsplit("@", 1)[0].rsplit(":", 1)[0] if ":" in ref.rsplit("/", 1)[-1] else ref.rsplit("@", 1)[0]
    if repository.startswith("stackproof/") and repository != f"stackproof/{cell}":
        problems.append(f"it names the image {ref}, not one of cell {cell}")
    if not _IMAGE_ID.fullmatch(image_id):
        problems.append(f"its image id {image_id[:80]!r} is not a sha256 digest")
    if problems:
        return "INCONCLUSIVE", "claims PASS, but " + "; ".join(problems)
    return receipt.status, None


_IMAGE_ID = re.compile(r"sha256:[0-9a-f]{64}")


def receipt_id(document: Mapping[str, Any]) -> str:
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def _host(host: HostFingerprint) -> Host:
    caps = sorted({str(g.get("compute_capability", "")) for g in host.gpus} - {""})
    arch = ",".join("sm" + c.replace(".", "") for c in caps) if caps else "cpu"
    return Host(
        key=host.key,
        summary=host.describe(),
        arch=arch,
        gpus=tuple(str(g.get("name", "?")) for g in host.gpus),
        driver=host.driver or "none",
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
    receipts: Sequence[Shown], *, cells: Sequence[str] = (), cell_arch: Mapping[str, str] | None = None
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


def prefer(receipts: Sequence[Shown]) -> list[Shown]:
    """Full verifications first, each group newest first: a later `--stages imports` check of the same
    image proves less than the full run before it, and must not hide that run's square."""
    return sorted(receipts, key=lambda r: (r.complete, r.started_at, r.id), reverse=True)


def compares_of(cell: str, receipts: Sequence[Shown]) -> tuple[Compare, ...]:
    """Each receipt against the previous one of its host and arm (two dates), and the newest of each
    (host, arm) against the newest of all (two hosts, two arms): linear in the receipts, never all
    pairs (150 hosts gave 11,175 pages as pairs; a reader compares against the reference)."""
    newest: dict[tuple[str, str | None], Shown] = {}
    pairs: dict[tuple[str, str], Compare] = {}
    for receipt in receipts:  # newest first
        newest.setdefault((receipt.host.key, receipt.arm), receipt)
    # two dates: consecutive receipts of one (host, arm)
    series: dict[tuple[str, str | None], list[Shown]] = {}
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


def _compare(cell: str, a: Shown, b: Shown, why: str) -> Compare:
    return Compare(id=f"{a.id}-vs-{b.id}", cell=cell, a=a, b=b, why=why)


# -- what changed between two receipts -----------------------------------------------------------------

# What the compare view sets side by side: a name, and how it is read from the typed load summary.
NUMBERS: tuple[tuple[str, Callable[[LoadSummary], float | None]], ...] = (
    ("output tok/s", lambda load: load.throughput.output_tok_s),
    ("TTFT p50 ms", lambda load: load.latency("ttft", "p50")),
    ("TTFT p99 ms", lambda load: load.latency("ttft", "p99")),
    ("TPOT p50 ms", lambda load: load.latency("tpot", "p50")),
    ("ITL p50 ms", lambda load: load.latency("itl", "p50")),
    ("ITL p99 ms", lambda load: load.latency("itl", "p99")),
    ("E2E p50 ms", lambda load: load.latency("e2el", "p50")),
    ("clean questions", lambda load: load.questions.clean),
)


def number(receipt: Shown, read: Callable[[LoadSummary], float | None]) -> float | None:
    return _finite(read(receipt.load)) if receipt.load else None


def pin_rows(a: Shown, b: Shown) -> list[tuple[str, str, str, bool]]:
    """(what, a, b, changed) for the image, host and every distribution either receipt names."""
    rows = [
        ("image id", a.image_id, b.image_id),
        ("host", a.host.summary, b.host.summary),
        ("arm", a.arm or "(none)", b.arm or "(none)"),
    ]
    names = list(dict.fromkeys([*VERSIONED, *a.versions, *b.versions]))
    rows += [(n, a.versions.get(n, "-"), b.versions.get(n, "-")) for n in names if n in a.versions or n in b.versions]
    return [(what, x, y, x != y) for what, x, y in rows]


def winner_map(receipt: Shown) -> dict[tuple[str, int, int, int], str]:
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


def winner_changes(a: Shown, b: Shown) -> list[tuple[str, int, int, int, str, str]]:
    wa, wb = winner_map(a), winner_map(b)
    return [
        (*key, wa.get(key, "-"), wb.get(key, "-"))
        for key in sorted(wa.keys() | wb.keys())
        if wa.get(key) != wb.get(key)
    ]
