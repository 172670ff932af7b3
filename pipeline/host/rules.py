"""Preflight rules: known incidents, checked against a cell and a host before they bite.

Data, not code: the rules live in `preflight_rules.yaml`, each citing its incident (and the
upstream line it quotes), a condition on the cell's facts (serve args, env, the model's
architecture from its config.json, package versions) and one on the host's (the doctor probe's
device limits and ptrace facts), and whether it is a WARN or a FAIL. `load_rules` validates the
file with located errors (`preflight_rules.yaml:42: rules[3].severity: ...`); `judge_rules` is pure:

    judge_rules(load_rules(), cell_facts(cell), HostLimits.from_doctor(document))

Conditions are three-valued: a fact that is unknown makes its test unknown, and a rule that is
neither ruled out nor proven is a WARN naming the unknown facts (never a silent PASS). A rule whose
cell condition is false does not apply (SKIP); one whose host condition is false is a PASS.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from pipeline.errors import InputError, MatrixError
from pipeline.guard import boundedio
from pipeline.host.geometry import flatten_limits
from pipeline.matrix.model import Cell
from pipeline.matrix.yamlsrc import Path_, YamlSource, load_yaml
from pipeline.result import CheckResult, Status

__all__ = [
    "CELL_FACTS",
    "HOST_FACTS",
    "RULES_FILE",
    "CellFacts",
    "HostLimits",
    "Rule",
    "cell_facts",
    "judge_rules",
    "load_rules",
    "model_architecture",
    "model_config",
]

RULES_FILE = Path(__file__).with_name("preflight_rules.yaml")
SCHEMA_VERSION = 1
MODEL_CONFIG_LIMIT = 16 * 2**20  # a model's config.json is a few KB
RULE_KEYS = (
    "id",
    "title",
    "severity",
    "incident",
    "upstream",
    "what",
    "workaround",
    "cell",
    "host",
    "fixed_in",
    "fixed_by",
)
REQUIRED = ("id", "title", "severity", "incident", "what", "workaround", "cell", "host")
SEVERITIES = {"warn": Status.WARN, "fail": Status.FAIL}
_REF = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+#\d+$")
# Plain cell facts; `arg:--FLAG` and `env:NAME` are families.
CELL_FACTS = ("runtime", "arch", "architecture", "model_type", "args")
HOST_FACTS = (
    "shared_memory_per_sm",
    "shared_memory_per_block_optin",
    "sm_count",
    "total_memory",
    "integrated",
    "capability",
    "ptrace_scope",
    "yama",
    "in_container",
    "capabilities",
    "seccomp",
    "runtime",  # the cell's: whether container capabilities apply at all
)
TESTS = ("eq", "ne", "lt", "le", "gt", "ge", "match", "in", "has", "lacks", "set")
_UNKNOWN = object()  # a fact nobody could read


# -- data ------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Rule:
    id: str
    title: str
    severity: str  # warn | fail
    incident: str  # owner/repo#N
    what: str
    workaround: str
    cell: Any  # a condition (see the YAML's header)
    host: Any
    upstream: str | None = None
    fixed_in: tuple[tuple[str, str], ...] = ()
    fixed_by: str | None = None


@dataclass(frozen=True, kw_only=True)
class CellFacts:
    """What a rule's `cell` condition reads; None/absent = unknown."""

    id: str
    runtime: str  # docker | host
    arch: str
    architecture: str | None  # config.json architectures[0]; None: the model's config is not here
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    versions: tuple[tuple[str, str], ...] = ()  # canonical name -> version, where the cell pins one
    architecture_source: str = ""
    # config.json's text `model_type` (text_config's for a multimodal model), what vLLM keys MLA on
    # (`is_deepseek_mla`); None: unknown, like the architecture.
    model_type: str | None = None

    def value(self, name: str) -> Any:
        if name == "runtime":
            return self.runtime
        if name == "arch":
            return self.arch
        if name == "architecture":
            return _UNKNOWN if self.architecture is None else self.architecture
        if name == "model_type":
            return _UNKNOWN if self.model_type is None else self.model_type
        if name == "args":
            return " ".join([*self.args, *(v for _, v in self.env)])
        if name.startswith("env:"):
            return dict(self.env).get(name[4:])
        if name.startswith("arg:"):
            return _flag(self.args, name[4:])
        return _UNKNOWN


