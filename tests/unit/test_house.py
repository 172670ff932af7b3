"""The house rules of issue 29, held by a test rather than by a reviewer's eye: no module over 600
lines and no function over 80 in the packages, the benchmarks and the tests, and no more than 10
modules at the top level of verify/ and pipeline/ (the rest lives in rooms by concern:
docs/architecture.md).

Data tables are exempt. Most are so by construction: a table is an assignment, not a function. A
function that only builds a table is named in DATA_TABLES with its reason: it is not held to 80
lines, and its lines do not count towards its module's 600. tests/fixtures/ is not under the rules:
it holds the real files the tests read (receipts, logs, pins, and the scripts that made some of them)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import NamedTuple

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("stackproof", "verify", "pipeline", "benchmarks", "tests")
NOT_CODE = ("tests/fixtures",)
MODULE_LINES, FUNCTION_LINES, TOP_LEVEL_MODULES = 600, 80, 10

FUZZ_TABLE = "a table of fuzz cases, one entry per case, that grows with every case added: data, not logic"
DATA_TABLES: dict[tuple[str, str], str] = {
    ("tests/unit/test_fuzz.py", "_matrix_cases"): FUZZ_TABLE,
    ("tests/unit/test_fuzz.py", "_cli_cases"): FUZZ_TABLE,
    ("tests/unit/test_fuzz.py", "_file_cases"): FUZZ_TABLE,
    ("tests/unit/test_fuzz.py", "_reliability_cases"): FUZZ_TABLE,
    ("tests/unit/test_fuzz.py", "_surface_cases"): FUZZ_TABLE,
}


def sources() -> list[Path]:
    paths = (p for package in PACKAGES for p in (REPO / package).rglob("*.py"))
    return sorted(p for p in paths if not any(p.is_relative_to(REPO / folder) for folder in NOT_CODE))


class Function(NamedTuple):
    name: str
    lineno: int
    end_lineno: int | None


def functions(path: Path) -> list[Function]:
    stat = path.stat()  # each file is parsed once per process for all the rules, again only once changed
    return _functions(path, stat.st_mtime_ns, stat.st_size)


@functools.cache
def _functions(path: Path, mtime_ns: int, size: int) -> list[Function]:
    tree = ast.parse(path.read_text(), filename=str(path))  # kept: the names and lines, not the tree
    nodes = (node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef))
    return [Function(node.name, node.lineno, node.end_lineno) for node in nodes]


def length(node: Function) -> int:
    return (node.end_lineno or node.lineno) - node.lineno + 1


def is_table(path: Path, node: Function, root: Path) -> bool:
    return (path.relative_to(root).as_posix(), node.name) in DATA_TABLES


def long_modules(paths: list[Path], root: Path = REPO) -> list[str]:
    out = []
    table_modules = {module for module, _ in DATA_TABLES}
    for path in paths:
        lines = path.read_text().count("\n")
        if path.relative_to(root).as_posix() in table_modules:  # only these have lines that do not count
            lines -= sum(length(node) for node in functions(path) if is_table(path, node, root))
        if lines > MODULE_LINES:
            out.append(f"{path.relative_to(root)}: {lines} lines")
    return out


def long_functions(paths: list[Path], root: Path = REPO) -> list[str]:
    out = []
    for path in paths:
        for node in functions(path):
            if length(node) > FUNCTION_LINES and not is_table(path, node, root):
                out.append(f"{path.relative_to(root)}:{node.lineno} {node.name}: {length(node)} lines")
    return out


def test_no_module_over_600_lines() -> None:
    assert long_modules(sources()) == []


def test_no_function_over_80_lines() -> None:
    assert long_functions(sources()) == []


@pytest.mark.parametrize("package", ["verify", "pipeline"])
def test_verify_and_pipeline_keep_at_most_ten_modules_at_their_top(package: str) -> None:
    modules = sorted(p.name for p in (REPO / package).glob("*.py"))
    assert len(modules) <= TOP_LEVEL_MODULES, modules


def test_the_rules_catch_what_they_are_about(tmp_path: Path) -> None:
    """Both ways: a long function and a long module are named, with file, line and length."""
    long = tmp_path / "long.py"
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES))
    long.write_text(f"def too_long() -> None:\n{body}\n\n\ndef short() -> None:\n    pass\n" + "#\n" * MODULE_LINES)
    short = tmp_path / "short.py"
    short.write_text("def fine() -> None:\n    pass\n")
    assert long_functions([long, short], tmp_path) == [f"long.py:1 too_long: {FUNCTION_LINES + 1} lines"]
    assert long_modules([long, short], tmp_path) == [f"long.py: {long.read_text().count(chr(10))} lines"]


def test_the_data_tables_named_are_there() -> None:
    """An exemption outlives no table: each named function is still in its module."""
    for (module, name), reason in DATA_TABLES.items():
        assert reason, (module, name)
        assert name in {node.name for node in functions(REPO / module)}, f"{module}: no {name}: drop its exemption"


def test_a_data_table_is_exempt_by_name_only(tmp_path: Path) -> None:
    """A named table is neither a long function nor lines of its module; the same body under another
    name is both."""
    body = "\n".join(f"    x{i} = {i}" for i in range(MODULE_LINES))
    (tmp_path / "tests" / "unit").mkdir(parents=True)
    table, other = tmp_path / "tests" / "unit" / "test_fuzz.py", tmp_path / "other.py"
    table.write_text(f"def _cli_cases() -> None:\n{body}\n")
    other.write_text(f"def _cli_cases() -> None:\n{body}\n")
    assert long_functions([table], tmp_path) == long_modules([table], tmp_path) == []
    assert long_functions([other], tmp_path) == [f"other.py:1 _cli_cases: {MODULE_LINES + 1} lines"]
    assert long_modules([other], tmp_path) == [f"other.py: {MODULE_LINES + 1} lines"]


# Modules of stackproof/cli/ that every command uses: the rest are command modules.
CLI_SHARED = {"__init__", "common", "dispatch", "abplan"}


def test_every_command_module_is_held_independent() -> None:
    """A command module added later is under the contract that no command imports another
    (pyproject.toml, checked by lint-imports); one left out would be free to."""
    import tomllib

    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    independent = next(c for c in contracts if c["type"] == "independence" and "stackproof.cli.ab" in c["modules"])
    commands = {f"stackproof.cli.{p.stem}" for p in (REPO / "stackproof/cli").glob("*.py") if p.stem not in CLI_SHARED}
    assert set(independent["modules"]) == commands
