"""Python sources read with `ast`: the messages a module can print, the variables it reads, its classes.

Split from `index.py`; what is indexed and why is described there.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from typing import Any

from verify.audit.facts import ClassInfo, FileFacts, Hole, Message, Segment, merge_segments

__all__ = ["PythonIndexer"]

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
_PERCENT = re.compile(
    r"%(?:\((?P<key>[^)]*)\))?[-#0 +]*(?:\d+|\*)?(?:\.(?:\d+|\*))?[hlL]?(?P<conv>[diouxXeEfFgGcrsa%])"
)
_BRACE = re.compile(r"\{\{|\}\}|\{[^{}]*\}")
_CAMEL = re.compile(r"^_?[A-Z]")
_MESSAGE_NAME = re.compile(r"msg|message|err|warn|reason|text", re.IGNORECASE)


# Nodes with neither a visitor nor a node that could have one beneath them: the walk does not go
# there (every Name's Load(), every operator: about a third of a module's nodes).
_LEAVES = frozenset(
    {ast.Constant, ast.Name, ast.Load, ast.Store, ast.Del, ast.Pass, ast.Break, ast.Continue}
    | {cls for base in (ast.operator, ast.unaryop, ast.cmpop, ast.boolop) for cls in base.__subclasses__()}
)


def _node_types(base: type) -> set[type]:
    found: set[type] = set()
    subclasses: list[type] = base.__subclasses__()
    for sub in subclasses:
        found |= {sub, *_node_types(sub)}
    return found


# The node types the walk enters: a value of any other type (None, a str, a bool, a leaf) is passed
# over by one set lookup, without an isinstance test per child.
_ENTER = frozenset(_node_types(ast.AST) - _LEAVES)
# Fields that hold only names, numbers, flags, contexts or operators: never a node to enter.
_SCALAR_FIELDS = frozenset(
    {"id", "attr", "name", "arg", "module", "level", "conversion", "kind", "type_comment", "is_async", "simple"}
    | {"ctx", "op", "ops", "names", "kwd_attrs", "tag"}
)
_FIELDS: dict[type, tuple[str, ...]] = {}  # node type -> the fields the walk reads, last first
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _fields(kind: type) -> tuple[str, ...]:
    names: tuple[str, ...] = kind._fields  # type: ignore[attr-defined]
    fields = _FIELDS[kind] = tuple(f for f in reversed(names) if f not in _SCALAR_FIELDS)
    return fields


class PythonIndexer:
    """One module's facts. The `visit_*` methods see each node of their type once, in the order
    `ast.NodeVisitor` would (pre-order, fields in order), with `self.function` the innermost
    enclosing function; the walk is a loop over a stack rather than recursion: a big package is
    millions of nodes (FlashInfer 0.7.4: 126 MB of Python), and NodeVisitor's two calls and a
    method lookup per node were as costly as parsing."""

    def __init__(self, path: str, text: str) -> None:
        self.facts = FileFacts(path)
        self.text = text
        self.module_refs: dict[str, set[str]] = {}  # module-level name -> names in its value
        self.function: ast.AST | None = None  # the innermost function around the node visited
        self._refs_cache: dict[int, tuple[str, ...]] = {}

    def visit(self, tree: ast.AST) -> None:
        # Built per walk, not kept: bound methods on self would be a reference cycle, and the
        # indexing workers run with the cyclic collector paused (each module's text would stay).
        visitors: dict[type, Callable[[Any], None]] = {
            ast.ClassDef: self.visit_ClassDef,
            ast.Subscript: self.visit_Subscript,
            ast.Return: self.visit_Return,
            ast.Assign: self.visit_Assign,
            ast.Raise: self.visit_Raise,
            ast.Call: self.visit_Call,
        }
        # A function's body is followed on the stack by a 1-tuple holding the function around it,
        # which restores `function` once the body is done (a tuple per function, not per node).
        stack: list[Any] = [tree]
        function: ast.AST | None = None
        pop, enter = stack.pop, _ENTER
        while stack:
            node = pop()
            kind = type(node)
            if kind is tuple:
                function = node[0]
                continue
            visitor = visitors.get(kind)
            if visitor is not None:
                self.function = function
                visitor(node)
            if kind in _FUNCTIONS:
                stack.append((function,))
                function = node
            for field in _FIELDS.get(kind) or _fields(kind):  # last field first: the first is popped first
                value = getattr(node, field, None)
                if type(value) is list:
                    stack += [c for c in reversed(value) if type(c) in enter]
                elif type(value) in enter:
                    stack.append(value)

    def run(self) -> FileFacts:
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

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if _is_environ(node.value) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            self.facts.env.setdefault(node.slice.value, (self.facts.file, node.lineno))

    def visit_Return(self, node: ast.Return) -> None:
        # str()/repr() of an object logged with %s (vLLM logs its whole config this way)
        fn = self.function
        if node.value is not None and isinstance(fn, ast.FunctionDef) and fn.name in ("__str__", "__repr__"):
            self._message(node.value, (), node.lineno, "str")

    def visit_Assign(self, node: ast.Assign) -> None:
        # A message built first and logged or raised later (`message = f"..."; logger.warning(message)`).
        # Tested cheapest first (most assignments are neither): formatted, or textual and named.
        value = node.value
        if isinstance(value, ast.JoinedStr) and any(isinstance(v, ast.FormattedValue) for v in value.values):
            self._message(value, (), node.lineno, "assigned")
        elif isinstance(value, ast.Constant) and not isinstance(value.value, str):
            return
        elif any(isinstance(t, ast.Name) and _MESSAGE_NAME.search(t.id) for t in node.targets):
            self._message(value, (), node.lineno, "assigned")

    def visit_Raise(self, node: ast.Raise) -> None:
        exc = node.exc
        if isinstance(exc, ast.Call) and exc.args:
            self._message(exc.args[0], (), node.lineno, "raise")

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

    # -- messages ------------------------------------------------------------------------------

    def _message(self, node: ast.expr, args: tuple[ast.expr, ...], line: int, kind: str) -> None:
        if args and isinstance(node, ast.Constant) and isinstance(node.value, str):
            self._emit(self._percent(node.value, args), line, kind)
        else:
            for variant in _branches(node):
                self._emit(self._segments(variant, ()), line, kind)

    def _emit(self, segments: list[Segment], line: int, kind: str) -> None:
        merged = merge_segments(segments)
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
        fn = self.function
        if fn is None:
            return ()
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
