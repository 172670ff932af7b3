"""The README stays short, docs/index.md lists every page, and no relative link in the docs is dead.

Links are read as Markdown `[text](target)`; a target with a scheme (https:, mailto:) is not ours to
check. An anchor (`page.md#heading`, `#heading`) must name a heading of its page, slugged the way
GitHub slugs headings (lower case, punctuation dropped, spaces to hyphens).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAYERS = (("stackproof", "commands"), ("verify", "checks"), ("pipeline", "the floor"))
ROOT_ITEMS = (
    ("images/", "cell.Dockerfile.j2, pip-install.sh, recipes/"),
    ("locks/", "hash-locked stacks"),
    ("matrix.yaml", "the cells"),
    ("noxfile.py", "the nox sessions"),
    ("tests/", "unit/ (no docker), integration/ (real dockerd), fixtures/ (real files)"),
    ("benchmarks/", "scripts printing measured numbers"),
    ("docs/", "these pages (index.md)"),
    (".ci/", "setup, run"),
    (".github/workflows/", "ci.yml, verify.yml"),
)
DOCS = REPO / "docs"
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def _prose(text: str) -> list[str]:
    """The lines outside fenced code blocks (a `[x](y)` in a code sample is no link)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def _links(page: Path) -> list[str]:
    return [target for line in _prose(page.read_text()) for target in LINK.findall(line)]


def _slug(heading: str) -> str:
    text = re.sub(r"[`*_]|\[|\]\([^)]*\)", "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(m.group(1)) for line in _prose(page.read_text()) if (m := HEADING.match(line))}


def dead_links(page: Path) -> list[str]:
    """Every relative link of `page` whose file or heading does not exist."""
    dead = []
    for target in _links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists() or (anchor and where.suffix == ".md" and anchor not in _anchors(where)):
            dead.append(target)
    return dead


def unindexed(index: Path) -> list[str]:
    """The docs/*.md pages that `index` does not link."""
    linked = {(index.parent / target.partition("#")[0]).resolve() for target in _links(index)}
    return sorted(p.name for p in index.parent.glob("*.md") if p != index and p.resolve() not in linked)


def test_readme_is_under_200_lines() -> None:
    lines = len((REPO / "README.md").read_text().splitlines())
    assert lines < 200, f"README.md has {lines} lines: move detail into docs/ (docs/index.md lists the pages)"


def test_index_links_every_page() -> None:
    index = DOCS / "index.md"
    assert index.is_file(), "docs/index.md is missing"
    assert unindexed(index) == []


@pytest.mark.parametrize("page", [REPO / "README.md", *sorted(DOCS.glob("*.md"))], ids=lambda p: p.name)
def test_no_dead_relative_link(page: Path) -> None:
    assert dead_links(page) == []


def test_the_checkers_catch_what_they_look_for(tmp_path: Path) -> None:
    """Proven both ways: a dead file link, a dead anchor and an unlisted page are found; live ones pass."""
    (tmp_path / "a.md").write_text("# A page\n\n## Two words\n\n[ok](b.md) [ok](#two-words) [ok](b.md#b)\n")
    (tmp_path / "b.md").write_text("# B\n\n[dead](nope.md) [dead](gone.md#x) [dead](a.md#no-such) [ok](a.md#a-page)\n")
    (tmp_path / "c.md").write_text("# C\n\n```\n[code, not a link](gone.md)\n```\n")
    (tmp_path / "index.md").write_text("[a](a.md)\n[b](b.md)\n")
    assert dead_links(tmp_path / "a.md") == []
    assert dead_links(tmp_path / "b.md") == ["nope.md", "gone.md#x", "a.md#no-such"]
    assert dead_links(tmp_path / "c.md") == []
    assert unindexed(tmp_path / "index.md") == ["c.md"]


def _names(folder: Path) -> list[str]:
    """A package's modules (stems) and data files, as the tree shows them."""
    modules = sorted(p.stem for p in folder.glob("*.py") if p.stem not in ("__init__", "__main__"))
    return modules + sorted(p.name for p in folder.iterdir() if p.suffix in (".yaml", ".jsonl"))


def _wrapped(prefix: str, names: list[str], width: int = 100) -> list[str]:
    lines, line = [], prefix
    for name in names:
        if len(line) + len(name) + 2 > width and line != prefix:
            lines.append(line.rstrip())
            line = prefix
        line += name + ", "
    return [*lines, line.rstrip().rstrip(",")]


def tree_text(repo: Path = REPO) -> str:
    """The picture of the tree in docs/architecture.md: each layer's modules and its subpackages'."""
    out = ["stackproof repository"]
    for name, what in LAYERS:
        top = repo / name
        subs = sorted(p for p in top.iterdir() if (p / "__init__.py").is_file())
        out.append(f"├── {name}/   ({what}; {len(_names(top))} files at the top)")
        out += _wrapped("│   │   ", _names(top))
        for i, sub in enumerate(subs):
            last = i == len(subs) - 1
            out.append(f"│   {'└──' if last else '├──'} {sub.name}/")
            out += _wrapped("│   " + ("    " if last else "│   ") + "    ", _names(sub))
    for i, (name, what) in enumerate(ROOT_ITEMS):
        out.append(f"{'└──' if i == len(ROOT_ITEMS) - 1 else '├──'} {name:<19}{what}")
    return "\n".join(out)


def test_architecture_tree_is_the_tree() -> None:
    """The picture in docs/architecture.md is the tree as it stands (`python tests/unit/test_docs.py`
    prints it: paste it between the markers when a module moves)."""
    text = (DOCS / "architecture.md").read_text()
    picture = text.split("<!-- tree -->\n```\n", 1)[1].split("\n```", 1)[0]
    stale = "docs/architecture.md's tree is stale: paste the output of `python tests/unit/test_docs.py`"
    assert picture == tree_text(), stale


if __name__ == "__main__":
    sys.stdout.write(tree_text() + "\n")