@dataclass(frozen=True, kw_only=True)
class HostLimits:
    """GPU 0's limits and the ptrace facts, as the doctor probe recorded them (`cuda_devices`,
    `security`, `host.container`); None = not recorded."""

    name: str | None = None
    capability: str | None = None
    shared_memory_per_sm: int | None = None
    shared_memory_per_block_optin: int | None = None
    sm_count: int | None = None
    total_memory: int | None = None
    integrated: bool | None = None
    ptrace_scope: int | None = None
    yama: bool | None = None
    in_container: bool | None = None
    capabilities: tuple[str, ...] | None = None
    seccomp: str | None = None
    source: str = "doctor probe"
    notes: tuple[str, ...] = field(default=())

    @classmethod
    def from_doctor(cls, document: Mapping[str, Any], source: str = "doctor probe") -> HostLimits:
        """From a doctor document (`verify/probes/doctor_probe.py`, or its `--limits-only`); a document from
        before these facts were recorded gives unknowns, and one without a driver says why in `notes`."""
        if not document.get("cuda_devices") and not document.get("security"):
            return cls(source=source, notes=("no device limits: the doctor document predates them",))
        return cls.from_record(flatten_limits(dict(document)), source)

    @classmethod
    def from_record(cls, record: Mapping[str, Any] | None, source: str = "receipt") -> HostLimits:
        """From the flat record a receipt's host keeps (`HostFingerprint.limits`)."""
        if not record:
            return cls(source=source, notes=("no device limits recorded",))
        capabilities = record.get("capabilities")
        return cls(
            name=record.get("name"),
            capability=record.get("capability"),
            shared_memory_per_sm=record.get("shared_memory_per_sm"),
            shared_memory_per_block_optin=record.get("shared_memory_per_block_optin"),
            sm_count=record.get("sm_count"),
            total_memory=record.get("total_memory"),
            integrated=record.get("integrated"),
            ptrace_scope=record.get("ptrace_scope"),
            yama=record.get("yama"),
            in_container=record.get("in_container"),
            capabilities=tuple(capabilities) if isinstance(capabilities, list | tuple) else None,
            seccomp=record.get("seccomp"),
            source=source,
            notes=(f"no device limits: {record['error']}",) if record.get("error") else (),
        )

    def value(self, name: str) -> Any:
        value = getattr(self, name, None) if name in HOST_FACTS else None
        if name == "ptrace_scope" and value is None and self.yama is False:
            return 0  # no Yama: nothing beyond the usual same-uid checks restricts ptrace
        return _UNKNOWN if value is None else value


# -- loading ---------------------------------------------------------------------------------------


def load_rules(file: Path = RULES_FILE) -> tuple[Rule, ...]:
    src = load_yaml(file)
    data = src.data if isinstance(src.data, dict) else {}
    if data.get("schema_version") != SCHEMA_VERSION:
        raise MatrixError([f"{src.where(('schema_version',))}: must be {SCHEMA_VERSION}"])
    entries = data.get("rules")
    if not isinstance(entries, list):
        raise MatrixError([f"{file}:1: rules: must be a list"])
    problems: list[str] = []
    result: list[Rule] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        rule = _rule(src, ("rules", i), entry, problems)
        if rule is None:
            continue
        if rule.id in seen:
            problems.append(f"{src.where(('rules', i, 'id'))}: duplicate rule id {rule.id!r}")
        seen.add(rule.id)
        result.append(rule)
    if problems:
        raise MatrixError(problems)
    return tuple(result)


