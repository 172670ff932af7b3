"""What the GPU did while the engine was stalled: the spin rule, pure.

An engine wedged on the GPU (vllm-project/vllm#61007, as issue 18 quotes it: API alive, token
counters flat, GPU utilisation high but power low, the Python stack parked in a CUDA stream sync,
one cuDNN kernel resident in a CUDA core dump) looks busy to `nvidia-smi`: NVML's utilisation is
"a kernel was resident during the sample period", not "work progressed". Power tells them apart.
Reports of the same shape: eugr/spark-vllm-docker#260 ("96%-util / 22W": healthy generation
averages ~45 W, a deadlocked engine sits at idle wattage, 16-27 W, while still reporting ~95%
util) and AEON-7/Qwen3.6-27B-AEON-Ultimate-Uncensored-DFlash#10 (96% utilisation, 13 W, 0
generation throughput). The rule: over the stall window, median utilisation at least
`util_high_percent` and median power at most `power_ratio_max` of the median power of the same
GPU under the load before the stall. Both numbers are taken from those reports (about half the
loaded power) and are parameters, not constants of nature.

`judge_spin` names one `GpuStallVerdict` per stall, with the numbers per GPU as evidence.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

__all__ = ["DeviceWindow", "GpuStallVerdict", "SpinJudgement", "SpinRule", "judge_spin"]


class GpuStallVerdict(StrEnum):
    GPU_SPIN = "GPU_SPIN"  # utilisation high, power far below the loaded median: resident, not computing
    GPU_BUSY = "GPU_BUSY"  # utilisation high, power near the loaded level: still computing (a long kernel)
    GPU_IDLE = "GPU_IDLE"  # utilisation low: nothing resident, the engine waits on the host side
    NOT_MEASURED = "NOT_MEASURED"  # no GPU, no NVML, or too few samples: the evidence says which


@dataclass(frozen=True, kw_only=True)
class SpinRule:
    util_high_percent: float = 80.0
    power_ratio_max: float = 0.5
    min_window_samples: int = 3  # one-second samples: a stall window shorter than this proves nothing
    min_loaded_samples: int = 3


@dataclass(frozen=True, kw_only=True)
class DeviceWindow:
    """One GPU's readings: under the load before the stall, and over the stall window."""

    loaded_power_w: Sequence[float]
    window_util_percent: Sequence[float]
    window_power_w: Sequence[float]


@dataclass(frozen=True, kw_only=True)
class SpinJudgement:
    verdict: GpuStallVerdict
    reason: str
    devices: dict[int, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"verdict": str(self.verdict), "reason": self.reason, "devices": self.devices}


def judge_spin(devices: Mapping[int, DeviceWindow], rule: SpinRule | None = None) -> SpinJudgement:
    """GPU_SPIN if any GPU spins, else GPU_BUSY if any computes, else GPU_IDLE; NOT_MEASURED when
    no GPU has enough readings."""
    rule = rule or SpinRule()
    verdicts: dict[int, GpuStallVerdict] = {}
    evidence: dict[int, dict[str, Any]] = {}
    for index, window in sorted(devices.items()):
        verdicts[index], evidence[index] = _judge_device(window, rule)
    measured = {i: v for i, v in verdicts.items() if v is not GpuStallVerdict.NOT_MEASURED}
    rule_text = f"utilisation >= {rule.util_high_percent:g}% and power <= {rule.power_ratio_max:g} x the loaded median"
    if not measured:
        why = "no GPU was sampled" if not devices else "too few readings in the stall window or under load"
        return SpinJudgement(verdict=GpuStallVerdict.NOT_MEASURED, reason=why, devices=evidence)
    for verdict, text in (
        (GpuStallVerdict.GPU_SPIN, f"GPU {{}} spins: {rule_text} over the stall window"),
        (GpuStallVerdict.GPU_BUSY, "GPU {} computes: utilisation high and power near the loaded level"),
    ):
        hit = [i for i, v in measured.items() if v is verdict]
        if hit:
            return SpinJudgement(verdict=verdict, reason=text.format(", ".join(map(str, hit))), devices=evidence)
    return SpinJudgement(
        verdict=GpuStallVerdict.GPU_IDLE,
        reason=(
            f"utilisation below {rule.util_high_percent:g}% on every GPU: nothing resident, "
            "the engine waits on the host"
        ),
        devices=evidence,
    )


def _judge_device(window: DeviceWindow, rule: SpinRule) -> tuple[GpuStallVerdict, dict[str, Any]]:
    shortest = min(len(window.window_util_percent), len(window.window_power_w))
    if shortest < rule.min_window_samples:
        return GpuStallVerdict.NOT_MEASURED, {"window_samples": len(window.window_util_percent)}
    util = statistics.median(window.window_util_percent)
    power = statistics.median(window.window_power_w)
    evidence: dict[str, Any] = {
        "window_samples": len(window.window_util_percent),
        "window_util_median_percent": round(util, 1),
        "window_power_median_w": round(power, 1),
        "loaded_samples": len(window.loaded_power_w),
    }
    if util < rule.util_high_percent:
        return GpuStallVerdict.GPU_IDLE, evidence
    if len(window.loaded_power_w) < rule.min_loaded_samples:
        evidence["why"] = "no loaded power to compare with"
        return GpuStallVerdict.NOT_MEASURED, evidence
    loaded = statistics.median(window.loaded_power_w)
    evidence["loaded_power_median_w"] = round(loaded, 1)
    evidence["power_ratio"] = round(power / loaded, 3) if loaded > 0 else None
    if loaded > 0 and power <= rule.power_ratio_max * loaded:
        return GpuStallVerdict.GPU_SPIN, evidence
    return GpuStallVerdict.GPU_BUSY, evidence
