"""Benchmarks cannot rot unseen: every script in benchmarks/ parses its arguments (`--help`, exit 0),
and every name it imports from this project, at the top or inside a function, still exists there.

`benchmarks/ab.py --measure-aa` failed on import for weeks after `resolve_side` moved to
stackproof/sides.py: its import sat inside the function, so `--help` passed; the import check
below is what catches that (it failed on that file before the fix)."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
SCRIPTS = sorted(BENCHMARKS.rglob("*.py"))
PROJECT = ("pipeline", "verify", "stackproof", "benchmarks", "tests")


def project_imports(path: Path) -> list[tuple[int, str, str]]:
    """(line, module, name) of every `from MODULE import NAME` of this project's code in `path`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        ours = isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] in PROJECT
        if ours:
            assert isinstance(node, ast.ImportFrom) and node.module
            found += [(node.lineno, node.module, alias.name) for alias in node.names]
    return found


def missing_imports(path: Path, root: Path = REPO) -> list[str]:
    """The project imports of `path` that would fail: `FILE:LINE: from M import N: why`."""
    missing = []
    for line, module, name in project_imports(path):
        where = f"{path.relative_to(root)}:{line}: from {module} import {name}"
        try:
            found = importlib.import_module(module)
        except ImportError as exc:
            missing.append(f"{where}: {exc}")
            continue
        if not hasattr(found, name):
            try:  # a submodule imported by name
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"{where}: {module} has no {name}")
    return missing


def test_the_import_check_catches_a_moved_function(tmp_path: Path) -> None:
    """The two lines of benchmarks/ab.py before and after the fix: a function-level import."""
    moved = tmp_path / "ab.py"
    moved.write_text(
        "def measure_aa():\n"
        "    from stackproof.cli.ab import resolve_side\n"
        "    from stackproof.sides import resolve_side as moved_here\n"
        "    from stackproof import no_such_module\n"
    )
    assert missing_imports(moved, tmp_path) == [
        "ab.py:2: from stackproof.cli.ab import resolve_side: stackproof.cli.ab has no resolve_side",
        "ab.py:4: from stackproof import no_such_module: stackproof has no no_such_module",
    ]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(BENCHMARKS)))
def test_every_benchmark_imports_what_exists(script: Path) -> None:
    assert missing_imports(script) == []


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(BENCHMARKS)))
def test_every_benchmark_parses_its_arguments(script: Path) -> None:
    if "if __name__" not in script.read_text():
        pytest.skip("a module the scripts import, not a script")
    done = subprocess.run(
        [sys.executable, str(script), "--help"], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout, done.stdout[-2000:]


QUICK = [p for p in SCRIPTS if '"--quick"' in p.read_text()]


@pytest.mark.slow  # each starts an interpreter and runs a little of its benchmark: 2-10 s on a loaded host
@pytest.mark.parametrize("script", QUICK, ids=lambda p: str(p.relative_to(BENCHMARKS)))
def test_every_quick_mode_runs(script: Path) -> None:
    """A benchmark with a quick mode runs it to the end here: its measurement code cannot rot either."""
    done = subprocess.run(
        [sys.executable, str(script), "--quick"], cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip(), "a quick mode prints what it measured"


def test_the_benchmarks_of_issue_45_have_quick_modes() -> None:
    names = {str(p.relative_to(BENCHMARKS)) for p in QUICK}
    assert {"ab.py", "ab_looks.py", "client_ceiling.py", "gpu_ab/planted.py", "gpu_ab/client_vs_bench.py"} <= names
