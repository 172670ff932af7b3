"""The house rules of issue 29, held by a test rather than by a reviewer's eye: no module over 600
lines and no function over 80 in the packages and the benchmarks, and no more than 10 modules at the
top level of verify/ and pipeline/ (the rest lives in rooms by concern: docs/architecture.md).

Data tables are exempt by construction: a table is an assignment, not a function, and a module that
is mostly a table (none today) would be named here with its reason."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("stackproof", "verify", "pipeline", "benchmarks")
MODULE_LINES, FUNCTION_LINES, TOP_LEVEL_MODULES = 600, 80, 10


def sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (REPO / package).rglob("*.py"))


def long_modules(paths: list[Path], root: Path = REPO) -> list[str]:
    out = []
    for path in paths:
        lines = path.read_text().count("\n")
        if lines > MODULE_LINES:
            out.append(f"{path.relative_to(root)}: {lines} lines")
    return out


def long_functions(paths: list[Path], root: Path = REPO) -> list[str]:
    out = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > FUNCTION_LINES:
                    out.append(f"{path.relative_to(root)}:{node.lineno} {node.name}: {length} lines")
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
