"""The checks of a cell's parts: packages, install, serve, forensics, model revision, load spec, arms."""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Any

from packaging.utils import canonicalize_name

from pipeline.guard.redact import secret_arg
from pipeline.matrix.fields import FieldChecker
from pipeline.matrix.model import (
    DEFAULT_ENGINE,
    HOST_EXPECTATION_KEYS,
    SERVING_ENGINES,
    Arm,
    Base,
    CellBase,
    ForensicsSpec,
    HostExpectations,
    Install,
    LoadSpec,
    ModelSource,
    Requirement,
    ServeSpec,
)
from pipeline.matrix.schema import (
    _COMMIT,
    _CONTROL,
    _ID,
    _MODEL,
    _PACKAGE,
    ARM_KEYS,
    DETERMINISM_KEYS,
    FORENSICS_KEYS,
    INSTALL_KEYS,
    LOAD_KEYS,
    MAX_CONCURRENCY,
    MAX_COUNT,
    MAX_SECONDS,
    MODEL_KEYS,
    PACKAGE_KEYS,
    SERVE_KEYS,
    TOOL_OWNED_ARGS,
    _did_you_mean,
    _finite_in,
    _kind,
    _shown,
)
from pipeline.matrix.yamlsrc import Path_

__all__ = ["CellPartsChecker"]


