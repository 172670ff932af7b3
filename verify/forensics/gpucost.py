"""What a load run costs on the GPU: memory, energy, throughput per GPU, GPU-seconds.

`GpuSampler` reads every GPU once a second on the host, beside the load: utilisation, power, the
driver's total-energy counter (`nvmlDeviceGetTotalEnergyConsumption`, millijoules since the driver
loaded) and the memory NVML attributes to each of the server's processes. The server runs in a
container, NVML names host PIDs, so the server's processes are the container's as `docker top`
lists them (refreshed every few seconds: vLLM starts its workers after the API process). Without
nvidia-ml-py or without a driver it falls back to `nvidia-smi --query-compute-apps` (memory only,
plus utilisation and power from `--query-gpu`), and with neither every field says why it is empty.

`cost_section` is the arithmetic, pure: the receipt's `load.cost`, every field a value with its
unit or a reason. Energy is the whole device's (NVML has no per-process energy): on a GPU the
server shares, it is an upper bound, and the section says so.
"""

from __future__ import annotations

import shutil
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from pipeline import cmd

__all__ = [
    "DeviceSample",
    "GpuReader",
    "GpuSample",
    "GpuSampler",
    "NvmlReader",
    "SmiReader",
    "cost_section",
    "empty_cost_section",
    "open_reader",
]

COST_FIELDS = (
    "peak_memory_bytes",
    "energy_j",
    "energy_per_output_token_j",
    "output_tok_s_per_gpu",
    "gpu_seconds",
    "util_median_percent",
    "power_median_w",
)
_UNITS = {
    "peak_memory_bytes": "bytes",
    "energy_j": "J",
    "energy_per_output_token_j": "J/token",
    "output_tok_s_per_gpu": "tokens/s/GPU",
    "gpu_seconds": "GPU-s",
    "util_median_percent": "%",
    "power_median_w": "W",
}


@dataclass(frozen=True, kw_only=True)
class DeviceSample:
    index: int
    util_percent: float | None
    power_w: float | None
    energy_mj: int | None  # the driver's counter since it loaded; None: not supported here
    server_memory_bytes: int | None  # NVML's usedGpuMemory summed over the server's processes
    server_pids: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class GpuSample:
    at: float  # time.monotonic()
    devices: tuple[DeviceSample, ...]

    def to_json(self) -> dict[str, Any]:
        return {"t": round(self.at, 3), "devices": [asdict(d) for d in self.devices]}


class GpuReader(Protocol):
    source: str

    def read(self, pids: set[int]) -> tuple[DeviceSample, ...]: ...

    def close(self) -> None: ...


# -- readers (the edge: NVML, nvidia-smi) ---------------------------------------------------------


class NvmlReader:
    """NVML through nvidia-ml-py, initialised once for the sampler's life."""

    source = "nvml"

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]

    def read(self, pids: set[int]) -> tuple[DeviceSample, ...]:
        return tuple(self._device(i, h, pids) for i, h in enumerate(self.handles))

    def _device(self, index: int, handle: Any, pids: set[int]) -> DeviceSample:
        nvml = self.nvml
        util = _maybe(lambda: float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu))
        power = _maybe(lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)
        energy = _maybe(lambda: int(nvml.nvmlDeviceGetTotalEnergyConsumption(handle)))
        processes = _maybe(lambda: list(nvml.nvmlDeviceGetComputeRunningProcesses(handle)))
        memory: int | None = None
        mine: list[int] = []
        if processes is not None:
            memory = 0
            for process in processes:
                if process.pid in pids:
                    mine.append(int(process.pid))
                    memory += int(process.usedGpuMemory or 0)  # None where the driver cannot say (some vGPUs)
        return DeviceSample(
            index=index,
            util_percent=util,
            power_w=power,
            energy_mj=energy,
            server_memory_bytes=memory,
            server_pids=tuple(sorted(mine)),
        )

    def close(self) -> None:
        _maybe(self.nvml.nvmlShutdown)


