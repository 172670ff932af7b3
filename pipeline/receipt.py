"""The receipt as a document: its kind and version, and whether one read back holds together (its
JUnit XML and Markdown renderings are pipeline/receiptrender.py). It sits below the checks (which
build receipts, verify/stages/receipt.py) and the registry work (which gates publishing on them), so
both read it without reaching up.

A receipt names the image by its id and the host by its fingerprint; it never claims more. Its
`status` is what publish gates on: PASS only when every stage ran and passed (WARN counts as
passed; SKIP with its reason, e.g. autotune on a CPU cell) and the cell is not a known-bad one kept
to prove a check (`expect: fail`); INCONCLUSIVE when a stage proved nothing either way or only some
stages ran; FAIL otherwise, including a known-bad cell that failed as expected, which is a pipeline
success but never a verified image; NOT_REPRODUCED when a known-bad cell's failure depends on the
host (`may_not_reproduce`) and it did not happen here.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pipeline
from pipeline.errors import InputError
from pipeline.findings import FieldError, LoadSection
from pipeline.guard.jsonfile import read_json
from pipeline.host.geometry import HostFingerprint
from pipeline.matrix.compilecache import CompileCacheRecord
from pipeline.matrix.model import STAGES
from pipeline.result import CheckResult, Outcome, StageResult, Status, worst

__all__ = [
    "RECEIPT_KIND",
    "RECEIPT_SCHEMA_VERSION",
    "SCHEMA_FILE",
    "CompileCacheRecord",
    "ImageRef",
    "Receipt",
    "ReceiptError",
    "Runtime",
    "receipt_problems",
]

RECEIPT_SCHEMA_VERSION = 1  # bump on a change that breaks readers; docs/receipt.schema.json follows it
RECEIPT_KIND = "stackproof.receipt"
CLAIMS = "this image id, verified on this host geometry; nothing about other images or hosts"
SCHEMA_FILE = Path(__file__).resolve().parents[1] / "docs" / "receipt.schema.json"


@dataclass(frozen=True, kw_only=True)
class ImageRef:
    ref: str  # the local tag
    id: str  # the image id as the verifying daemon reported it
    # Which digest `id` is: the config digest on docker's classic image store, the manifest (or
    # index) digest on the containerd image store. Receipts without it bind the config.
    id_is: str = "config"
    repo_digests: tuple[str, ...] = ()
    # Where it ran: "docker" (an image; `id` its digest) or "host" (a Python environment of the host,
    # `id_is` "environment": `id` the digest of its inventory, pipeline/host/env.py).
    runtime: str = "docker"
    environment: dict[str, Any] | None = None  # host: its python, root, version and package count
    # docker: how the server's container was given GPUs ({how: gpus|cdi, cdi_kind, source},
    # pipeline/docker/gpuaccess.py); None: no GPU was asked for, or a receipt from before it was recorded.
    gpu_access: dict[str, Any] | None = None
    # docker: the image's base when it came from a local archive ({name, archive, format, sha256}: the
    # file the content tag pins, pipeline/build/archive.py); None for every other kind of base.
    base: dict[str, Any] | None = None

    @property
    def on_host(self) -> bool:
        return self.runtime == "host"


@dataclass(frozen=True, kw_only=True)
class Runtime:
    """What the image's own stack saw on this host (the imports probe)."""

    python: str
    torch: str | None
    cuda: str | None
    cudnn: int | str | None
    gpus_seen_by_torch: tuple[dict[str, Any], ...]
    distributions: dict[str, str]