def _rule(src: YamlSource, path: Path_, entry: Any, problems: list[str]) -> Rule | None:
    if not isinstance(entry, dict):
        problems.append(f"{src.where(path)}: must be a mapping")
        return None
    before = len(problems)
    problems += [f"{src.where((*path, key))}: unknown key" for key in entry if key not in RULE_KEYS]
    problems += [f"{src.where(path)}: missing required key {key!r}" for key in REQUIRED if key not in entry]
    if len(problems) > before:
        return None
    for key in ("id", "title", "what", "workaround"):
        if not isinstance(entry[key], str) or not entry[key].strip():
            problems.append(f"{src.where((*path, key))}: must be a non-empty string")
    if entry["severity"] not in SEVERITIES:
        problems.append(f"{src.where((*path, 'severity'))}: must be one of {', '.join(SEVERITIES)}")
    for key in ("incident", "fixed_by"):
        if key in entry and not (isinstance(entry[key], str) and _REF.match(entry[key])):
            problems.append(f"{src.where((*path, key))}: must be owner/repo#N")
    fixed_in = entry.get("fixed_in") or {}
    if not isinstance(fixed_in, dict):
        problems.append(f"{src.where((*path, 'fixed_in'))}: must map a package to a version")
        fixed_in = {}
    for package, version in fixed_in.items():
        try:
            Version(str(src.text_of((*path, "fixed_in", package)) or version))
        except InvalidVersion:
            problems.append(f"{src.where((*path, 'fixed_in', package))}: {version!r} is not a version")
    _condition(src, (*path, "cell"), entry["cell"], "cell", problems)
    _condition(src, (*path, "host"), entry["host"], "host", problems)
    if len(problems) > before:
        return None
    return Rule(
        id=entry["id"],
        title=entry["title"],
        severity=entry["severity"],
        incident=entry["incident"],
        what=" ".join(entry["what"].split()),
        workaround=" ".join(entry["workaround"].split()),
        cell=entry["cell"],
        host=entry["host"],
        upstream=" ".join(str(entry["upstream"]).split()) if entry.get("upstream") else None,
        fixed_in=tuple((str(k), str(src.text_of((*path, "fixed_in", k)) or v)) for k, v in sorted(fixed_in.items())),
        fixed_by=entry.get("fixed_by"),
    )


def _condition(src: YamlSource, path: Path_, node: Any, side: str, problems: list[str]) -> None:
    if not isinstance(node, dict) or not node:
        problems.append(f"{src.where(path)}: must be a non-empty mapping (fact: test, any: [...], all: [...])")
        return
    for key, value in node.items():
        here = (*path, key)
        if key in ("any", "all"):
            if not isinstance(value, list) or not value:
                problems.append(f"{src.where(here)}: must be a non-empty list of conditions")
                continue
            for i, sub in enumerate(value):
                _condition(src, (*here, i), sub, side, problems)
            continue
        if not _known_fact(str(key), side):
            known = ", ".join(CELL_FACTS if side == "cell" else HOST_FACTS)
            extra = ", arg:--FLAG, env:NAME" if side == "cell" else ""
            problems.append(f"{src.where(here)}: unknown {side} fact (known: {known}{extra})")
            continue
        if not isinstance(value, dict) or len(value) != 1 or next(iter(value)) not in TESTS:
            problems.append(f"{src.where(here)}: must be one test: {{{' | '.join(TESTS)}: value}}")
            continue
        test, operand = next(iter(value.items()))
        if test == "match":
            try:
                re.compile(str(operand))
            except re.error as exc:
                problems.append(f"{src.where((*here, test))}: bad regex: {exc}")
        if test in ("lt", "le", "gt", "ge") and not isinstance(operand, int | float):
            problems.append(f"{src.where((*here, test))}: must be a number")
        if test == "in" and not isinstance(operand, list):
            problems.append(f"{src.where((*here, test))}: must be a list")


def _known_fact(name: str, side: str) -> bool:
    if side == "cell":
        return name in CELL_FACTS or bool(re.match(r"^(arg:-{1,2}[A-Za-z0-9][\w-]*|env:[A-Za-z_]\w*)$", name))
    return name in HOST_FACTS


# -- the cell's facts --------------------------------------------------------------------------------