class SmiReader:
    """nvidia-smi's CSV queries: per-process memory, utilisation and power; no energy counter."""

    source = "nvidia-smi"

    def __init__(self, path: str) -> None:
        self.path = path

    def read(self, pids: set[int]) -> tuple[DeviceSample, ...]:
        gpus = self._query("--query-gpu=index,uuid,utilization.gpu,power.draw")
        apps = self._query("--query-compute-apps=gpu_uuid,pid,used_memory")
        samples = []
        for row in gpus:
            if len(row) < 4:
                continue
            memory, mine = 0, []
            for app in apps:
                if len(app) >= 3 and app[0] == row[1] and app[1].isdigit() and int(app[1]) in pids:
                    mine.append(int(app[1]))
                    memory += int(_number(app[2]) or 0) * 1024 * 1024  # MiB (nounits)
            samples.append(
                DeviceSample(
                    index=int(row[0]),
                    util_percent=_number(row[2]),
                    power_w=_number(row[3]),
                    energy_mj=None,
                    server_memory_bytes=memory,
                    server_pids=tuple(sorted(mine)),
                )
            )
        return tuple(samples)

    def _query(self, what: str) -> list[list[str]]:
        result = cmd.run([self.path, what, "--format=csv,noheader,nounits"], check=False, quiet=True, timeout=15)
        if result.returncode != 0:
            return []
        return [[cell.strip() for cell in line.split(",")] for line in result.stdout.splitlines() if line.strip()]

    def close(self) -> None:
        pass


def open_reader() -> GpuReader | str:
    """NVML when nvidia-ml-py and a driver are there, else nvidia-smi, else why neither."""
    try:
        import pynvml  # nvidia-ml-py: imported here so that hosts without it still import this module
    except ImportError:
        nvml_reason = "nvidia-ml-py (pynvml) is not installed"
    else:
        try:
            pynvml.nvmlInit()
            return NvmlReader(pynvml)
        except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded...: no usable driver
            nvml_reason = f"NVML did not initialise: {exc}"
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return f"{nvml_reason}, and nvidia-smi is not on PATH"
    return SmiReader(smi)


def _maybe(read: Callable[[], Any]) -> Any:
    """A reading, or None where this GPU or driver does not support it (NVMLError_NotSupported...)."""
    try:
        return read()
    except Exception:
        return None


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


