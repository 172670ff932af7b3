"""What the stages found, typed, and handed on in memory: the imports probe's report (`ProbeReport`,
read from the in-image probe's JSON by verify/stages/probe.py) and the load section (`LoadSection`:
the `LoadSummary` that verify/load/summary.py's `summarise_load` makes, with the cost the load stage
sampled and the correctness it judged beside it). They sit on the floor, below the stage results
(pipeline/result.py) and the receipt (pipeline/receipt.py), which hold them typed: every reader (the
stages after imports, the receipt's Markdown, the report's pages, the cost section) reads fields,
never the JSON by key.

`LoadSection.parse` reads one back from a receipt or a load.json: each missing or mistyped field is
a `FieldError` naming its path (`load.latency_ms.ttft.p50`), so a hostile receipt says where it breaks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from packaging.utils import canonicalize_name

from pipeline.errors import CheckFailed

__all__ = [
    "LOAD_SCHEMA_VERSION",
    "PROBE_SCHEMA",
    "Distribution",
    "FieldError",
    "ImportOutcome",
    "LoadSection",
    "LoadSummary",
    "ProbeReport",
    "Questions",
    "Throughput",
    "TorchInfo",
]

PROBE_SCHEMA = 1  # the in-image probe's document (verify/probes/inimage_probe.py)


@dataclass(frozen=True, kw_only=True)
class Distribution:
    name: str  # canonical
    version: str
    location: str
    installer: str
    requires: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class ImportOutcome:
    module: str
    ok: bool
    absent: bool
    optional: bool
    error_type: str
    message: str
    traceback: tuple[str, ...]
    seconds: float
    log: tuple[str, ...] = ()  # the import's stderr tail (probes before it was kept have none)

    @property
    def quoted(self) -> str:
        return f"{self.error_type}: {self.message}"


@dataclass(frozen=True, kw_only=True)
class TorchInfo:
    version: str
    cuda: str | None
    cudnn: int | None
    cuda_available: bool
    gpus: tuple[dict[str, Any], ...]


@dataclass(frozen=True, kw_only=True)
class ProbeReport:
    python_version: str
    platform: str
    machine: str
    distributions: tuple[Distribution, ...]
    imports: tuple[ImportOutcome, ...]
    torch: TorchInfo | None
    env: tuple[tuple[str, str], ...]
    raw: dict[str, Any]

    def dist(self, name: str) -> Distribution | None:
        wanted = canonicalize_name(name)
        return next((d for d in self.distributions if d.name == wanted), None)

    def env_value(self, name: str) -> str | None:
        return dict(self.env).get(name)

    @classmethod
    def parse(cls, document: dict[str, Any]) -> ProbeReport:
        if document.get("probe_schema") != PROBE_SCHEMA:
            raise CheckFailed(f"probe output has probe_schema {document.get('probe_schema')!r}, not {PROBE_SCHEMA}")
        torch = document.get("torch")
        return cls(
            python_version=document["python"]["version"],
            platform=document["python"]["platform"],
            machine=document["python"]["machine"],
            distributions=tuple(
                Distribution(
                    name=str(canonicalize_name(d["name"])),
                    version=d["version"],
                    location=d["location"],
                    installer=d["installer"],
                    requires=tuple(d["requires"]),
                )
                for d in document["distributions"]
            ),
            imports=tuple(
                ImportOutcome(
                    module=name,
                    ok=bool(o["ok"]),
                    absent=bool(o.get("absent")),
                    optional=bool(o.get("optional")),
                    error_type=o.get("type", ""),
                    message=o.get("message", ""),
                    traceback=tuple(o.get("traceback", ())),
                    seconds=float(o.get("seconds", 0.0)),
                    log=tuple(o.get("log", ())),
                )
                for name, o in sorted(document["imports"].items())
            ),
            torch=None
            if torch is None
            else TorchInfo(
                version=torch["version"],
                cuda=torch.get("cuda"),
                cudnn=torch.get("cudnn"),
                cuda_available=bool(torch.get("cuda_available")),
                gpus=tuple(torch.get("gpus", ())),
            ),
            env=tuple(sorted(document["env"].items())),
            raw=document,
        )


# -- the load section -----------------------------------------------------------------------------

LOAD_SCHEMA_VERSION = 1


class FieldError(ValueError):
    """A field of a load section that is missing or of the wrong type: its path and why."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path, self.why = path, why