class CellPartsChecker(FieldChecker):
    """The checks of one cell's sub-mappings, on top of the shared field checks."""

    def packages(self, path: Path_, value: Any, index_names: tuple[str, ...]) -> tuple[Requirement, ...]:
        """`name: {version, index}` mappings (overrides and install requirements)."""
        if value is None:
            return ()
        if not isinstance(value, dict):
            self.problem(path, f"must be a mapping of package: {{version, index}}, got {_kind(value)}")
            return ()
        result = []
        for name, spec in value.items():
            item: Path_ = (*path, name)
            if not _PACKAGE.match(str(name)):
                self.problem(item, f"{name!r} is not a valid package name")
            if not self.keys(item, spec, PACKAGE_KEYS, required=PACKAGE_KEYS):
                continue
            version = self.version((*item, "version"), spec.get("version"))
            index = self.text((*item, "index"), spec.get("index"))
            if index and index not in index_names:
                self.problem((*item, "index"), f"undeclared index {index!r}{_did_you_mean(index, index_names)}")
            result.append(Requirement(name=str(canonicalize_name(str(name))), version=version, index=index))
        return tuple(sorted(result, key=lambda r: r.name))

    def install(self, path: Path_, value: Any, index_names: tuple[str, ...]) -> Install | None:
        if not self.keys(path, value, INSTALL_KEYS, required=("requirements", "lock")):
            return None
        lock = self.text((*path, "lock"), value.get("lock"))
        return Install(
            requirements=self.packages((*path, "requirements"), value.get("requirements"), index_names),
            lock=(self.src.file.parent / lock).resolve(),
            python_version=self.text((*path, "python_version"), value.get("python_version", "3.11")),
            python_platform=self.text(
                (*path, "python_platform"), value.get("python_platform", "x86_64-manylinux_2_28")
            ),
        )

    def serve(self, path: Path_, value: Any) -> ServeSpec | None:
        if not self.keys(path, value, SERVE_KEYS, required=("model",)):
            return None
        model = value.get("model")
        source = ModelSource(source="", revision=None)
        if self.keys((*path, "model"), model, MODEL_KEYS, required=("source",)):
            text = self.text(
                (*path, "model", "source"),
                model.get("source"),
                pattern=_MODEL,
                what="model source (hf:org/name or path:/dir/in/image)",
            )
            source = ModelSource(source=text, revision=self.revision((*path, "model"), text, model.get("revision")))
        args = self.texts((*path, "args"), value.get("args"))
        self.tool_owned(path, args)
        engine = self.engine((*path, "engine"), value.get("engine", DEFAULT_ENGINE))
        timeout = value.get("readiness_timeout", 600)
        if not _finite_in(timeout, 0, MAX_SECONDS):
            self.problem(
                (*path, "readiness_timeout"),
                f"must be a positive number of seconds, got {_shown(timeout)}"
                + ("" if _finite_in(timeout, -math.inf, 0, zero_ok=True) else f" (finite, at most {MAX_SECONDS:.0f})"),
            )
            timeout = 600
        return ServeSpec(
            model=source,
            args=args,
            env=self.env((*path, "env"), value.get("env")),
            readiness_timeout_s=float(timeout),
            shm_size=self.text((*path, "shm_size"), value.get("shm_size", "1g")),
            gpus=None if value.get("gpus") is None else self.text((*path, "gpus"), value["gpus"]),
            load=self.load_spec((*path, "load"), value.get("load")),
            forensics=self.forensics((*path, "forensics"), value.get("forensics")),
            engine=engine,
        )

    def engine(self, path: Path_, value: Any) -> str:
        """`serve.engine`: one of the engines with a driver (SERVING_ENGINES), with a did-you-mean."""
        if not isinstance(value, str) or value not in SERVING_ENGINES:
            known = tuple(SERVING_ENGINES)
            shown = _did_you_mean(value, known) if isinstance(value, str) else ""
            self.problem(path, f"unknown serving engine {_shown(value)}{shown} (known: {', '.join(known)})")
            return DEFAULT_ENGINE
        return value

    def forensics(self, path: Path_, value: Any) -> ForensicsSpec:
        """`serve.forensics`: `{cuda_coredump: true|false}` (default false)."""
        if value is None or not self.keys(path, value, FORENSICS_KEYS):
            return ForensicsSpec()
        coredump = value.get("cuda_coredump", False)
        if not isinstance(coredump, bool):
            self.problem((*path, "cuda_coredump"), f"must be true or false, got {_kind(coredump)}")
            coredump = False
        return ForensicsSpec(cuda_coredump=coredump)

    def host_expectations(self, path: Path_, value: Any) -> HostExpectations | None:
        """`host:` {gpu, gpu_count, driver, cuda_driver, kernel, cudnn_host}: the reporter's box, as
        `stackproof repro` writes it (docs/repro.md); each a string, gpu_count a count, cudnn_host a list."""
        if value is None or not self.keys(path, value, HOST_EXPECTATION_KEYS):
            return None
        texts = {k: self.text((*path, k), value[k]) for k in ("gpu", "driver", "cuda_driver", "kernel") if k in value}
        count = value.get("gpu_count")
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
            self.problem((*path, "gpu_count"), f"must be a count (0 or more), got {_shown(count)}")
            count = None
        cudnn = self.texts((*path, "cudnn_host"), value["cudnn_host"]) if "cudnn_host" in value else None
        return HostExpectations(gpu_count=count, cudnn_host=cudnn, **texts)

    def revision(self, path: Path_, source: str, value: Any) -> str | None:
        """An `hf:` model names the commit it is served at: a branch or tag moves under the store and the
        receipt, a commit does not. A `path:` model is in the image, so a revision would mean nothing."""
        where = (*path, "revision")
        if source.startswith("path:"):
            if value is not None:
                self.problem(where, "a path: model is part of the image and takes no revision")
            return None
        if not source.startswith("hf:"):
            return None  # the source itself was reported
        if value is None:
            self.problem(where, f"missing: {source} needs the 40-hex commit hash it is served at")
            return None
        text = self.text(where, value)
        if text and not _COMMIT.match(text):
            self.problem(where, f"{text!r} is not a commit hash (40 hex digits); a branch or tag can move")
        return text

    def load_spec(self, path: Path_, value: Any) -> LoadSpec:
        """`serve.load`: every key optional, each checked against the type of LoadSpec's default."""
        if value is None or not self.keys(path, value, LOAD_KEYS):
            return LoadSpec()
        # Unknown keys were reported by keys(); only the known ones are read.
        flat = {k: v for k, v in value.items() if k in LOAD_KEYS and k != "determinism"}
        where = {k: (*path, k) for k in flat}
        det = value.get("determinism")
        if det is not None and self.keys((*path, "determinism"), det, DETERMINISM_KEYS):
            known = {k: v for k, v in det.items() if k in DETERMINISM_KEYS}
            flat.update({f"determinism_{k}": v for k, v in known.items()})
            where.update({f"determinism_{k}": (*path, "determinism", k) for k in known})
        fields = {f.name: f for f in dataclasses.fields(LoadSpec)}
        chosen: dict[str, Any] = {}
        for key, raw in flat.items():
            name = key if key in fields else f"{key}_s"
            default = fields[name].default
            at = where[key]
            if name == "baseline_rate":
                chosen[name] = self.probability(at, raw)
            elif name == "canary_floor":
                chosen[name] = self.share(at, raw)
            elif name == "questions_file":
                file = (self.src.file.parent / self.text(at, raw)).resolve()
                if not file.is_file():
                    self.problem(at, f"no such file: {file}")
                chosen[name] = str(file)
            elif isinstance(default, bool):
                if not isinstance(raw, bool):
                    self.problem(at, f"must be true or false, got {raw!r}")
                chosen[name] = bool(raw)
            elif isinstance(default, int) and name != "rate":
                low = 0 if name == "seed" else 1
                high = MAX_CONCURRENCY if name == "concurrency" else 2**63 - 1 if name == "seed" else MAX_COUNT
                ok = isinstance(raw, int) and not isinstance(raw, bool) and low <= raw <= high
                if not ok and isinstance(raw, int) and not isinstance(raw, bool) and raw > high:
                    self.problem(at, f"must be at most {high:,}, got {_shown(raw)}")
                elif not ok:
                    self.problem(
                        at, f"must be a {'non-negative' if name == 'seed' else 'positive'} integer, got {_shown(raw)}"
                    )
                chosen[name] = raw if ok else default
            else:  # seconds, rates, burstiness: finite positive numbers (warmup may be 0)
                top = MAX_SECONDS if name.endswith("_s") or name == "stall_seconds" else float(MAX_COUNT)
                ok = _finite_in(raw, 0, top, zero_ok=name == "warmup_s")
                if not ok and _finite_in(raw, top, math.inf):
                    self.problem(at, f"must be at most {top:,.0f}, got {_shown(raw)}")
                elif not ok and isinstance(raw, float) and not math.isfinite(raw):
                    self.problem(at, f"must be a finite number, got {_shown(raw)}")
                elif not ok:
                    self.problem(at, f"must be a positive number, got {_shown(raw)}")
                chosen[name] = float(raw) if ok else default
        return LoadSpec(**chosen)

    def probability(self, path: Path_, value: Any) -> float:
        """`1/450` or `0.00222`: a fault probability per question."""
        text = str(value).strip()
        try:
            number = float(Fraction(text))
        except (ValueError, ZeroDivisionError, OverflowError):
            number = -1.0
        if not 0 < number < 1:
            self.problem(path, f"{text!r} is not a probability: write a fraction (1/450) or a decimal (0.00222)")
            return LoadSpec.baseline_rate
        return number

    def share(self, path: Path_, value: Any) -> float | None:
        """A share of answers in (0, 1]: `0.75`."""
        if not _finite_in(value, 0, 1):
            self.problem(path, f"must be a share of answers above 0 and at most 1 (e.g. 0.75), got {_shown(value)}")
            return None
        return float(value)

    def tool_owned(self, path: Path_, args: tuple[str, ...]) -> None:
        """Flags the tool owns, and credentials (which would reach `ps`, inspect and server.log)."""
        for j, arg in enumerate(args):
            if arg.split("=", 1)[0] in TOOL_OWNED_ARGS:
                self.problem((*path, "args", j), f"{arg!r}: the tool sets --host 127.0.0.1 and --port itself")
            if _CONTROL.search(arg):
                self.problem((*path, "args", j), "the argument holds a control character (newline, tab, escape...)")
            following = args[j + 1] if j + 1 < len(args) and not args[j + 1].startswith("-") else None
            secret = secret_arg(arg, following if arg.startswith("-") and "=" not in arg else None)
            if secret:
                self.problem(
                    (*path, "args", j), f"refused: {secret}; a secret never goes into matrix.yaml or the server's argv"
                )

    def arms(self, path: Path_, value: Any) -> tuple[Arm, ...]:
        if value is None:
            return ()
        if not isinstance(value, dict):
            self.problem(path, f"must be a mapping of arm name: {{env, args}}, got {_kind(value)}")
            return ()
        result = []
        for name, spec in value.items():
            item: Path_ = (*path, name)
            if not _ID.match(str(name)):
                self.problem(item, f"{name!r} is not a valid arm name")
            spec = spec or {}
            if self.keys(item, spec, ARM_KEYS):
                args = self.texts((*item, "args"), spec.get("args"))
                self.tool_owned(item, args)
                result.append(
                    Arm(
                        log_rules=self.log_rules((*item, "log_rules"), spec.get("log_rules"), prefix=str(name)),
                        name=str(name),
                        description=self.text((*item, "description"), spec.get("description", "")),
                        env=self.env((*item, "env"), spec.get("env")),
                        args=args,
                    )
                )
        return tuple(result)

    def base_cells_exist(self, bases: tuple[Base, ...], cell_ids: set[str]) -> None:
        for base in bases:
            if isinstance(base, CellBase) and base.cell not in cell_ids:
                self.problem(
                    ("bases", base.name, "cell"), f"no cell {base.cell!r}{_did_you_mean(base.cell, tuple(cell_ids))}"
                )
