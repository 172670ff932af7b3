"""stackproof's in-image probe: what is installed, what imports, what torch sees. Stdlib only.

Mounted read-only into a container at verify time (never baked into an image) and run with the
image's own python; or run directly in host mode to check the environment you are in:

    python inimage_probe.py [--modules torch,flashinfer,vllm] [--timeout 300]

Prints one JSON document (probe_schema 1) on stdout. Each import runs in a fresh subprocess, so
one module's crash or hang cannot hide another's result, and nothing stays loaded in here.
Values of environment variables whose names look secret are redacted.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import time
from typing import Any

PROBE_SCHEMA = 1
DEFAULT_MODULES = ("torch", "flashinfer", "vllm")
ENV_PREFIXES = ("FLASHINFER_", "VLLM_", "SGLANG_", "SGL_", "CUDA_", "NCCL_", "TORCH_")
LOG_LINES = 40  # the last lines of each import's stderr kept in the report
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|CREDENTIAL|AUTH", re.IGNORECASE)

# Runs in a child interpreter: import one module and report the outcome as JSON on the last line.
# For torch it also reports what torch sees (version, CUDA, cuDNN, GPUs and their capability).
_CHILD = r"""
import json, sys, time, traceback
name = sys.argv[1]
started = time.monotonic()
result = {"ok": True}
try:
    module = __import__(name)
    result["version"] = str(getattr(module, "__version__", "") or "")
    if name == "torch":
        info = {"version": str(module.__version__), "cuda": module.version.cuda,
                "cuda_available": False, "cudnn": None, "gpus": []}
        try:
            info["cuda_available"] = bool(module.cuda.is_available())
            if module.backends.cudnn.is_available():
                info["cudnn"] = module.backends.cudnn.version()
            for i in range(module.cuda.device_count() if info["cuda_available"] else 0):
                major, minor = module.cuda.get_device_capability(i)
                props = module.cuda.get_device_properties(i)
                info["gpus"].append({"index": i, "name": module.cuda.get_device_name(i),
                                     "capability": f"{major}.{minor}", "memory_bytes": int(props.total_memory),
                                     "multiprocessors": int(props.multi_processor_count)})
        except Exception as exc:
            info["error"] = f"{type(exc).__name__}: {exc}"
        result["torch"] = info
except BaseException as exc:
    result = {"ok": False, "type": type(exc).__name__, "message": str(exc),
              "traceback": traceback.format_exc().splitlines()[-12:]}
result["seconds"] = round(time.monotonic() - started, 2)
print("\n" + json.dumps(result))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description="stackproof in-image probe")
    parser.add_argument(
        "--modules",
        default=",".join(DEFAULT_MODULES),
        help="modules to import, comma-separated; a `?` suffix means 'only where installed'",
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds allowed for each import")
    args = parser.parse_args()
    report: dict[str, Any] = {
        "probe_schema": PROBE_SCHEMA,
        "python": {
            "version": platform.python_version(),
            "executable": sys.executable,
            "prefix": sys.prefix,
            "platform": sys.platform,
            "machine": platform.machine(),
            "implementation": sys.implementation.name,
        },
        "distributions": distributions(),
        "imports": {},
        "torch": None,
        "env": environment(),
    }
    wanted = [(m.rstrip("?"), m.endswith("?")) for m in (m.strip() for m in args.modules.split(",")) if m]
    present = [(name, optional) for name, optional in wanted if importlib.util.find_spec(name) is not None]
    # Imports run side by side (each in its own interpreter): the verdict is as fast as the slowest.
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(present))) as pool:
        names = [name for name, _ in present]
        outcomes = dict(zip(names, pool.map(lambda name: import_in_child(name, args.timeout), names), strict=True))
    for name, optional in wanted:
        outcome = outcomes.get(name) or {
            "ok": False,
            "absent": True,
            "type": "ModuleNotFoundError",
            "message": f"No module named {name!r}",
        }
        outcome["optional"] = optional
        if "torch" in outcome:
            report["torch"] = outcome.pop("torch")
        report["imports"][name] = outcome
    json.dump(report, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


def distributions() -> list[dict[str, Any]]:
    seen: dict[str, dict[str, Any]] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if not name or name.lower() in seen:  # the first one on sys.path is the one Python imports
            continue
        location = str(getattr(dist, "_path", "") or "")
        seen[name.lower()] = {
            "name": name,
            "version": dist.version,
            "location": os.path.dirname(location) if location else "",
            "installer": (dist.read_text("INSTALLER") or "").strip(),
            "requires": list(dist.requires or []),
        }
    return sorted(seen.values(), key=lambda d: str(d["name"]).lower())


def environment() -> dict[str, str]:
    return {
        name: ("***" if SECRET_NAME.search(name) else value)
        for name, value in sorted(os.environ.items())
        if name.startswith(ENV_PREFIXES)
    }


def import_in_child(name: str, timeout: float) -> dict[str, object]:
    started = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-c", _CHILD, name], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {
            "ok": False,
            "type": "Timeout",
            "message": f"import {name} did not finish in {timeout:.0f}s",
            "seconds": round(time.monotonic() - started, 2),
        }
    lines = proc.stdout.strip().splitlines()
    try:
        outcome = dict(json.loads(lines[-1]))
    except (IndexError, ValueError):
        # The interpreter died without reporting (a segfault, os._exit in an extension).
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-12:]
        return {
            "ok": False,
            "type": "ProcessDied",
            "message": f"exit code {proc.returncode}",
            "traceback": tail,
            "seconds": round(time.monotonic() - started, 2),
        }
    # What the import logged: FlashInfer 0.7 warns here, and goes on, when it ignores a kernel package.
    outcome["log"] = proc.stderr.strip().splitlines()[-LOG_LINES:]
    return outcome


if __name__ == "__main__":
    sys.exit(main())
