"""The A/B, bisect and sweep documents found among the report's sources: the compare view's input.

`stackproof ab`, `bisect` and `sweep` each write one JSON document (ab.json, bisect.json,
sweep.json; docs/*.schema.json) into their run directory. The report finds them under the same
--receipts roots as the receipts and reads each through its producer's own typed reader
(verify/perf/*: `from_json`), so the page shows what the producer wrote and nothing it re-derives.
A document that does not read is refused as a receipt is: InputError naming the file and the field.
Issue 43: read as strict JSON (no Infinity, no 5,000-digit integer) and checked against its
published schema after its typed reader took it (pipeline/guard/typeddoc.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import InputError
from pipeline.guard.typeddoc import check_schema, read_strict_json
from stackproof.site_report.sources import RECEIPT_LIMIT_BYTES
from verify.perf.ab import AbReport
from verify.perf.bisection import BisectReport
from verify.perf.sweep import SweepReport

__all__ = ["AB_FILE", "BISECT_FILE", "SWEEP_FILE", "PerfDocs", "perfdocs_from_dirs"]

# The producers' file names (stackproof/ab.py, bisection.py, sweep.py): a layer below cannot import them.
AB_FILE, BISECT_FILE, SWEEP_FILE = "ab.json", "bisect.json", "sweep.json"


@dataclass(frozen=True, kw_only=True)
class PerfDocs:
    """Each document with the file it came from, in path order."""

    ab: tuple[tuple[str, AbReport], ...] = ()
    bisect: tuple[tuple[str, BisectReport], ...] = ()
    sweep: tuple[tuple[str, SweepReport], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.ab or self.bisect or self.sweep)

    def sweeps_of(self, cell: str) -> list[tuple[str, SweepReport]]:
        """The sweeps of a cell (a target is `cell` or `cell:arm`)."""
        return [(s, r) for s, r in self.sweep if r.target.partition(":")[0] == cell]


def perfdocs_from_dirs(roots: Sequence[Path]) -> PerfDocs:
    ab, bisect, sweep = [], [], []
    for root in roots:
        if not root.is_dir():
            continue  # a single receipt file was given: nothing beside it is scanned
        for path in sorted(root.rglob(AB_FILE)):
            if _inside_a_bisect(path, root):
                continue  # a bisect's own step: shown in the bisect's table, not as an A/B of its own
            document = _object(path)
            ab.append((str(path), AbReport.from_json(document, source=str(path))))
            check_schema(document, path, "A/B report", "ab.schema.json")
        for path in sorted(root.rglob(BISECT_FILE)):
            bisect.append((str(path), read_bisect(path)))
        for path in sorted(root.rglob(SWEEP_FILE)):
            document = _object(path)
            sweep.append((str(path), SweepReport.from_json(document, source=str(path))))
            check_schema(document, path, "sweep report", "sweep.schema.json")
    return PerfDocs(ab=tuple(ab), bisect=tuple(bisect), sweep=tuple(sweep))


def _inside_a_bisect(path: Path, root: Path) -> bool:
    """Whether a folder between `path` and `root` (inclusive) holds a bisect report."""
    return any((folder / BISECT_FILE).is_file() for folder in path.parents if folder == root or root in folder.parents)


def read_bisect(path: Path) -> BisectReport:
    document = _object(path)
    report = BisectReport.read(document, source=str(path))
    check_schema(document, path, "bisect report", "bisect.schema.json")
    return report


def _object(path: Path) -> dict[str, object]:
    document = read_strict_json(path, "performance report", limit=RECEIPT_LIMIT_BYTES)
    if not isinstance(document, dict):
        raise InputError(f"{path}: not a JSON object")
    return document
