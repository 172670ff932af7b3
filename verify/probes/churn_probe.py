"""stackproof's allocator-churn probe: device allocations per GEMM call, over M buckets. Stdlib + torch.

The question (flashinfer-ai/flashinfer#4549): does a GEMM allocate device memory on *every* call?
FlashInfer 0.6.x hands `mm_fp4(backend="cutlass")` a shared 32 MiB workspace
(`_get_cache_buf("mm_fp4_workspace", DEFAULT_WORKSPACE_SIZE, ...)`, flashinfer/gemm/gemm_base.py:6329
at 0.6.14, DEFAULT_WORKSPACE_SIZE = 32 MiB at :109); on SM120 the CUTLASS kernel needs 34 MiB for
M = 1..256, takes its fallback branch and allocates a private workspace per call, through the
tensor allocator, so torch's caching allocator sees it (the issue's fix, #4550, measured it with
the torch allocator's peak). Autotune winners do not show this; these counters do.

For each GEMM (torch.mm bf16 always; flashinfer.bmm_fp8 where FlashInfer imports and the device has
FP8, SM89+; flashinfer.mm_fp4 where it has FP4, SM100/SM120) and each M, after warm-up calls (JIT,
autotune, first-use workspaces), it reads `torch.cuda.memory_stats()` around each measured call and
records the raw deltas; the verdict is judged elsewhere (verify/kernels/churn.py), purely, from them. A
GEMM the device cannot run is reported as unavailable with the reason, never left out silently.

    python churn_probe.py --out DIR [--n 4096 --k 4096] [--m 1,2,4,...] [--calls 8] [--warmup 3]

Writes DIR/churn-probe.json. Exit 3 with a message when torch or a CUDA device is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

CHURN_SCHEMA = 1
DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 1024, 2048, 4096, 8192)
# The counters read around each call (torch.cuda.memory_stats keys); deltas are what a verdict needs:
# allocated - current = what was allocated and given back inside the call (the transient part).
STAT_KEYS = (
    "allocation.all.allocated",
    "allocation.all.current",
    "allocated_bytes.all.allocated",
    "allocated_bytes.all.current",
    "segment.all.allocated",  # cudaMalloc calls: the caching allocator had to grow
)
FP4_MAJORS = (10, 12)  # SM100/SM103 (datacenter Blackwell) and SM120/SM121: where FP4 tensor cores exist
MM_FP4_BACKENDS = ("cutlass", "cudnn", "auto")
BMM_FP8_BACKENDS = ("cublas", "cutlass", "auto")


class NoCuda(Exception):
    """torch or a CUDA device is missing: nothing can be measured here."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="stackproof allocator-churn probe (stdlib + torch)")
    parser.add_argument("--out", required=True, help="directory for churn-probe.json")
    parser.add_argument("--n", type=int, default=4096, help="GEMM N (output features)")
    parser.add_argument("--k", type=int, default=4096, help="GEMM K (input features)")
    parser.add_argument("--m", default=",".join(map(str, DEFAULT_BUCKETS)), help="M buckets, comma-separated")
    parser.add_argument("--calls", type=int, default=8, help="measured calls per GEMM and M")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured calls first (JIT, tuning, caches)")
    args = parser.parse_args(argv)
    try:
        buckets = tuple(int(m) for m in args.m.split(",") if m.strip())
    except ValueError:
        print(f"churn probe: --m {args.m!r}: not a comma-separated list of integers", file=sys.stderr)
        return 2
    try:
        document = measure(n=args.n, k=args.k, buckets=buckets, calls=args.calls, warmup=args.warmup)
    except NoCuda as exc:
        print(f"churn probe: {exc}", file=sys.stderr)
        return 3
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "churn-probe.json")
    with open(path, "w") as f:
        json.dump(document, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"churn probe: wrote {path}", file=sys.stderr)
    return 0


