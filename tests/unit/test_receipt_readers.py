"""No receipt (or run report) JSON is read by key outside the receipt model (issue 29's Done-when).

A source scan, not a grep: the AST of every module of the three packages is read, and two things
are refused outside pipeline/receipt.py (and its writer, pipeline/receiptrender.py):
- a path to `report.json` or `receipt.json` built in code (`run_dir / "report.json"`, `open("receipt.json")`):
  a run's document is found and read only through `Receipt.read`/`Receipt.parse` (publish keeps the
  document as written for the bytes it pushes and signs, and reads it through the model);
- a JSON document read in a function (`json.loads`, `json.load`, `read_json`) and then indexed by a
  key only a receipt or a run report has (`doc["stages"]`, `doc.get("outcome")`).
The scan is shown to find both on planted modules, so an empty answer is not a blind one.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("stackproof", "verify", "pipeline")
THE_MODEL = REPO / "pipeline" / "receipt.py"
# The model's writer: write_all names receipt.json where it writes the document (its renderings beside).
THE_WRITER = REPO / "pipeline" / "receiptrender.py"
RUN_DOCUMENTS = ("receipt.json", "report.json")
# Keys that only a receipt or a run's report carries at its top level or in its stages.
RECEIPT_KEYS = frozenset(
    {"stages", "outcome", "image_id", "matrix_digest", "status_reason", "expected_failure", "servers", "artifacts"}
)
LOADERS = frozenset({"loads", "load", "read_json", "_read_json"})


def run_document_readers(source: str, where: str) -> list[str]:
    """`where:line: what` for each read of a run's document by key (or by path) in `source`."""
    found: list[str] = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and _names_document(node.right):
            found.append(f"{where}:{node.lineno}: a path to {node.right.value!r}")  # type: ignore[attr-defined]
        elif isinstance(node, ast.Call) and _callee(node) in ("open", "Path") and any(map(_names_document, node.args)):
            found.append(f"{where}:{node.lineno}: opens {RUN_DOCUMENTS}")
    for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)):
        loaded = {
            target.id
            for node in ast.walk(function)
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and _callee(node.value) in LOADERS
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for node in ast.walk(function):
            key = _key_read(node, loaded)
            if key is not None:
                found.append(f"{where}:{node.lineno}: {function.name} reads a loaded document's {key!r} by key")
    return sorted(found, key=lambda hit: int(hit.split(":")[1]))


def _names_document(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in RUN_DOCUMENTS


def _callee(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _key_read(node: ast.AST, loaded: set[str]) -> str | None:
    """The receipt key `node` reads from one of the `loaded` names (`x["stages"]`, `x.get("stages")`)."""
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in loaded:
        key = node.slice
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id in loaded
        and node.args
    ):
        key = node.args[0]
    else:
        return None
    return key.value if isinstance(key, ast.Constant) and key.value in RECEIPT_KEYS else None


def test_no_run_document_is_read_by_key_outside_the_receipt_model() -> None:
    found = [
        hit
        for package in PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
        if path not in (THE_MODEL, THE_WRITER)
        for hit in run_document_readers(path.read_text(), str(path.relative_to(REPO)))
    ]
    assert found == [], "read these through pipeline.receipt.Receipt (parse/read):\n" + "\n".join(found)


def test_the_scan_sees_a_path_to_a_run_document_and_a_read_by_key() -> None:
    planted = """
import json
from pathlib import Path

def write(out_dir: Path, report) -> None:
    (out_dir / "report.json").write_text(json.dumps(report))

def winners(previous: Path):
    report = json.loads(previous.read_text())
    stage = next(s for s in report["stages"] if s["stage"] == "autotune")
    return report.get("outcome"), stage

def other(path: Path):
    document = json.loads(path.read_text())
    return document["status"], document.get("rows")  # keys of other documents: not a receipt's
"""
    found = run_document_readers(planted, "planted.py")
    assert found == [
        "planted.py:6: a path to 'report.json'",
        "planted.py:10: winners reads a loaded document's 'stages' by key",
        "planted.py:11: winners reads a loaded document's 'outcome' by key",
    ]


# -- the load section: read through its typed fields (pipeline/findings.py), never by key ----------

THE_LOAD_MODEL = (THE_MODEL, REPO / "pipeline" / "findings.py")
LOAD_KEYS = frozenset({"latency_ms", "throughput", "questions", "events", "cost", "correctness", "tokens", "stats"})


def load_section_readers(source: str, where: str) -> list[str]:
    """`where:line: ...` for each read by key of an object's `.load` (`receipt.load["latency_ms"]`,
    `(receipt.load or {}).get("events")`): the receipt's load section as JSON, not as its type."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript):
            target, key = node.value, node.slice
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            target, key = node.func.value, node.args[0] if node.args else None
        else:
            continue
        if isinstance(target, ast.BoolOp):  # `(x.load or {})`
            target = target.values[0]
        names_load = isinstance(target, ast.Attribute) and target.attr == "load"
        if names_load and isinstance(key, ast.Constant) and key.value in LOAD_KEYS:
            found.append(f"{where}:{node.lineno}: reads the load section's {key.value!r} by key")
    return found


def test_no_load_section_is_read_by_key_outside_its_model() -> None:
    found = [
        hit
        for package in PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
        if path not in THE_LOAD_MODEL
        for hit in load_section_readers(path.read_text(), str(path.relative_to(REPO)))
    ]
    assert found == [], "read these through pipeline.findings.LoadSection's fields:\n" + "\n".join(found)


def test_the_load_scan_sees_the_reads_the_report_made_before() -> None:
    """The two shapes the site report used until the load section was typed."""
    planted = """
def events(receipt):
    return (receipt.load or {}).get("events") or ()

def tok_s(shown):
    return shown.load["throughput"]["output_tok_s"], shown.load.get("model")
"""
    assert load_section_readers(planted, "planted.py") == [
        "planted.py:3: reads the load section's 'events' by key",
        "planted.py:6: reads the load section's 'throughput' by key",
    ]
