"""A user-triggered CUDA core dump of a process parked on a spinning kernel: the forensics' recipe, for real.

Run with the environment the stall forensics give an opted-in server (verify/forensics/stall.py
`coredump_env`), pointed at a scratch directory:

    CUDA_ENABLE_USER_TRIGGERED_COREDUMP=1 CUDA_COREDUMP_PIPE=DIR/corepipe.cuda.%p \
    CUDA_COREDUMP_FILE=DIR/core.cuda.%p python3 benchmarks/cuda_coredump_probe.py DIR

It launches one single-thread kernel that busy-waits on %globaltimer, waits in
`stream.synchronize()`, and from a thread writes to every FIFO in DIR (what `RuntimeSide.cuda_coredump`
does in the server container), then waits for the core file to stop growing and, where cuda-gdb is
installed, asks it which kernel was resident (`info cuda kernels`). Needs a GPU and cupy.

Measured on an H200 (driver 580.159.04): the dump is written within a second and the driver then
aborts the process (exit 134), so the JSON report below prints only with `skip_abort` in
CUDA_COREDUMP_GENERATION_FLAGS (and then the synchronize fails: the context is gone); inspect the
core file with cuda-gdb afterwards either way.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

SPIN_KERNEL = r"""
extern "C" __global__ void stackproof_spin(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < ns);
}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scratch", type=Path, help="the directory CUDA_COREDUMP_PIPE and CUDA_COREDUMP_FILE name")
    parser.add_argument("spin_s", type=float, nargs="?", default=25.0, help="how long the kernel spins (s)")
    args = parser.parse_args()
    scratch, spin_s = args.scratch, args.spin_s
    import cupy

    report: dict[str, Any] = {"env": {k: v for k, v in os.environ.items() if k.startswith("CUDA_")}}
    kernel = cupy.RawKernel(SPIN_KERNEL, "stackproof_spin")
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        kernel((1,), (1,), (cupy.uint64(int(spin_s * 1e9)),))
    threading.Thread(target=_trigger, args=(scratch, report), daemon=True).start()
    started = time.monotonic()
    stream.synchronize()
    report["host_wait_s"] = round(time.monotonic() - started, 2)
    report["cores"] = _wait_for_cores(scratch)
    report["cuda_gdb"] = _resident_kernels(scratch)
    print(json.dumps(report, indent=1))


def _trigger(scratch: Path, report: dict[str, Any]) -> None:
    time.sleep(3.0)
    fifos = sorted(p for p in scratch.iterdir() if stat.S_ISFIFO(p.stat().st_mode))
    report["pipes"] = [p.name for p in fifos]
    for fifo in fifos:
        with fifo.open("wb") as pipe:  # blocks until the driver's reader has it open
            pipe.write(b"1")
    report["triggered_at_s"] = 3.0


def _wait_for_cores(scratch: Path, limit_s: float = 90.0) -> dict[str, int]:
    deadline, last = time.monotonic() + limit_s, {}
    while time.monotonic() < deadline:
        now = {p.name: p.stat().st_size for p in scratch.glob("core.cuda.*")}
        if now and now == last:
            return now
        last = now
        time.sleep(2.0)
    return last


def _resident_kernels(scratch: Path) -> str:
    cores = sorted(scratch.glob("core.cuda.*"))
    if not cores:
        return "no core file"
    argv = ["cuda-gdb", "-batch", "-ex", f"target cudacore {cores[0]}", "-ex", "info cuda kernels"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cuda-gdb: {exc}"
    return (done.stdout + done.stderr)[-3000:]


if __name__ == "__main__":
    main()