@dataclass(frozen=True, kw_only=True)
class Receipt:
    """One verification of one image on one host: built once from the stages' typed results,
    serialised once (`to_json`), read back with `parse`. Its JSON Schema is docs/receipt.schema.json."""

    status: str  # PASS | FAIL | INCONCLUSIVE | NOT_REPRODUCED
    status_reason: str
    cell: str
    arm: str | None
    image: ImageRef
    matrix_digest: str
    host: HostFingerprint
    started_at: str  # UTC, ISO 8601
    finished_at: str
    seconds: float
    outcome: Outcome
    stages: tuple[StageResult, ...]
    runtime: Runtime | None = None
    load: LoadSection | None = None  # the load stage's summary, cost and correctness (load.json)
    autotune: tuple[dict[str, Any], ...] | None = None  # the winners table
    servers: dict[str, Any] = field(default_factory=dict)
    # What the verification cost (GPU memory, energy, GPU-seconds: each a value or a reason it is
    # empty) and the stalls documented with their forensics (docs/stall-forensics.md).
    cost: dict[str, Any] | None = None
    forensics: tuple[dict[str, Any], ...] = ()
    # How the image came to be: built, found or pulled, the build's seconds and the image's size.
    build: dict[str, Any] | None = None
    # Whether the servers started with the site's compile cache, and warm (absent in older receipts).
    compile_cache: CompileCacheRecord | None = None
    tool_version: str = pipeline.__version__
    tool_name: str = "stackproof"  # a receipt read back may name another writer: publish refuses it
    schema_version: int = RECEIPT_SCHEMA_VERSION

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "kind": RECEIPT_KIND,
            "status": self.status,
            "status_reason": self.status_reason,
            "claims": CLAIMS,
            "cell": self.cell,
            "arm": self.arm,
            "image": _image_json(self.image),
            "matrix_digest": self.matrix_digest,
            "host": self.host.to_json(),
            "tool": {"name": self.tool_name, "version": self.tool_version},
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "seconds": self.seconds,
            "outcome": asdict(self.outcome),
            "stages": [_stage_json(s) for s in self.stages],
            "runtime": {**asdict(self.runtime), "gpus_seen_by_torch": list(self.runtime.gpus_seen_by_torch)}
            if self.runtime
            else None,
            "load": self.load.to_json() if self.load else None,
            "autotune": list(self.autotune) if self.autotune else None,
            "server_starts": self.servers.get("started"),
            "servers": self.servers,
            "cost": self.cost,
            "forensics": list(self.forensics),
            "build": self.build,
            "compile_cache": self.compile_cache.to_json() if self.compile_cache else None,
        }

    @classmethod
    def parse(cls, document: Any, source: str = "the receipt") -> Receipt:
        """A receipt read back (a file, a registry, the report's inputs), or ReceiptError naming
        `source` and the path of the field that is wrong (`stages[2].seconds`). Every reader of a
        receipt goes through here: none reads its JSON by key."""
        if not isinstance(document, dict):
            kind = type(document).__name__
            raise ReceiptError(f"{source}: not a receipt (a JSON {kind}, not an object): not a stackproof receipt")
        if document.get("kind") != RECEIPT_KIND:
            raise ReceiptError(
                f"{source}: kind: {document.get('kind')!r}, not {RECEIPT_KIND!r}: not a stackproof receipt"
            )
        if document.get("schema_version") != RECEIPT_SCHEMA_VERSION:
            version = document.get("schema_version")
            raise ReceiptError(f"{source}: schema_version: {version!r}; this tool reads {RECEIPT_SCHEMA_VERSION}")
        return _parse(_Fields(document, source))

    @classmethod
    def read(cls, path: Path) -> Receipt:
        """The receipt in the file `path` (InputError naming the file, and the field when it is one)."""
        return cls.parse(read_json(path, "the receipt"), source=str(path))


class ReceiptError(InputError, ValueError):
    """A document that is not a receipt this tool reads: which one, and which field is wrong."""


def _kind(document: Any) -> object:
    return document.get("kind") if isinstance(document, dict) else type(document).__name__


def _stage_json(stage: StageResult) -> dict[str, Any]:
    checks = [
        {"name": c.name, "status": str(c.status), "message": c.message, "evidence": c.evidence} for c in stage.checks
    ]
    return {"stage": stage.stage, "status": str(stage.status), "seconds": stage.seconds, "checks": checks,
            "artifacts": stage.artifacts}  # fmt: skip


STATUSES = ("PASS", "FAIL", "INCONCLUSIVE", "NOT_REPRODUCED")
_NAMES = {str: "a string", dict: "an object", list: "a list", float: "a number", bool: "true or false"}


class _Fields:
    """A receipt's fields by path (`outcome.passed`, `stages[2].seconds`): each missing or mistyped
    one raises ReceiptError naming its path, so a hostile or broken receipt says where it breaks."""

    def __init__(self, document: dict[str, Any], source: str) -> None:
        self.document, self.source = document, source

    def fail(self, path: str, why: str) -> ReceiptError:
        return ReceiptError(f"{self.source}: {path}: {why}")

    def walk(self, path: str) -> Any:
        value: Any = self.document
        for part in re.findall(r"[^.\[\]]+", path):
            if isinstance(value, dict):
                value = value.get(part)
            elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
                value = value[int(part)]
            else:
                return None
        return value

    def get(self, path: str, kind: type, *, required: bool = True) -> Any:
        value = self.walk(path)
        if value is None and not required:
            return None
        ok = isinstance(value, int | float) if kind is float else isinstance(value, kind)
        if not ok or (isinstance(value, bool) and kind is not bool):
            found = "missing" if value is None else f"a {type(value).__name__}"
            raise self.fail(path, f"{found}, expected {_NAMES.get(kind, kind.__name__)}")
        if kind is float and not math.isfinite(value):
            raise self.fail(path, f"{value!r}, expected a finite number")
        return float(value) if kind is float else value

    def text(self, path: str) -> str:
        return str(self.get(path, str))

    def optional_text(self, path: str) -> str | None:
        value = self.get(path, str, required=False)
        return None if value is None else str(value)

    def obj(self, path: str, *, required: bool = True) -> dict[str, Any] | None:
        value: dict[str, Any] | None = self.get(path, dict, required=required)
        return value


