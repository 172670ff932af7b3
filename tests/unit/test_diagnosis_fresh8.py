# ruff: noqa: E501 (realistic log lines are long; wrapping them would change what is matched)
"""Issue 44 (diag6): the mechanisms written for the misses of fresh8/'s tune half, each proven both ways, and that
half held log by log.

fresh8/ was split by its own salted hash before anything ran (FRESH8.md); only fresh8/tune/ is read here or was
tuned on. fresh8/test/ is the held-out half: no test opens it. Each real line (from the fresh8/tune/ thread named
beside it) must name its class; each near-miss (in the same component's format, saying something that is not that
failure) must not. verify/logs/failure_classes.yaml cites the upstream source line of each.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.unit.test_diagnosis_beyond import BEYOND
from tests.unit.test_diagnosis_unseen import labelled_diagnosis
from verify.logs.diagnosis import diagnose

TUNE = BEYOND / "fresh8" / "tune"
TUNE_HALF = yaml.safe_load((TUNE / "index.yaml").read_text())["logs"]


def primary(text: str) -> str | None:
    d = diagnose(text.encode())
    return d.primary.id if d.primary else None


@pytest.mark.parametrize("entry", TUNE_HALF, ids=[e["file"] for e in TUNE_HALF])
def test_tune_half_log_gets_its_class(entry: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    d = labelled_diagnosis(TUNE / entry["file"], entry, capsys)
    if d is None:
        return
    assert d["incident"] is None and "Traceback (most recent call last)" not in d["summary"]
    assert not d["summary"].startswith("python-exception")  # each is named at its mechanism


def test_the_tune_half_is_the_whole_index_and_nothing_else() -> None:
    assert {e["file"] for e in TUNE_HALF} == {p.name for p in TUNE.glob("*.log")}
    assert len(TUNE_HALF) == 19 and sum(e["status"] == "failing" for e in TUNE_HALF) == 12


@pytest.mark.parametrize(
    ("text", "cls"),
    [
        # the RM's PCI probe never got the GPUs: another driver owns them (mattshma/bigdata#133), and the newer wording
        ("[188549.975172] NVRM: The NVIDIA probe routine was not called for 3 device(s).\n", "gpu-lost"),
        ("[188497.595099] NVRM: No NVIDIA graphics adapter probed!\n", "gpu-lost"),
        ("[    3.104127] NVRM: No NVIDIA GPU found.\n", "gpu-lost"),
        # ptxas run by a wrapper and exiting non-zero, its stderr not pasted (fishaudio/fish-speech#907, sgl-project/sglang#9707)
        (
            "E0303 11:40:42.533000 713 site-packages/torch/_inductor/runtime/triton_heuristics.py:533] subprocess.CalledProcessError: Command '['/home/u/envs/fs/lib/python3.10/site-packages/triton/backends/nvidia/bin/ptxas', '-lineinfo', '-v', '--gpu-name=sm_120', '/tmp/tmpdy7phawp.ptx', '-o', '/tmp/tmpdy7phawp.ptx.o']' returned non-zero exit status 255.\n",
            "ptxas-unknown-arch",
        ),
        (
            "[2025-08-27 19:30:46 TP1] Scheduler hit an exception: Traceback (most recent call last):\n  File \"/usr/local/lib/python3.12/dist-packages/triton/backends/nvidia/compiler.py\", line 424, in make_cubin\n    subprocess.run(ptxas_cmd, check=True, close_fds=False, stderr=flog)\nsubprocess.CalledProcessError: Command '['/usr/local/lib/python3.12/dist-packages/triton/backends/nvidia/bin/ptxas', '-lineinfo', '-v', '--gpu-name=sm_120a', '/tmp/t.ptx', '-o', '/tmp/t.ptx.o']' returned non-zero exit status 255.\n",
            "ptxas-unknown-arch",
        ),
        # a CUDA check macro's report, the call's text wrapped onto the line above by the paste (NVIDIA/TensorRT-LLM#260)
        (
            "E1103 02:59:01.152656 81041 backend_model.cc:553] ERROR: Failed to create instance: unexpected error when creating modelInstanceState: [TensorRT-LLM][ERROR] CUDA runtime error in ::cudaMallocAsync(ptr, n, mCudaSt\nream->get()): out of memory (/app/tensorrt_llm/cpp/tensorrt_llm/runtime/tllmBuffers.h:112)\n",
            "out-of-memory",
        ),
        # a free-space check that finds too little (huggingface/huggingface_hub#2742), and Windows' ERROR_DISK_FULL text
        (
            "/opt/venv/lib/python3.12/site-packages/huggingface_hub/file_download.py:651: UserWarning: Not enough free disk space to download the file. The expected file size is: 3945.44 MB. The target location /root/.cache/huggingface/hub/models--Qwen--Qwen2.5-7B-Instruct/blobs only has 3421.60 MB free disk space.\n  warnings.warn(\n",
            "disk-full",
        ),
        ("OSError: [WinError 112] There is not enough space on the disk\n", "disk-full"),
        # the router cannot parse the tokenizer's config (huggingface/text-generation-inference#1534)
        (
            "2024-02-09T09:28:45.021349Z  WARN text_generation_router: router/src/main.rs:467: Unable to parse tokenizer config: invalid type: map, expected a string at line 7 column 16\n",
            "tokenizer-error",
        ),
        # a worker process's start-up failing, as vLLM's multiproc executor says (runpod-workers/worker-vllm#276)
        (
            "2026-03-11T17:57:32.372168462Z (EngineCore_DP0 pid=269) ERROR 03-11 17:57:32 [core.py:1006] Exception: WorkerProc initialization failed due to an exception in a background process. See stack trace for root cause.\n",
            "engine-init-failed",
        ),
    ],
)
def test_a_fresh8_mechanism_names_its_class(text: str, cls: str) -> None:
    assert primary(text) == cls, diagnose(text.encode()).summary()


@pytest.mark.parametrize(
    ("text", "not_cls"),
    [
        # a probe that found its GPUs, and the module's load banner
        ("[    3.104127] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  570.158.01  Release Build\n", "gpu-lost"),
        ("[    3.104127] nvidia 0000:01:00.0: NVIDIA probe routine found 1 device(s)\n", "gpu-lost"),
        # another tool failing in subprocess's words is not ptxas; a ptxas that exits 0 is no failure
        (
            "subprocess.CalledProcessError: Command '['/usr/bin/gcc', '-O3', '/tmp/main.c', '-o', '/tmp/main.so']' returned non-zero exit status 1.\n",
            "ptxas-unknown-arch",
        ),
        ("DEBUG ptxas '--gpu-name=sm_90a' '/tmp/t.ptx' returned non-zero exit status 0\n", "ptxas-unknown-arch"),
        # another CUDA error string in the same macro's shape is not an out-of-memory
        (
            "[TensorRT-LLM][ERROR] CUDA runtime error in ::cudaMemcpyAsync(dst, src, n, stream): an illegal memory access was encountered (/app/tensorrt_llm/cpp/tensorrt_llm/runtime/bufferManager.cpp:51)\n",
            "out-of-memory",
        ),
        # a free-space check that passed; a logger's own warning about disk space stays advice (loud_only)
        (
            "/opt/venv/lib/python3.12/site-packages/huggingface_hub/file_download.py:651: UserWarning: enough free disk space: 143 GB available.\n",
            "disk-full",
        ),
        (
            "WARNING 11-30 10:00:00 [cache.py:1] Insufficient disk space can slow down the compile cache; set VLLM_CACHE_ROOT\n",
            "disk-full",
        ),
        # no tokenizer config on the hub is not one the router cannot parse (the line after it in the same paste)
        (
            "2024-02-09T09:28:45.021427Z  WARN text_generation_router: router/src/main.rs:245: Could not retrieve tokenizer config from the Hugging Face hub.\n",
            "tokenizer-error",
        ),
        # an initialisation that failed in a part other than the engine's (NCCL's own class is elsewhere)
        (
            "(Worker pid=3) ERROR 03-11 17:57:32 [pynccl.py:1] NCCL initialization failed: unhandled system error\n",
            "engine-init-failed",
        ),
        (
            "(Worker pid=3) INFO 03-11 17:57:32 [worker.py:1] WorkerProc initialization finished in 12.3 s\n",
            "engine-init-failed",
        ),
    ],
)
def test_a_near_miss_of_a_fresh8_mechanism_does_not_name_it(text: str, not_cls: str) -> None:
    assert primary(text) != not_cls, diagnose(text.encode()).summary()


@pytest.mark.parametrize(
    "text",
    [
        "[    3.104127] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  570.158.01  Release Build\n",
        "/opt/venv/lib/python3.12/site-packages/huggingface_hub/file_download.py:651: UserWarning: enough free disk space: 143 GB available.\n",
        "2024-02-09T09:28:45.021427Z  WARN text_generation_router: router/src/main.rs:245: Could not retrieve tokenizer config from the Hugging Face hub.\n",
        "(Worker pid=3) INFO 03-11 17:57:32 [worker.py:1] WorkerProc initialization finished in 12.3 s\n",
        "ptxas info    : Used 128 registers, 464 bytes cmem[0]\n",
    ],
)
def test_the_lines_around_those_mechanisms_stay_clean(text: str) -> None:
    assert diagnose(text.encode()).verdict == "clean", diagnose(text.encode()).summary()