def cell_facts(
    cell: Cell,
    *,
    model_store: Path | None = None,
    architecture: tuple[str | None, str] | None = None,
    model_type: str | None = None,
) -> CellFacts:
    """A cell's facts for the rules: serve args, env (the image's, then the serve spec's), pinned
    versions, and the model's architecture and model_type from its config.json where it is on this
    machine (a `path:` model, or an `hf:` model already in the store; `architecture`: already read,
    with its source, and then `model_type` is the one read with it)."""
    env = {**dict(cell.env), **cell.serve_env()} if cell.serve else dict(cell.env)
    versions = {r.name: r.version for r in (*cell.overrides, *cell.given)}
    if architecture is None:
        config, source = model_config(cell, model_store)
        architecture = (_architecture(config), source)
        model_type = _model_type(config)
    return CellFacts(
        id=cell.id,
        runtime=cell.runtime,
        arch=cell.arch,
        architecture=architecture[0],
        args=tuple(cell.serve.args) if cell.serve else (),
        env=tuple(sorted(env.items())),
        versions=tuple(sorted(versions.items())),
        architecture_source=architecture[1],
        model_type=model_type,
    )


def model_architecture(cell: Cell, model_store: Path | None = None) -> tuple[str | None, str]:
    """config.json's `architectures[0]` and the file it came from, or None and why not."""
    config, source = model_config(cell, model_store)
    return _architecture(config), source


def model_config(cell: Cell, model_store: Path | None = None) -> tuple[dict[str, Any] | None, str]:
    """The model's config.json and the file it came from, or None and why not."""
    if cell.serve is None:
        return None, "no model: the cell serves none"
    model = cell.serve.model
    directory: Path | None = None
    if model.kind == "path":
        directory = Path(model.location)
    elif model.kind == "hf":
        from pipeline.host.modelstore import snapshot_in_store, store_dir

        directory = snapshot_in_store(model, model_store or store_dir())
    if directory is None or not os.path.lexists(directory / "config.json"):
        return None, f"unknown: no config.json for {model.source} on this machine"
    try:  # a model directory the matrix names: read through the bounded reader (issue 27)
        config = json.loads(boundedio.read_bytes(directory / "config.json", "model config", limit=MODEL_CONFIG_LIMIT))
    except InputError as exc:
        return None, f"unknown: {exc}"
    except (ValueError, RecursionError) as exc:
        return None, f"unknown: {directory / 'config.json'}: {exc}"
    if not isinstance(config, dict):
        return None, f"unknown: {directory / 'config.json'}: not a JSON object"
    return config, str(directory / "config.json")


def _architecture(config: dict[str, Any] | None) -> str | None:
    architectures = (config or {}).get("architectures") or []
    return str(architectures[0]) if isinstance(architectures, list) and architectures else None


def _model_type(config: dict[str, Any] | None) -> str | None:
    """The text model's `model_type`: vLLM reads `hf_text_config.model_type`, which is a multimodal
    config's `text_config` (vllm/transformers_utils/model_arch_config_convertor.py:294-297 at 0.34.0)."""
    if not config:
        return None
    text = config.get("text_config")
    value = text.get("model_type") if isinstance(text, dict) and text.get("model_type") else config.get("model_type")
    return str(value) if value else None


def _flag(args: Sequence[str], flag: str) -> Any:
    """A flag's value in serve args (`--x v` or `--x=v`; "" for a bare flag); None when absent."""
    for i, arg in enumerate(args):
        if arg == flag:
            following = args[i + 1] if i + 1 < len(args) else ""
            return "" if following.startswith("-") else following
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


# -- judging -----------------------------------------------------------------------------------------


def judge_rules(rules: Sequence[Rule], cell: CellFacts, host: HostLimits) -> list[CheckResult]:
    """One item per rule, named `rule:ID`; pure."""
    return [_judge(rule, cell, host) for rule in rules]