def _parse(f: _Fields) -> Receipt:
    status = f.text("status")
    if status not in STATUSES:
        raise f.fail("status", f"{status!r}, not one of {', '.join(STATUSES)}")
    return Receipt(
        status=status,
        status_reason=str(f.get("status_reason", str, required=False) or ""),
        cell=f.text("cell"),
        arm=f.optional_text("arm"),
        image=_image(f),
        matrix_digest=f.text("matrix_digest"),
        host=_host(f),
        started_at=f.text("started_at"),
        finished_at=f.text("finished_at"),
        seconds=f.get("seconds", float),
        outcome=_outcome(f),
        stages=tuple(_parse_stage(f, i) for i in range(len(f.get("stages", list)))),
        runtime=_runtime(f),
        load=_load(f),
        autotune=_autotune(f),
        servers=dict(f.obj("servers", required=False) or {}),
        cost=f.obj("cost", required=False),
        forensics=tuple(
            f.get(f"forensics[{i}]", dict) for i in range(len(f.get("forensics", list, required=False) or ()))
        ),
        build=f.obj("build", required=False),
        compile_cache=_compile_cache(f),
        tool_version=str(f.get("tool.version", str, required=False) or ""),
        tool_name=str(f.get("tool.name", str, required=False) or ""),
    )


def _compile_cache(f: _Fields) -> CompileCacheRecord | None:
    if f.obj("compile_cache", required=False) is None:
        return None
    starts = range(len(f.get("compile_cache.starts", list, required=False) or []))
    used, warm = f.get("compile_cache.used", bool), f.get("compile_cache.warm", bool)
    not_reused = f.get("compile_cache.warm_not_reused", bool, required=False)  # absent before the field: False
    return CompileCacheRecord(
        used=used, warm=warm, warm_not_reused=bool(not_reused),
        starts=tuple(f.get(f"compile_cache.starts[{i}]", dict) for i in starts),
    )  # fmt: skip


def _load(f: _Fields) -> LoadSection | None:
    if f.obj("load", required=False) is None:
        return None
    try:
        return LoadSection.parse(f.document["load"], "load")
    except FieldError as exc:
        raise f.fail(exc.path, exc.why) from None


def _outcome(f: _Fields) -> Outcome:
    f.obj("outcome")
    return Outcome(
        passed=f.get("outcome.passed", bool),
        summary=f.text("outcome.summary"),
        expected_failure=f.get("outcome.expected_failure", str, required=False),
        not_reproduced=bool(f.get("outcome.not_reproduced", bool, required=False)),
    )


def _image_json(image: ImageRef) -> dict[str, Any]:
    data = {**asdict(image), "repo_digests": list(image.repo_digests)}
    for optional in ("gpu_access", "base"):  # absent when None: older receipts read as they always did
        if data[optional] is None:
            del data[optional]
    return data


def _image(f: _Fields) -> ImageRef:
    f.obj("image")
    environment = f.obj("image.environment", required=False)
    return ImageRef(
        ref=f.text("image.ref"),
        id=f.text("image.id"),
        id_is=f.optional_text("image.id_is") or "config",  # receipts of stackproof 0.1 bind the config
        repo_digests=tuple(f.text(f"image.repo_digests[{i}]") for i in range(len(f.walk("image.repo_digests") or ()))),
        runtime=f.optional_text("image.runtime") or "docker",  # receipts before host runs: docker
        environment=environment,
        gpu_access=f.obj("image.gpu_access", required=False),
        base=f.obj("image.base", required=False),
    )


def _host(f: _Fields) -> HostFingerprint:
    host = f.obj("host")
    key = f.get("host.key", str)
    if not key:
        raise f.fail("host.key", "empty, expected the host fingerprint")
    try:
        return HostFingerprint.parse(host or {})
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise f.fail("host", f"not a host fingerprint ({type(exc).__name__}: {exc})") from None


