# ruff: noqa: E501 (realistic log lines are long; wrapping them would change what is matched)
"""Issue 44: fresh14/, the fourteenth batch (collected and labelled by a helper that never ran stackproof, committed
at 1ec333a under a tighter rule: a failing paste only when its own lines show the error line), scored once as a
held-out batch (FIRST-RUN.txt: 17/29, one failure called clean) and seen since: the mechanisms written for its
misses, each proven both ways, and the batch held log by log; the pastes left standing are strict xfails with the
reason.
"""

from __future__ import annotations

import pytest

from tests.unit.test_diagnosis_beyond import BEYOND
from tests.unit.test_diagnosis_unseen import held_batch_tests, primary

BATCH = BEYOND / "fresh14"
_MIG = (
    "a ValueError raise line (int() of a MIG UUID in CUDA_VISIBLE_DEVICES) is what the lines show, and a Python "
    "exception is its class; the labeller's unclassified-error was a judgement call that names python-exception as "
    "the other reading"
)
LEFT = {
    "vllm-7211-mig-uuid-invalid-literal-for-int.log": _MIG,
    "blackfish-108-vllm-mig-uuid-invalid-literal.log": _MIG,
    "ollama-1289-jetson-nvrmmeminit-permission-denied.log": "'NvRmMemInitNvmap failed with Permission denied': the "
    "service may not open the Jetson's memory manager, which the lines call a permission failure (the labeller's "
    "other reading); no-gpu-visible is its consequence",
}


@pytest.mark.parametrize(
    ("line", "cls"),
    [
        # NVIDIA/nccl-tests#14: NCCL's debug line with its source position and without the word NCCL
        (
            "e66aa18dc444:3171:3171 [0] include/socket.h:311 WARN Socket creation failed : Address family not supported by protocol\n",
            "nccl-error",
        ),
        # vllm-project/vllm#24109: vLLM's FP8 MoE path refusing FlashInfer's kernels for a non-Llama4 model
        (
            "(VllmWorker TP4 pid=3020312) ERROR 09-02 08:16:39 [multiproc_executor.py:574] AssertionError: FusedMoE flashinfer kernels are only supported for Llama4\n",
            "flashinfer-unsupported",
        ),
        (
            "NotImplementedError: FlashInfer backend is not supported for sliding window attention\n",
            "flashinfer-unsupported",
        ),
        # containers/crun#2070 and containers/ramalama#1487: Podman's OCI runtime and conmon failures
        ("Error: OCI runtime error: crun: fsopen_mount tmpfs: Function not implemented\n", "container-error"),
        (
            'Error: container create failed (no logs from conmon): conmon bytes "": readObjectStart: expect { or n, but found , error found in #0 byte of ...||..., bigger context ...||...\n',
            "container-error",
        ),
        # vllm-project/vllm#2847, hiyouga/LlamaFactory#9512: an adapter above --max-lora-rank, raised and re-raised
        ("ValueError: LoRA rank 64 is greater than max_lora_rank 16.\n", "config-error"),
        (
            "(EngineCore_DP0 pid=1789245) ERROR 11-19 12:54:26 [core.py:710] RuntimeError: Worker failed with error 'LoRA rank 32 is greater than max_lora_rank 16.', please check the stack trace above for the root cause\n",
            "config-error",
        ),
        # coverblew/llamita.cpp#2: systemd's report of a service killed by SIGSEGV
        ("Main process exited, code=dumped, status=11/SEGV\n", "unclassified-error"),
        ("llama.service: Main process exited, code=killed, status=9/KILL\n", "unclassified-error"),
        # withcatai/node-llama-cpp#560: ggml's host-side abort after a cuBLAS failure is not a device-side assert
        (
            "/root/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu:97: CUDA error\n[node-llama-cpp] CUDA error: an internal operation failed\nAborted (core dumped)\n",
            "unclassified-error",
        ),
        # ... while a CUDA kernel's own assert keeps its class
        (
            '../aten/src/ATen/native/cuda/IndexKernel.cu:92: operator(): block: [0,0,0], thread: [0,0,0] Assertion `-sizes[i] <= index && index < sizes[i] && "index out of bounds"` failed.\n',
            "device-side-assert",
        ),
    ],
)
def test_a_real_line_names_its_class(line: str, cls: str) -> None:
    assert primary(line) == cls


@pytest.mark.parametrize(
    ("line", "cls"),
    [
        # NCCL finding no InfiniBand (capitalised, as its notices are) and going on over sockets
        ("e66aa18dc444:3171:3171 [0] misc/ibvwrap.cu:61 WARN Failed to open libibverbs.so[.1]\n", "nccl-error"),
        # a start going on without FlashInfer is a WARNING, not a raise line
        (
            "WARNING 09-02 08:16:39 [cuda.py:310] FlashInfer is not supported on this GPU; using the FLASH_ATTN backend\n",
            "flashinfer-unsupported",
        ),
        # Podman naming its runtime at debug level
        ('time="2025-01-01T00:00:00Z" level=debug msg="Using OCI runtime \\"/usr/bin/crun\\""\n', "container-error"),
        ("INFO 11-19 12:54:26 [lora.py:88] max_lora_rank 64 covers every adapter (LoRA rank 32)\n", "config-error"),
        ("llama.service: Main process exited, code=exited, status=0/SUCCESS\n", "unclassified-error"),
    ],
)
def test_a_near_line_is_not_that_class(line: str, cls: str) -> None:
    assert primary(line) != cls


test_batch_log_gets_its_class, test_the_index_is_the_folder_and_the_left_ones_are_in_it = held_batch_tests(
    BATCH, LEFT, logs=42, failing=29
)
