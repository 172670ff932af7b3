"""The report in a real browser: Debian's headless Chromium loads the index and a cell page.

Proves, on the site rendered from the real cpu-tiny receipts: no console message (an uncaught error
or a console.error would be one), the inline filter script ran (it un-hides the filter form), the
receipt's numbers are in the DOM, and every local link and image resolves. The checker itself is
proven on a page that throws. Screenshots go to $STACKPROOF_SCREENSHOTS when set (docs/ holds
the ones docs/report.md shows), else to the test's tmp dir.

Chromium comes from `.ci/setup` (Debian's `chromium`); without it this file skips, except in CI.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from stackproof.cli import main
from tests.conftest import in_ci

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
CONSOLE = re.compile(r":CONSOLE(?:\(\d+\))?:\d*\] (.*)")


def _browser() -> str:
    found = next((path for name in BROWSERS if (path := shutil.which(name))), None)
    if found is None:
        if in_ci():
            pytest.fail("no chromium: `bash .ci/setup` installs Debian's chromium for the report's browser test")
        pytest.skip("no chromium here (apt-get install chromium)")
    return found


def chromium_argv(browser: str, euid: int) -> list[str]:
    """Headless Chromium; as root it must run without its sandbox (it refuses to start otherwise),
    as an ordinary user it keeps it."""
    argv = [browser, "--headless=new", "--disable-gpu", "--hide-scrollbars", "--enable-logging=stderr", "--v=0"]
    return [*argv, "--no-sandbox"] if euid == 0 else argv


def load(browser: str, url: str, *, screenshot: Path | None = None, size: str = "1400,1000") -> tuple[str, list[str]]:
    """(the DOM after load, the console messages) of one page."""
    argv = chromium_argv(browser, os.geteuid())
    dom = subprocess.run([*argv, "--dump-dom", url], capture_output=True, text=True, timeout=60)
    if dom.returncode != 0 and "No usable sandbox" in dom.stderr:
        # Some runners (Ubuntu 24.04's AppArmor rule on user namespaces) forbid the sandbox to ordinary
        # users too; these pages are our own static files, so run without it there.
        argv = chromium_argv(browser, 0)
        dom = subprocess.run([*argv, "--dump-dom", url], capture_output=True, text=True, timeout=60)
    assert dom.returncode == 0, dom.stderr[-2000:]
    messages = [m.group(1) for line in dom.stderr.splitlines() if (m := CONSOLE.search(line))]
    if screenshot is not None:
        shot = subprocess.run(
            [*argv, f"--screenshot={screenshot}", f"--window-size={size}", url], capture_output=True, timeout=60
        )
        assert shot.returncode == 0 and screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return dom.stdout, messages


def test_chromium_runs_without_sandbox_only_as_root() -> None:
    assert "--no-sandbox" in chromium_argv("chromium", 0)
    assert "--no-sandbox" not in chromium_argv("chromium", 1000)


def test_the_console_check_sees_an_uncaught_error(tmp_path: Path) -> None:
    browser = _browser()
    page = tmp_path / "throws.html"
    page.write_text("<!doctype html><title>t</title><p>x</p><script>null.boom()</script>")
    _, messages = load(browser, page.as_uri())
    assert any("Uncaught TypeError" in m for m in messages), messages
    quiet = tmp_path / "quiet.html"
    quiet.write_text("<!doctype html><title>t</title><p>x</p><script>document.title = 'ok'</script>")
    assert load(browser, quiet.as_uri())[1] == []


@pytest.mark.slow
def test_index_and_cell_page_load_clean_and_show_the_receipts_numbers(tmp_path: Path) -> None:
    browser = _browser()
    site = tmp_path / "site"
    receipts = FIXTURES / "receipts"
    started = time.perf_counter()
    args = ["report", "--matrix", str(REPO / "matrix.yaml"), "--receipts", str(receipts), "--out", str(site)]
    assert main([*args, "--fixtures", str(FIXTURES)]) == 0
    shots = Path(os.environ.get("STACKPROOF_SCREENSHOTS") or tmp_path)
    index, index_console = load(browser, (site / "index.html").as_uri(), screenshot=shots / "report-index.png")
    cell, cell_console = load(
        browser, (site / "cells/cpu-tiny.html").as_uri(), screenshot=shots / "report-cell.png", size="1400,3000"
    )
    assert index_console == [] and cell_console == []
    # The receipt's numbers (tests/fixtures/receipts/cpu-tiny-pass: 1512.621 tok/s, TTFT p50 71.155 ms).
    assert "1,512.6 tok/s" in index and "TTFT p50 71.2 ms" in index and "2026-12-01" in index
    assert "not verified" in index  # the matrix's GPU cells: no receipt, no square filled
    assert re.search(r'<form id="filters"(?![^>]*hidden)', index)  # the filter script ran
    for number in ("1,512.621", "71.155", "408.660", "0.505"):  # tok/s, TTFT p50 and p99, TPOT p50
        assert number in cell
    assert cell.count("<svg") == 2 and "Engine progress" in cell  # one receipt: its numbers, no one-bar chart
    for page, dom in ((site / "index.html", index), (site / "cells/cpu-tiny.html", cell)):
        for link in re.findall(r'(?:href|src)="([^"#:]+)(?:#[^"]*)?"', dom):
            assert (page.parent / link).is_file(), f"{page.name}: {link} does not resolve"
    print(f"report + browser: {time.perf_counter() - started:.1f}s")