def _runtime(f: _Fields) -> Runtime | None:
    found = f.obj("runtime", required=False)
    if not found:
        return None
    f.get("runtime.distributions", dict), f.get("runtime.gpus_seen_by_torch", list)
    try:
        return Runtime(**{**found, "gpus_seen_by_torch": tuple(found["gpus_seen_by_torch"])})
    except (KeyError, TypeError) as exc:
        raise f.fail("runtime", f"not the imports probe's runtime ({type(exc).__name__}: {exc})") from None


def _autotune(f: _Fields) -> tuple[dict[str, Any], ...] | None:
    """The winners tables, each {op, n, k, rows: [{m_bucket, runner, tactic}]} (the report draws them)."""
    tables = f.get("autotune", list, required=False)
    if not tables:
        return None
    for i, table in enumerate(tables):
        if not isinstance(table, dict) or not {"op", "n", "k", "rows"} <= table.keys():
            raise f.fail(f"autotune[{i}]", "expected {op, n, k, rows}")
        for key in ("n", "k"):
            if isinstance(table[key], bool) or not isinstance(table[key], int):
                raise f.fail(f"autotune[{i}].{key}", f"{str(table[key])[:40]!r}, expected an integer")
        for j, row in enumerate(table["rows"] if isinstance(table["rows"], list) else [None]):
            if not isinstance(row, dict) or not isinstance(row.get("m_bucket"), int) or "runner" not in row:
                raise f.fail(f"autotune[{i}].rows[{j}]", "expected {m_bucket: int, runner, tactic}")
    return tuple(tables)


def _parse_stage(f: _Fields, i: int) -> StageResult:
    at = f"stages[{i}]"
    if not isinstance(f.walk(at), dict) or not isinstance(f.walk(f"{at}.stage"), str):
        raise f.fail(at, "not a stage object")
    checks = []
    for j in range(len(f.get(f"{at}.checks", list))):
        where = f"{at}.checks[{j}]"
        if not isinstance(f.walk(where), dict):
            raise f.fail(where, "not a check object")
        checks.append(CheckResult(name=f.text(f"{where}.name"), status=_status(f, f"{where}.status"),
                                  message=str(f.get(f"{where}.message", str, required=False) or ""),
                                  evidence=dict(f.obj(f"{where}.evidence", required=False) or {})))  # fmt: skip
    artifacts = f.obj(f"{at}.artifacts", required=False) or {}
    return StageResult(stage=f.text(f"{at}.stage"), status=_status(f, f"{at}.status"), checks=tuple(checks),
                       seconds=f.get(f"{at}.seconds", float, required=False) or 0.0,
                       artifacts={str(k): str(v) for k, v in artifacts.items()})  # fmt: skip


def _status(f: _Fields, path: str) -> Status:
    value = f.text(path)
    try:
        return Status(value)
    except ValueError:
        raise f.fail(path, f"{value!r}, not a status") from None


def receipt_problems(receipt: dict[str, Any]) -> list[str]:
    """Why a receipt read back from a file does not hold together, judged from its own stages.

    A receipt is data anyone can edit: its `status` is believed only when the stages it carries
    give that same status by the rules above (every stage the status of its worst check, the stages
    of a PASS exactly STAGES in order, none FAIL/ERROR/INCONCLUSIVE, the outcome passed, no
    expected failure). Empty: consistent."""
    problems: list[str] = []
    stages = receipt.get("stages")
    if not isinstance(stages, list) or not all(isinstance(s, dict) for s in stages):
        return ["it has no list of stages"]
    for stage in stages:
        try:
            checks = [Status(c["status"]) for c in stage.get("checks") or []]
            claimed = Status(stage["status"])
        except (KeyError, ValueError, TypeError):
            problems.append(f"stage {stage.get('stage')!r} has an unknown status")
            continue
        if checks and worst(checks) is not claimed and not (claimed is Status.PASS and worst(checks) is Status.WARN):
            problems.append(f"stage {stage.get('stage')} says {claimed} but its checks say {worst(checks)}")
    if receipt.get("status") != "PASS":
        return problems
    names = [s.get("stage") for s in stages]
    if names != list(STAGES):
        problems.append(f"a PASS receipt must carry the stages {', '.join(STAGES)} in order, not {names}")
    bad = [f"{s.get('stage')} {s.get('status')}" for s in stages if s.get("status") not in ("PASS", "WARN", "SKIP")]
    if bad:
        problems.append(f"PASS, but stages {', '.join(bad)}")
    if all(s.get("status") == "SKIP" for s in stages):
        problems.append("PASS, but every stage was skipped")
    found = receipt.get("outcome")
    outcome: dict[str, Any] = found if isinstance(found, dict) else {}
    if outcome.get("passed") is not True or outcome.get("expected_failure") or outcome.get("not_reproduced"):
        problems.append("PASS, but its outcome is not a plain pass")
    return problems