def load_torch() -> Any:
    """torch with a CUDA device, or NoCuda saying what is missing."""
    try:
        import torch
    except ImportError as exc:
        raise NoCuda(f"torch does not import ({exc}): run this with a Python that has torch with CUDA") from exc
    if not torch.cuda.is_available():
        raise NoCuda(
            f"no CUDA device (torch {torch.__version__}, built for CUDA {torch.version.cuda}): "
            "run this on a GPU machine, with its driver loaded"
        )
    return torch


def measure(*, n: int, k: int, buckets: tuple[int, ...], calls: int, warmup: int) -> dict[str, Any]:
    torch = load_torch()
    device = torch.device("cuda")
    major, minor = torch.cuda.get_device_capability(device)
    arch = f"sm{major}{minor}"
    flashinfer, fi_error = _flashinfer()
    document: dict[str, Any] = {
        "probe": "churn",
        "churn_schema": CHURN_SCHEMA,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "flashinfer": getattr(flashinfer, "__version__", None),
        "flashinfer_error": fi_error,
        "gpu": torch.cuda.get_device_name(device),
        "capability": f"{major}.{minor}",
        "arch": arch,
        "n": n,
        "k": k,
        "calls": calls,
        "warmup": warmup,
        "stat_keys": list(STAT_KEYS),
        "gemms": [],
    }
    started = time.monotonic()
    for gemm, backend, make in gemm_plan(torch, flashinfer, fi_error, (major, minor)):
        entry: dict[str, Any] = {"gemm": gemm, "backend": backend, "n": n, "k": k}
        if isinstance(make, str):
            entry.update(available=False, reason=make, samples=[])
        else:
            entry.update(available=True, reason="", samples=[])
            for m in buckets:
                entry["samples"].append(_sample(torch, make, m, n, k, calls=calls, warmup=warmup))
        document["gemms"].append(entry)
        print(f"churn probe: {gemm} ({backend}) done", file=sys.stderr, flush=True)
    document["wall_seconds"] = round(time.monotonic() - started, 1)
    return document


# A maker takes (m, n, k) and returns the call to measure (inputs made once, outside the window),
# or a string: why this GEMM cannot run on this device.
Maker = Callable[[int, int, int], Callable[[], Any]]


def gemm_plan(torch: Any, flashinfer: Any, fi_error: str | None, capability: tuple[int, int]) -> list[Any]:
    """(gemm, backend, maker-or-reason) for every GEMM this probe knows; the unavailable ones say why."""
    major, minor = capability
    arch = f"sm{major}{minor}"
    plan: list[Any] = [("torch.mm", "bf16", _torch_mm(torch))]
    no_fi = f"FlashInfer does not import here ({fi_error})" if flashinfer is None else None
    for backend in BMM_FP8_BACKENDS:
        if no_fi:
            plan.append(("flashinfer.bmm_fp8", backend, f"bmm_fp8: {no_fi}"))
        elif (major, minor) < (8, 9):
            plan.append(("flashinfer.bmm_fp8", backend, f"bmm_fp8: not available on {arch} (FP8 needs SM89+)"))
        else:
            plan.append(("flashinfer.bmm_fp8", backend, _bmm_fp8(torch, flashinfer, backend)))
    for backend in MM_FP4_BACKENDS:
        if major not in FP4_MAJORS:
            plan.append(("flashinfer.mm_fp4", backend, f"mm_fp4: not available on {arch} (FP4 needs SM100 or SM120)"))
        elif no_fi:
            plan.append(("flashinfer.mm_fp4", backend, f"mm_fp4: {no_fi}"))
        else:
            plan.append(("flashinfer.mm_fp4", backend, _mm_fp4(torch, flashinfer, backend)))
    return plan


def _flashinfer() -> tuple[Any, str | None]:
    try:
        import flashinfer
    except Exception as exc:  # an ImportError, or a broken package trio raising at import
        return None, f"{type(exc).__name__}: {exc}"
    return flashinfer, None