@dataclass(frozen=True, kw_only=True)
class Questions:
    """How the questions ended: clean, faulted (an error or a wrong answer) or incomplete (cancelled)."""

    attempted: int  # clean + faulted: the questions a verdict can count
    clean: int
    faulted: int
    incomplete: int


@dataclass(frozen=True, kw_only=True)
class Throughput:
    output_tok_s: float
    requests_s: float
    questions_h: float


@dataclass(frozen=True, kw_only=True)
class LoadSummary:
    """The load section of the receipt (load.json, schema_version 1), written once by `summarise_load`.

    The checks read it through these fields; `to_dict` is the JSON on disk, key for key, and `parse`
    reads that JSON back (the keys a stage adds beside it, cost and correctness, are `LoadSection`'s)."""

    schema_version: int
    config: dict[str, Any]
    model: str
    seconds: float
    stop_reason: str
    questions: Questions
    requests_ok: int
    errors: dict[str, int]  # error class -> requests
    output_tokens: int
    prompt_tokens: int
    determinism_tokens: tuple[int, int]  # (prompt, completion) tokens of determinism phase B
    throughput: Throughput
    latency_ms: dict[str, dict[str, float | None]]  # ttft, tpot, itl, e2el -> p50, p90, p99, max, mean
    server_counter_deltas: dict[str, float] | None  # None: a scrape is missing (a verdict, a failed scrape)
    events: tuple[dict[str, Any], ...]
    stats: dict[str, Any] | None  # fault statistics; None when no question was attempted
    files: dict[str, str]

    def latency(self, metric: str, quantile: str) -> float | None:
        """One percentile in ms; None where the run measured none (or the receipt holds no finite one)."""
        value = self.latency_ms.get(metric, {}).get(quantile)
        return value if value is not None and math.isfinite(value) else None

    def to_dict(self) -> dict[str, Any]:
        q = self.questions
        return {
            "schema_version": self.schema_version,
            "config": self.config,
            "model": self.model,
            "seconds": self.seconds,
            "stop_reason": self.stop_reason,
            "questions": {"attempted": q.attempted, "clean": q.clean, "faulted": q.faulted, "incomplete": q.incomplete},
            "requests": {"ok": self.requests_ok, "errors": self.errors},
            "tokens": {
                "output": self.output_tokens,
                "prompt": self.prompt_tokens,
                "determinism_under_load": {
                    "prompt": self.determinism_tokens[0],
                    "completion": self.determinism_tokens[1],
                },
            },
            "throughput": {
                "output_tok_s": self.throughput.output_tok_s,
                "requests_s": self.throughput.requests_s,
                "questions_h": self.throughput.questions_h,
            },
            "latency_ms": self.latency_ms,
            "server_counter_deltas": self.server_counter_deltas,
            "events": list(self.events),
            "stats": self.stats,
            "files": self.files,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LoadSummary:
        """A load.json this tool wrote (FieldError where it is not one)."""
        return cls.parse(data, "load")

    @classmethod
    def parse(cls, data: Any, path: str) -> LoadSummary:
        d = _Object(data, path)
        tokens, determinism = d.obj("tokens"), d.obj("tokens").obj("determinism_under_load")
        questions, throughput = d.obj("questions"), d.obj("throughput")
        errors, files, stats = d.obj("requests").obj("errors"), d.obj("files"), d.optional_obj("stats")
        return cls(
            schema_version=d.integer("schema_version"),
            config=d.obj("config").data,
            model=d.text("model"),
            seconds=d.number("seconds"),
            stop_reason=d.text("stop_reason"),
            questions=Questions(**{k: questions.integer(k) for k in ("attempted", "clean", "faulted", "incomplete")}),
            requests_ok=d.obj("requests").integer("ok"),
            errors={k: errors.integer(k) for k in errors.data},
            output_tokens=tokens.integer("output"),
            prompt_tokens=tokens.integer("prompt"),
            determinism_tokens=(determinism.integer("prompt"), determinism.integer("completion")),
            throughput=Throughput(**{k: throughput.number(k) for k in ("output_tok_s", "requests_s", "questions_h")}),
            latency_ms=_latency(d.obj("latency_ms")),
            server_counter_deltas=_numbers(d.optional_obj("server_counter_deltas")),
            events=tuple(d.objects("events")),
            stats=stats.data if stats else None,
            files={k: files.text(k) for k in files.data},
        )


@dataclass(frozen=True, kw_only=True)
class LoadSection:
    """The receipt's `load` (and the load stage's load.json): the summary, then the stage's additions."""

    summary: LoadSummary
    cost: dict[str, Any] | None = None  # the GPU cost sampled over the load (verify/forensics)
    correctness: dict[str, Any] | None = None  # degeneration rates and canaries (verify/load/correctness.py)

    def to_json(self) -> dict[str, Any]:
        document = self.summary.to_dict()
        if self.cost is not None:
            document["cost"] = self.cost
        if self.correctness is not None:
            document["correctness"] = self.correctness
        return document

    @classmethod
    def parse(cls, data: Any, path: str = "load") -> LoadSection:
        d = _Object(data, path)
        cost, correctness = d.optional_obj("cost"), d.optional_obj("correctness")
        return cls(
            summary=LoadSummary.parse(data, path),
            cost=cost.data if cost else None,
            correctness=correctness.data if correctness else None,
        )


def _latency(d: _Object) -> dict[str, dict[str, float | None]]:
    return {metric: {q: d.obj(metric).optional_number(q) for q in d.obj(metric).data} for metric in d.data}


def _numbers(d: _Object | None) -> dict[str, float] | None:
    return {k: d.number(k) for k in d.data} if d is not None else None


class _Object:
    """A JSON object at `path`, read field by field: each missing or mistyped field a FieldError."""

    def __init__(self, data: Any, path: str) -> None:
        if not isinstance(data, dict):
            raise FieldError(path, f"a {_kind(data)}, expected an object")
        self.data: dict[str, Any] = data
        self.path = path

    def _field(self, key: str) -> Any:
        if key not in self.data:
            raise FieldError(f"{self.path}.{key}", "missing")
        return self.data[key]

    def _wrong(self, key: str, expected: str) -> FieldError:
        return FieldError(f"{self.path}.{key}", f"a {_kind(self.data[key])}, expected {expected}")

    def obj(self, key: str) -> _Object:
        return _Object(self._field(key), f"{self.path}.{key}")

    def optional_obj(self, key: str) -> _Object | None:
        return None if self.data.get(key) is None else self.obj(key)

    def objects(self, key: str) -> list[dict[str, Any]]:
        value = self._field(key)
        if not isinstance(value, list):
            raise self._wrong(key, "a list")
        return [_Object(item, f"{self.path}.{key}[{i}]").data for i, item in enumerate(value)]

    def text(self, key: str) -> str:
        value = self._field(key)
        if not isinstance(value, str):
            raise self._wrong(key, "a string")
        return value

    def integer(self, key: str) -> int:
        value = self._field(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._wrong(key, "an integer")
        return value

    def number(self, key: str) -> float:
        value = self._field(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise self._wrong(key, "a finite number")
        return value

    def optional_number(self, key: str) -> float | None:
        return None if self._field(key) is None else self.number(key)


def _kind(value: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), type(value).__name__
    )
