"""`.ci/setup` on the apt layouts a fresh machine may have, against fake apt roots (no root, no apt).

The script is the first thing CI runs; if it dies silently nothing lands (a fresh Debian 12 of
this kind has no /etc/apt/sources.list, only deb822 files). Each branch of its mirror lookup is run
here through `--print-debian-mirror`, which stops before anything is installed.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SETUP = Path(__file__).resolve().parents[2] / ".ci" / "setup"

DEB822 = """\
Types: deb
# a comment between fields, as Debian's cloud images write it
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
"""
ONE_LINE = "deb [arch=amd64 signed-by=/k.gpg] http://old.example/debian/ bookworm main\n"


def _print_mirror(apt_etc: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k != "STACKPROOF_DEBIAN_MIRROR"}
    return subprocess.run(
        ["bash", str(SETUP), "--print-debian-mirror"],
        env={**clean, "STACKPROOF_APT_ETC": str(apt_etc), **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def _apt_root(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "etc-apt"
    (root / "sources.list.d").mkdir(parents=True)
    for name, text in files.items():
        (root / name).write_text(text)
    return root


def test_the_script_parses() -> None:
    assert subprocess.run(["bash", "-n", str(SETUP)], capture_output=True, timeout=30).returncode == 0


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"sources.list.d/debian.sources": DEB822}, "http://mirror.example/debian"),  # deb822 only, no sources.list
        ({"sources.list": ONE_LINE}, "http://old.example/debian"),  # one-line format only
        ({"sources.list.d/extra.list": ONE_LINE}, "http://old.example/debian"),  # a .list file in the folder
        ({"sources.list.d/debian.sources": DEB822, "sources.list": ONE_LINE}, "http://mirror.example/debian"),
    ],
    ids=["deb822-only", "sources-list-only", "dot-list-only", "both"],
)
def test_the_mirror_is_found_in_either_format(tmp_path: Path, files: dict[str, str], expected: str) -> None:
    result = _print_mirror(_apt_root(tmp_path, files))
    assert (result.returncode, result.stdout.strip()) == (0, expected), result.stderr


def test_the_mirror_variable_wins_over_apt(tmp_path: Path) -> None:
    root = _apt_root(tmp_path, {"sources.list.d/debian.sources": DEB822})
    result = _print_mirror(root, STACKPROOF_DEBIAN_MIRROR="http://site.example/debian")
    assert (result.returncode, result.stdout.strip()) == (0, "http://site.example/debian")


@pytest.mark.parametrize(
    "files",
    [{}, {"sources.list.d/nodesource.sources": "Types: deb\nURIs: https://deb.nodesource.com/node_20.x\n"}],
    ids=["no-sources-at-all", "no-debian-uri"],
)
def test_no_mirror_is_exit_3_naming_the_variable(tmp_path: Path, files: dict[str, str]) -> None:
    result = _print_mirror(_apt_root(tmp_path, files))
    assert result.returncode == 3
    assert "STACKPROOF_DEBIAN_MIRROR" in result.stderr
    assert "find the Debian mirror" in result.stderr
    assert result.stdout == ""