# -- the sampler ------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class GpuSampler:
    """Samples `reader` every `interval_s` on a thread until `stop()`; `pids()` says which host
    processes are the server's (asked every `pids_every_s`, since it costs a `docker top`)."""

    reader: GpuReader
    pids: Callable[[], Iterable[int]]
    interval_s: float = 1.0
    pids_every_s: float = 5.0
    clock: Callable[[], float] = time.monotonic
    samples: list[GpuSample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> GpuSampler:
        self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[GpuSample]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.reader.close()
        return self.snapshot()

    def snapshot(self, since: float | None = None) -> list[GpuSample]:
        with self._lock:
            return [s for s in self.samples if since is None or s.at >= since]

    def sample_once(self, pids: set[int]) -> None:
        try:
            devices = self.reader.read(pids)
        except Exception as exc:  # one failed read is a gap, never the end of the run
            self.errors.append(f"{type(exc).__name__}: {exc}"[:300])
            return
        with self._lock:
            self.samples.append(GpuSample(at=self.clock(), devices=devices))

    def _run(self) -> None:
        pids: set[int] = set()
        pids_at = -1e9
        while not self._stop.is_set():
            now = self.clock()
            if now - pids_at >= self.pids_every_s:
                try:
                    pids = set(self.pids())
                except Exception as exc:  # a container gone between two reads: keep the last list
                    self.errors.append(f"pids: {type(exc).__name__}: {exc}"[:300])
                pids_at = now
            self.sample_once(pids)
            self._stop.wait(self.interval_s)


# -- the arithmetic (pure) -------------------------------------------------------------------------


def _field(value: float | int | None, name: str, reason: str | None = None) -> dict[str, Any]:
    if value is None:
        return {"value": None, "unit": _UNITS[name], "reason": reason or "not measured"}
    return {"value": round(value, 6) if isinstance(value, float) else value, "unit": _UNITS[name]}


def empty_cost_section(reason: str, *, source: str | None = None) -> dict[str, Any]:
    """Every cost field present and empty, each saying why (a CPU cell, no NVML, no samples)."""
    return {
        "source": source,
        "reason": reason,
        "gpus": [],
        **{name: _field(None, name, reason) for name in COST_FIELDS},
        "samples": 0,
    }


def cost_section(samples: Sequence[GpuSample], *, source: str, output_tokens: int, seconds: float) -> dict[str, Any]:
    """The load's cost from the samples taken over it (see the module docstring)."""
    if not samples:
        return empty_cost_section(f"{source}: no GPU sample was taken during the load", source=source)
    used = sorted({d.index for s in samples for d in s.devices if d.server_pids})
    note = None
    if not used:  # the server's processes never showed (a driver that hides PIDs in containers)
        used = sorted({d.index for s in samples for d in s.devices})
        note = f"{source} listed no process of the server on any GPU: every GPU counted"
    gpus = len(used)
    per_device = [[d for d in s.devices if d.index in used] for s in samples]

    peaks = [sum(d.server_memory_bytes or 0 for d in devices) for devices in per_device]
    memory_known = any(d.server_memory_bytes is not None for devices in per_device for d in devices)
    peak = max(peaks) if memory_known and max(peaks) > 0 else None
    peak_reason = (
        f"{source} reports no memory per process here" if not memory_known else "no memory was attributed to the server"
    )

    energy_j, energy_reason = _energy(samples, used, source)
    per_token = energy_j / output_tokens if energy_j is not None and output_tokens > 0 else None
    per_token_reason = energy_reason if energy_j is None else "no output tokens were generated"
    utils = [d.util_percent for devices in per_device for d in devices if d.util_percent is not None]
    powers = [d.power_w for devices in per_device for d in devices if d.power_w is not None]
    rate = output_tokens / seconds / gpus if seconds > 0 else None
    return {
        "source": source,
        "reason": note,
        "gpus": used,
        "peak_memory_bytes": _field(peak, "peak_memory_bytes", peak_reason),
        "energy_j": _field(energy_j, "energy_j", energy_reason),
        "energy_per_output_token_j": _field(per_token, "energy_per_output_token_j", per_token_reason),
        "output_tok_s_per_gpu": _field(rate, "output_tok_s_per_gpu", "the load took no time"),
        "gpu_seconds": _field(seconds * gpus, "gpu_seconds"),
        "util_median_percent": _field(
            statistics.median(utils) if utils else None, "util_median_percent", f"{source} gave no utilisation"
        ),
        "power_median_w": _field(
            statistics.median(powers) if powers else None, "power_median_w", f"{source} gave no power reading"
        ),
        "samples": len(samples),
        "energy_scope": "whole device (NVML has no per-process energy): an upper bound where the GPU is shared",
    }


def _energy(samples: Sequence[GpuSample], used: list[int], source: str) -> tuple[float | None, str | None]:
    """Joules over the samples: the counter's last reading minus its first, summed over the GPUs."""
    total = 0.0
    for index in used:
        readings = [d.energy_mj for s in samples for d in s.devices if d.index == index and d.energy_mj is not None]
        if len(readings) < 2:
            why = "needs two readings" if readings else "is not supported by this GPU or driver"
            return None, f"{source}: the total-energy counter {why}"
        if readings[-1] < readings[0]:
            return None, f"{source}: the total-energy counter went backwards (the driver reloaded)"
        total += (readings[-1] - readings[0]) / 1000.0
    return total, None
