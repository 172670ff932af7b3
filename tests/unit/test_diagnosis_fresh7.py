# ruff: noqa: E501 (realistic log lines are long; wrapping them would change what is matched)
"""Issue 44 (diag5): the mechanisms written for fresh7/'s misses after its first run, each proven both ways.

fresh7/ was tuned on only after its FIRST-RUN.txt was committed (SPLIT.md). Each real line (from the fresh7/
thread named beside it) must name its class; each near-miss (in the same component's format, saying something
that is not that failure) must not. verify/logs/failure_classes.yaml cites the upstream source line of each.
"""

from __future__ import annotations

import pytest

from tests.unit.test_diagnosis_unseen import primary
from verify.logs.diagnosis import diagnose


@pytest.mark.parametrize(
    ("text", "cls"),
    [
        # CDI's injection, through podman and through the daemon (NVIDIA/nvidia-container-toolkit#885, #1537)
        (
            'Error: setting up CDI devices: failed to inject devices: failed to stat CDI host device "/dev/dri/renderD129": no such file or directory\n',
            "container-gpu-runtime",
        ),
        (
            "docker: Error response from daemon: failed to create task for container: failed to create shim task: OCI runtime create failed: could not apply required modification to OCI specification: error modifying OCI spec: failed to inject CDI devices: unresolvable CDI de          vices runtime.nvidia.com/gpu=all: unknown\n",
            "container-gpu-runtime",
        ),
        # the prestart hook --gpus installs, failing inside the daemon's answer (dstackai/dstack#2306)
        (
            "time=2025-02-17T14:52:02.912834Z level=error msg=failed to run container err=Error response from daemon: failed to create task for container: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: error during container init: error running prestart hook #0: exit status 1, stdout: , stderr: Using requested mode 'cdi'\n",
            "container-gpu-runtime",
        ),
        # ptxas's --gpu-name refusal quoted without its prefix (nvidia-cosmos/cosmos-reason2#30)
        ("Value 'sm_121a' is not defined for option 'gpu-name'\n", "ptxas-unknown-arch"),
        # NVML's library missing from the container (vllm-project/vllm#23935)
        (
            "DEBUG 08-29 04:29:54 [__init__.py:99] CUDA platform is not available because: NVML Shared Library Not Found\n",
            "no-gpu-visible",
        ),
    ],
)
def test_a_fresh7_mechanism_names_its_class(text: str, cls: str) -> None:
    assert primary(text) == cls, diagnose(text.encode()).summary()


@pytest.mark.parametrize(
    ("text", "not_cls"),
    [
        # a hook that ran, and CDI devices that resolved (format of runc's and nvidia-ctk's own logs)
        (
            "time=2025-02-17T14:52:02Z level=debug msg=running prestart hook #0: exit status 0\n",
            "container-gpu-runtime",
        ),
        (
            "INFO[0000] Generated CDI spec with devices nvidia.com/gpu=all, injected devices: 1\n",
            "container-gpu-runtime",
        ),
        # ptxas's option for another value than a GPU target is not this class
        ("ptxas fatal   : Value 'abc' is not defined for option 'opt-level'\n", "ptxas-unknown-arch"),
        # NVML found, and an NVML call that failed for another reason
        ("INFO NVML Shared Library found at /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1\n", "no-gpu-visible"),
    ],
)
def test_a_near_miss_of_a_fresh7_mechanism_does_not_name_it(text: str, not_cls: str) -> None:
    assert primary(text) != not_cls, diagnose(text.encode()).summary()


@pytest.mark.parametrize(
    "text",
    [
        # a level its logger brackets: TensorRT-LLM's two loggers, onnxruntime's (tensorrtllm_backend#300, vllm#32575)
        "[TensorRT-LLM][WARNING] Cannot find parameter with name: batch_scheduler_policy\n",
        "[03/07/2025-11:03:44] [TRT-LLM] [W] Failed to find the plugin config, using defaults\n",
        '2026-01-18 23:17:01.420005915 [W:onnxruntime:Default, device_discovery.cc:164 DiscoverDevicesForPlatform] GPU device discovery failed: device_discovery.cc:89 ReadFileContents Failed to open file: "/sys/class/drm/card0/device/  vendor"\n',
    ],
)
def test_a_bracketed_warning_level_is_not_an_error_line(text: str) -> None:
    assert diagnose(text.encode()).verdict == "clean", diagnose(text.encode()).summary()


@pytest.mark.parametrize(
    "text",
    [
        # the same loggers' error levels stay error lines (flashinfer-ai/flashinfer#920; format of onnxruntime)
        "[03/07/2025-11:03:44] [TRT-LLM] [E] Failed to initialize executor on rank 6: RMSNorm failed with error code unknown\n",
        "[TensorRT-LLM][ERROR] Cannot find parameter with name: batch_scheduler_policy\n",
        '2026-01-18 23:17:01.420005915 [E:onnxruntime:Default, inference_session.cc:2045] Failed to load model: "/m/model.onnx"\n',
    ],
)
def test_a_bracketed_error_level_is_still_an_error_line(text: str) -> None:
    assert diagnose(text.encode()).verdict == "failed", diagnose(text.encode()).summary()
