"""tests/launch.py: a test's child gets default signal dispositions even when the suite was started
with SIGINT ignored (a background job of a non-interactive shell), proven both ways."""

from __future__ import annotations

import subprocess
import sys

from tests.launch import launched

# What a child reports: its SIGINT handler and its umask.
REPORT = (
    "import os, signal\n"
    "handler = signal.getsignal(signal.SIGINT)\n"
    "names = {signal.SIG_IGN: 'ignored', signal.SIG_DFL: 'default', signal.default_int_handler: 'KeyboardInterrupt'}\n"
    "print(names.get(handler, repr(handler)), oct(os.umask(0)))\n"
)


def _child_of_a_suite_ignoring_sigint(through_launcher: bool) -> str:
    """Start a 'suite' process with SIGINT ignored and umask 077 (as `cmd &` in a script would), which
    starts the child (through the launcher or not) and prints what the child reports."""
    child = [sys.executable, "-c", REPORT]
    argv = launched(child) if through_launcher else child
    suite = (
        "import os, signal, subprocess, sys\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "os.umask(0o077)\n"
        f"sys.exit(subprocess.run({argv!r}, stdin=subprocess.DEVNULL).returncode)\n"
    )
    done = subprocess.run([sys.executable, "-c", suite], capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip()


def test_without_the_launcher_the_child_inherits_an_ignored_sigint() -> None:
    assert _child_of_a_suite_ignoring_sigint(False) == "ignored 0o77"


def test_through_the_launcher_the_child_gets_keyboard_interrupt_and_umask_022() -> None:
    assert _child_of_a_suite_ignoring_sigint(True) == "KeyboardInterrupt 0o22"
