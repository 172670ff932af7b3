"""The host's kernel log, where this user may read it: where NVRM Xid lines appear.

`journalctl -k` is tried first (it can be limited to the run's time span), then `dmesg` (the whole
ring buffer). Containers and unprivileged users often may read neither; that is reported, not
treated as a clean log.
"""

from __future__ import annotations

from pipeline import cmd
from pipeline.errors import InfraError

__all__ = ["read_kernel_log"]


def read_kernel_log(since_epoch: float) -> tuple[bytes | None, str]:
    """(log bytes or None, where they came from or why there are none)."""
    attempts = [
        (["journalctl", "-k", "--no-pager", "-o", "short-iso", "--since", f"@{int(since_epoch)}"], "journalctl -k"),
        (["dmesg", "--time-format", "iso"], "dmesg (the whole ring buffer, not limited to this run)"),
    ]
    reasons = []
    for argv, source in attempts:
        try:
            result = cmd.run(argv, check=False, quiet=True, timeout=30)
        except InfraError as exc:
            reasons.append(str(exc).splitlines()[0])
            continue
        text = result.stdout
        if result.returncode == 0 and "No journal files" not in result.stderr and "-- No entries --" not in text:
            return text.encode(), source
        reasons.append(f"{argv[0]}: {(result.stderr or text).strip().splitlines()[-1:] or ['no entries']}")
    return None, "kernel log not readable: " + "; ".join(reasons)