def _judge(rule: Rule, cell: CellFacts, host: HostLimits) -> CheckResult:
    name = f"rule:{rule.id}"
    evidence: dict[str, Any] = {"incident": rule.incident, "upstream": rule.upstream, "severity": rule.severity}
    fixed = _fixed(rule, cell)
    if fixed:
        return CheckResult(name=name, status=Status.SKIP, message=f"{rule.title}: fixed in {fixed}", evidence=evidence)
    unknown: list[str] = []
    applies = _holds(rule.cell, lambda fact: cell.value(fact), unknown)
    if applies is False:
        return CheckResult(
            name=name, status=Status.SKIP, message=f"does not apply to {cell.id} ({rule.incident})", evidence=evidence
        )

    def host_value(fact: str) -> Any:
        return cell.runtime if fact == "runtime" else host.value(fact)

    bites = _holds(rule.host, host_value, unknown)
    evidence["facts"] = {f: _shown(host_value(f)) for f in _facts_of(rule.host)}
    evidence["cell_facts"] = {f: _shown(cell.value(f)) for f in _facts_of(rule.cell)}
    if bites is False:  # the host is safe, whatever the cell's unknowns say
        message = f"{rule.title}: not on this host ({rule.incident})"
        return CheckResult(name=name, status=Status.PASS, message=message, evidence=evidence)
    if applies is True and bites is True:
        message = f"{rule.title} ({rule.incident}): {rule.what} Workaround: {rule.workaround}"
        if rule.fixed_by:
            message += f" Fixed by {rule.fixed_by}."
        return CheckResult(name=name, status=SEVERITIES[rule.severity], message=message, evidence=evidence)
    facts = ", ".join(sorted(set(unknown)))
    return CheckResult(
        name=name,
        status=Status.WARN,
        message=f"unknown: {rule.title} ({rule.incident}) may apply; facts not known: {facts}. "
        f"Workaround if it does: {rule.workaround}",
        evidence={**evidence, "unknown": sorted(set(unknown))},
    )


def _fixed(rule: Rule, cell: CellFacts) -> str | None:
    versions = dict(cell.versions)
    for package, version in rule.fixed_in:
        have = versions.get(package)
        try:
            if have is not None and Version(have) >= Version(version):
                return f"{package} {version} ({cell.id} pins {have})"
        except InvalidVersion:
            continue
    return None


def _holds(node: Any, value: Any, unknown: list[str]) -> bool | None:
    """Three-valued: True, False, or None (unknown facts, named into `unknown`)."""
    results: list[bool | None] = []
    for key, test in node.items():
        if key == "any":
            subs = [_holds(sub, value, unknown) for sub in test]
            results.append(True if True in subs else (None if None in subs else False))
        elif key == "all":
            subs = [_holds(sub, value, unknown) for sub in test]
            results.append(False if False in subs else (None if None in subs else True))
        else:
            result = _test(value(key), test)
            if result is None:
                unknown.append(key)
            results.append(result)
    return False if False in results else (None if None in results else True)


def _test(have: Any, test: Mapping[str, Any]) -> bool | None:
    op, want = next(iter(test.items()))
    if op == "set":
        if have is _UNKNOWN:
            return None
        present = have is not None and str(have).strip().lower() not in ("", "0", "false", "no", "off")
        return present == bool(want)
    if have is _UNKNOWN:
        return None
    if have is None:  # absent (a flag not given, an env var unset): only `ne` and `lacks` can hold
        return op in ("ne", "lacks")
    if op == "eq":
        return _same(have, want)
    if op == "ne":
        return not _same(have, want)
    if op == "in":
        return any(_same(have, w) for w in want)
    if op == "match":
        return re.search(str(want), str(have)) is not None
    if op in ("has", "lacks"):
        items = set(have) if isinstance(have, list | tuple) else {str(have)}
        return (str(want) in items) == (op == "has")
    try:
        number = float(have)
    except (TypeError, ValueError):
        return None
    bound = float(want)
    return {"lt": number < bound, "le": number <= bound, "gt": number > bound, "ge": number >= bound}[op]


def _same(have: Any, want: Any) -> bool:
    if isinstance(have, bool) or isinstance(want, bool):
        return bool(have) == bool(want) if isinstance(have, bool) and isinstance(want, bool) else False
    return str(have) == str(want)


def _facts_of(node: Any) -> list[str]:
    names: list[str] = []
    for key, test in node.items():
        if key in ("any", "all"):
            for sub in test:
                names += [n for n in _facts_of(sub) if n not in names]
        elif key not in names:
            names.append(key)
    return names


def _shown(value: Any) -> Any:
    if value is _UNKNOWN:
        return "unknown"
    return list(value) if isinstance(value, tuple) else value
