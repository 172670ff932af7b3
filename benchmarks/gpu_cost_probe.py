"""The NVML cost sampler and the spin rule's inputs on a real GPU: idle, a bf16 matmul load, a spin.

Runs where a GPU, torch, nvidia-ml-py (and, for the spin phase, cupy) are installed; no docker.
Three phases, each sampled once a second by `verify.forensics.gpucost.GpuSampler` with this process as the
"server":

1. idle: a CUDA context and nothing running;
2. load: 8192^3 bf16 matmuls back to back (the loaded power the spin rule compares against);
3. spin: one single-thread kernel that busy-waits on %globaltimer for SPIN_S seconds while the
   host is parked in `stream.synchronize()`: the vllm#61007 shape (a kernel resident, nothing
   computing, the Python stack in a CUDA stream sync). With py-spy given (`--py-spy PATH`), the
   host stack is dumped while it waits.

It prints the cost section of the load phase (memory per process, energy per op, utilisation,
power), the spin rule's verdict for each phase against the load, and writes everything as JSON
(`--out`). Baseline to compare with: shared/reference/autotune-on-h200.md and the device notes
(one H200: about 790 TFLOP/s bf16 on random data; SM clock 1980 MHz under matmuls).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verify.forensics.gpucost import GpuSample, GpuSampler, NvmlReader, SmiReader, cost_section
from verify.forensics.spin import DeviceWindow, judge_spin

N = 8192
SPIN_KERNEL = r"""
extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < ns);
}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--load-s", type=float, default=20.0)
    parser.add_argument("--spin-s", type=float, default=15.0)
    parser.add_argument("--py-spy", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    import pynvml
    import torch

    pynvml.nvmlInit()
    torch.cuda.init()
    device = torch.device("cuda:0")
    a = torch.randn(N, N, device=device, dtype=torch.bfloat16)
    b = torch.randn(N, N, device=device, dtype=torch.bfloat16)
    torch.cuda.synchronize()
    pid = os.getpid()
    sampler = GpuSampler(reader=NvmlReader(pynvml), pids=lambda: {pid}, interval_s=1.0, pids_every_s=1e9).start()
    phases: dict[str, tuple[float, float]] = {}
    report: dict[str, Any] = {"pid": pid, "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}

    t0 = time.monotonic()
    time.sleep(args.idle_s)
    phases["idle"] = (t0, time.monotonic())

    t0 = time.monotonic()
    matmuls = 0
    while time.monotonic() - t0 < args.load_s:
        for _ in range(50):
            torch.matmul(a, b)
        torch.cuda.synchronize()
        matmuls += 50
    phases["load"] = (t0, time.monotonic())
    smi = _smi_once()
    report["matmuls"] = matmuls
    report["tflop_s"] = round(matmuls * 2 * N**3 / (phases["load"][1] - phases["load"][0]) / 1e12, 1)

    report["spin"] = _spin(args.spin_s, args.py_spy, phases)
    samples = sampler.stop()
    pynvml.nvmlShutdown()

    report["phases"] = {}
    load_samples = _between(samples, *phases["load"])
    loaded_power = _powers(load_samples)
    for name, (start, end) in phases.items():
        window = _between(samples, start + 1.0, end)  # the first second straddles the phase change
        cost = cost_section(window, source="nvml", output_tokens=0, seconds=end - start)
        spin = judge_spin(
            {
                0: DeviceWindow(
                    loaded_power_w=loaded_power,
                    window_util_percent=[
                        d.util_percent for s in window for d in s.devices if d.util_percent is not None
                    ],
                    window_power_w=_powers(window),
                )
            }
        )
        report["phases"][name] = {"seconds": round(end - start, 1), "cost": cost, "spin_rule": spin.to_json()}
    load_cost = report["phases"]["load"]["cost"]
    flops = matmuls * 2 * N**3
    if load_cost["energy_j"]["value"] is not None:
        joules = load_cost["energy_j"]["value"]
        report["energy_per_tflop_j"] = round(joules / (flops / 1e12), 4)
        report["energy_per_matmul_j"] = round(joules / matmuls, 4)
    report["nvidia_smi_during_load"] = smi
    report["samples"] = [s.to_json() for s in samples]
    _print(report)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


def _spin(seconds: float, py_spy: Path | None, phases: dict[str, tuple[float, float]]) -> dict[str, Any]:
    try:
        import cupy
    except ImportError as exc:
        return {"skipped": f"cupy: {exc}"}
    kernel = cupy.RawKernel(SPIN_KERNEL, "spin")
    stream = cupy.cuda.Stream(non_blocking=True)
    result: dict[str, Any] = {}
    t0 = time.monotonic()
    with stream:
        kernel((1,), (1,), (cupy.uint64(int(seconds * 1e9)),))
    if py_spy is not None:
        threading.Thread(target=_dump_self, args=(py_spy, result, seconds / 2), daemon=True).start()
    stream.synchronize()  # parked here, as the wedged engine was
    phases["spin"] = (t0, time.monotonic())
    result["host_wait_s"] = round(phases["spin"][1] - t0, 2)
    return result


def _dump_self(py_spy: Path, result: dict[str, Any], after: float) -> None:
    time.sleep(after)
    argv = [str(py_spy.resolve()), "dump", "--pid", str(os.getpid())]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    result["py_spy_rc"] = done.returncode
    result["py_spy"] = (done.stdout + done.stderr)[-4000:]


def _smi_once() -> Any:
    try:
        return [asdict_like(d) for d in SmiReader("nvidia-smi").read({os.getpid()})]
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def asdict_like(d: Any) -> dict[str, Any]:
    return {k: getattr(d, k) for k in ("index", "util_percent", "power_w", "server_memory_bytes", "server_pids")}


def _between(samples: list[GpuSample], start: float, end: float) -> list[GpuSample]:
    return [s for s in samples if start <= s.at <= end]


def _powers(samples: list[GpuSample]) -> list[float]:
    return [d.power_w for s in samples for d in s.devices if d.index == 0 and d.power_w is not None]


def _print(report: dict[str, Any]) -> None:
    print(f"{report['gpu']}, torch {report['torch']}, {report['matmuls']} matmuls at {report['tflop_s']} TFLOP/s")
    for name, phase in report["phases"].items():
        cost, spin = phase["cost"], phase["spin_rule"]
        print(
            f"{name:5s} {phase['seconds']:5.1f}s  util median {cost['util_median_percent']['value']}%  "
            f"power median {cost['power_median_w']['value']} W  energy {cost['energy_j']['value']} J  "
            f"peak memory {cost['peak_memory_bytes']['value']} B  spin rule: {spin['verdict']} ({spin['reason']})"
        )
    per_tflop, per_matmul = report.get("energy_per_tflop_j"), report.get("energy_per_matmul_j")
    print(f"energy per TFLOP {per_tflop} J, per 8192^3 matmul {per_matmul} J")
    print(f"nvidia-smi during load: {report['nvidia_smi_during_load']}")
    spin = report["spin"]
    print(f"spin: host waited {spin.get('host_wait_s')}s in stream.synchronize(); {spin.get('skipped', '')}")
    if "py_spy" in spin:
        print(f"py-spy (rc {spin['py_spy_rc']}):\n{spin['py_spy']}")


if __name__ == "__main__":
    main()
