"""A test's child starts in a known state, whatever state the suite itself was launched in.

A non-interactive shell starts a background job (`.ci/run &`, nohup, some CI runners) with SIGINT
and SIGQUIT ignored, and an ignored signal stays ignored across exec: Python then installs no
KeyboardInterrupt handler, so a test that interrupts the tool saw it run to the end (exit 0, not
130). `launched` puts a small exec wrapper in front of a child's argv that sets the dispositions a
test relies on (SIGINT, SIGTERM, SIGQUIT, SIGHUP default; no signal blocked) and the umask files are
written under, then execs the child itself (same pid: a signal sent to the child reaches it). Give
the child `stdin=subprocess.DEVNULL` too: a suite started with its stdin closed must not hand the
child a closed descriptor 0.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["LAUNCHER", "launched"]

UMASK = 0o022
LAUNCHER = (
    "import os, signal, sys\n"
    "for name in ('SIGINT', 'SIGTERM', 'SIGQUIT', 'SIGHUP'):\n"
    "    signal.signal(getattr(signal, name), signal.SIG_DFL)\n"
    "signal.pthread_sigmask(signal.SIG_SETMASK, [])\n"
    f"os.umask({UMASK:#o})\n"
    "os.execvp(sys.argv[1], sys.argv[1:])\n"
)


def launched(argv: Sequence[str]) -> list[str]:
    """`argv`, run with the signal dispositions and umask a test expects (see the module's text)."""
    return [sys.executable, "-c", LAUNCHER, *argv]