def _torch_mm(torch: Any) -> Maker:
    def make(m: int, n: int, k: int) -> Callable[[], Any]:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        return lambda: torch.mm(a, b)

    return make


def _bmm_fp8(torch: Any, flashinfer: Any, backend: str) -> Maker:
    # flashinfer.bmm_fp8(A, B, A_scale, B_scale, dtype, out=None, backend=...), gemm_base.py:6482 at 0.6.14
    def make(m: int, n: int, k: int) -> Callable[[], Any]:
        a = torch.randn(1, m, k, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(1, n, k, device="cuda").to(torch.float8_e4m3fn).transpose(1, 2)
        scale = torch.tensor(1.0, device="cuda", dtype=torch.float32)
        return lambda: flashinfer.bmm_fp8(a, b, scale, scale, torch.bfloat16, backend=backend)

    return make


def _mm_fp4(torch: Any, flashinfer: Any, backend: str) -> Maker:
    # As mm_fp4's docstring (its Notes and example, gemm_base.py:6294-6316 at 0.6.14): both operands
    # quantized with nvfp4_quantize, 128x4 scale layout, do_shuffle=False for the cutlass/cudnn backends.
    def make(m: int, n: int, k: int) -> Callable[[], Any]:
        layout = flashinfer.SfLayout.layout_128x4
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        a_gs = (448 * 6) / a.float().abs().nan_to_num().max()
        b_gs = (448 * 6) / b.float().abs().nan_to_num().max()
        a_fp4, a_sf = flashinfer.nvfp4_quantize(a, a_gs, sfLayout=layout, do_shuffle=False)
        b_fp4, b_sf = flashinfer.nvfp4_quantize(b, b_gs, sfLayout=layout, do_shuffle=False)
        alpha = 1.0 / (a_gs * b_gs)  # a 0-d float32 tensor, as in the example
        return lambda: flashinfer.mm_fp4(a_fp4, b_fp4.T, a_sf, b_sf.T, alpha, torch.bfloat16, None, backend=backend)

    return make


def _sample(torch: Any, make: Maker, m: int, n: int, k: int, *, calls: int, warmup: int) -> dict[str, Any]:
    """One M: the deltas of STAT_KEYS (and the peak above the start) around each measured call."""
    try:
        call = make(m, n, k)
        for _ in range(warmup):
            call()
        torch.cuda.synchronize()
        measured = [_one_call(torch, call) for _ in range(calls)]
    except Exception as exc:  # a backend that refuses this shape or device: its message is the finding
        error = f"{type(exc).__name__}: {str(exc)[:400]}"
        try:
            torch.cuda.synchronize()
        except Exception as sticky:  # a fault the context keeps (an illegal address): said, not raised
            error += f"; and the device then: {type(sticky).__name__}: {str(sticky)[:200]}"
        return {"m": m, "error": error, "calls": []}
    times = [c.pop("seconds") for c in measured]
    return {"m": m, "error": None, "calls": measured, "median_us": round(statistics.median(times) * 1e6, 1)}


def _one_call(torch: Any, call: Callable[[], Any]) -> dict[str, Any]:
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()
    torch.cuda.reset_peak_memory_stats()
    start_bytes = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    out = call()
    torch.cuda.synchronize()  # the call's frees happen on its stream: count them before reading
    seconds = time.perf_counter() - t0
    after = torch.cuda.memory_stats()
    peak = torch.cuda.max_memory_allocated()
    out_bytes = int(out.numel() * out.element_size()) if hasattr(out, "numel") else 0
    del out
    deltas = {key: int(after.get(key, 0)) - int(before.get(key, 0)) for key in STAT_KEYS}
    return {**deltas, "peak_over_start": int(peak - start_bytes), "out_bytes": out_bytes, "seconds": seconds}


if __name__ == "__main__":
    sys.exit(main())
