# ruff: noqa: E501 (realistic log lines are long; wrapping them would change what is matched)
"""Issue 44: fresh11/, the eleventh batch (collected and labelled by a helper that never ran stackproof, committed
at a854afb), scored once as a held-out batch (FIRST-RUN.txt: 20/33, one failure called clean) and seen since:
the mechanisms written for its misses, each proven both ways, and the batch held log by log; the paste left
standing is a strict xfail with the reason.
"""

from __future__ import annotations

import pytest

from tests.unit.test_diagnosis_beyond import BEYOND
from tests.unit.test_diagnosis_unseen import held_batch_tests, primary
from verify.logs.logtext import clean_line, message_of, split_records

BATCH = BEYOND / "fresh11"
LEFT = {
    "sglang-37105-rtx-pro-6000-deep-gemm-nameerror.log": "the NameError is logged above SGLang's 'Scheduler hit an "
    "exception' and 'Received sigquit from a child process', whose traceback the paste cut; engine-dead (the scheduler "
    "gone) outranks a bare Python exception by design, and letting any earlier exception line outrank a named engine "
    "death would change every corpus whose engine died of a classified cause logged before it",
}


@pytest.mark.parametrize(
    ("line", "cls"),
    [
        # guoqingbao/vllm.rs via xinfer#217: FlashInfer's C++ Error class from a binding's adapter
        (
            "terminate called after throwing an instance of 'flashinfer::Error'\n  what():  Error in function 'operator()' at src/flashinfer_adapter.cu:408: Unsupported group_size: 64\n",
            "flashinfer-unsupported",
        ),
        (
            "RuntimeError: Error in function 'BatchDecodeWithPagedKVCacheDispatched' at /workspace/include/flashinfer/attention/decode.cuh:811: Unsupported head_dim: 512\n",
            "flashinfer-unsupported",
        ),
        # ninfer/ninfer#12: GSP RPCs failing with NV_ERR_GPU_IS_LOST
        (
            "Aug 10 22:40:59 anthill kernel: NVRM: GPU0 _issueRpcAndWait: rpcSendMessage failed with status 0x0000000f for fn 10 sequence 800!\n",
            "gpu-lost",
        ),
        # RIDE-Lab/SAGE#185 and NVIDIA/nvidia-container-toolkit#1611
        ("Failed to initialize NVML: Unknown Error\n", "container-gpu-runtime"),
        (
            'nvidia-ctk[1600]: time="2026-01-25T00:45:43+11:00" level=error msg="failed to generate CDI spec: failed to create device CDI specs: failed to initialize NVML: Driver Not Loaded"\n',
            "container-gpu-runtime",
        ),
        # NVIDIA/nccl-tests#15
        ("server1:6601:6625 [0] include/socket.h:385 NCCL WARN Net : Connection closed by remote peer\n", "nccl-error"),
        ("server1: Test NCCL failure common.cu:921 'unhandled system error'\n", "nccl-error"),
        # NVIDIA-AI-Blueprints/video-search-and-summarization#1743, wrapped as pasted
        (
            "ValueError: Free memory on device cuda:0 (67.92/121.69 GiB) on startup is less than\ndesired GPU memory utilization (0.7, 85.18 GiB).\n",
            "out-of-memory",
        ),
        # SemiAnalysisAI/InferenceX#2128
        (
            "ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.88.\n",
            "no-kv-cache-memory",
        ),
        # ai-dynamo/dynamo#3612
        (
            "Exception: Failed to connect to NATS: IO error: Connection refused (os error 111)\n",
            "control-plane-unreachable",
        ),
        # sgl-project/sglang#9340
        ("NVCC compilation failed: nvcc fatal   : Unsupported gpu architecture 'sm_100f'\n", "ptxas-unknown-arch"),
        # vllm-project/vllm#721
        (
            "[2023-08-09 22:39:16,002 E 209 223] (raylet) file_system_monitor.cc:111: /tmp/ray/session_2023-08-09_22-27-32_558284_37 is over 95% full, available space: 60427313152; capacity: 1599538507776. Object creation will fail if spilling is required.\n",
            "disk-full",
        ),
        # netease-youdao/QAnything#128: FastChat's logger around a traceback cut inside vLLM's dtype check
        (
            '2024-02-20 21:46:23 | ERROR | stderr |   File "/usr/lib/python3/dist-packages/vllm/worker/worker.py", line 71, in init_model\n'
            "2024-02-20 21:46:23 | ERROR | stderr |     _check_if_gpu_supports_dtype(self.model_config.dtype)\n"
            '2024-02-20 21:46:23 | ERROR | stderr |   File "/usr/lib/python3/dist-packages/vllm/worker/worker.py", line 231, in _check_if_gpu_supports_dtype\n',
            "unsupported-on-gpu",
        ),
    ],
)
def test_a_real_line_names_its_class(line: str, cls: str) -> None:
    assert primary(line) == cls


@pytest.mark.parametrize(
    ("line", "cls"),
    [
        # sgl-kernel's HIP error class prints FlashInfer's shape; only a FlashInfer file counts
        (
            "RuntimeError: Error in function 'moe_align' at sgl-kernel/csrc/moe/moe_align_kernel.cu:120: Unsupported block size\n",
            "flashinfer-unsupported",
        ),
        ("RuntimeError: Error in function 'run' at flashinfer/decode.cuh:10: ok\n", "flashinfer-unsupported"),
        # another NV_STATUS from a GSP RPC is not a lost GPU (0x00000065: NV_ERR_TIMEOUT)
        (
            "NVRM: GPU0 _issueRpcAndWait: rpcSendMessage failed with status 0x00000065 for fn 76 sequence 12!\n",
            "gpu-lost",
        ),
        ('nvidia-ctk: level=info msg="Generated CDI spec with version 0.5.0"\n', "container-gpu-runtime"),
        ("server1:1:1 [0] NCCL INFO Connected all rings\n", "nccl-error"),
        (
            "INFO 01-01 00:00:00 [utils.py:1] Free memory on device cuda:0 (70.00/80.00 GiB) at startup\n",
            "out-of-memory",
        ),
        ("INFO:nats: connected to NATS at nats://127.0.0.1:4222\n", "control-plane-unreachable"),
        ("nvcc: NVIDIA (R) Cuda compiler driver, supports sm_100f\n", "ptxas-unknown-arch"),
        ("[2023-08-09 22:39:16,002 I 209 223] (raylet) /tmp/ray is 40% full\n", "disk-full"),
    ],
)
def test_a_near_line_is_not_that_class(line: str, cls: str) -> None:
    assert primary(line) != cls


def test_caret_notation_escapes_and_carriage_returns_are_taken_off_a_paste() -> None:
    """ByteDance-Seed/seed-oss#10 as pasted: `^[[1;36m` for ESC and `^M` joining several records on one line."""
    line = (
        "^[[1;36m(APIServer pid=679631)^[[0;0m ERROR 08-22 21:36:14 [serving_chat.py:250] Error in preprocessing prompt inputs^M"
        "^[[1;36m(APIServer pid=679631)^[[0;0m ERROR 08-22 21:36:14 [serving_chat.py:250] Traceback (most recent call last):^M"
        '^[[1;36m(APIServer pid=679631)^[[0;0m ERROR 08-22 21:36:14 [serving_chat.py:250]   File "/x/transformers/utils/chat_template_utils.py", line 521, in render_jinja_template^M'
    )
    messages = [message_of(clean_line(r.decode()).text) for r in split_records(line.encode())]
    assert "Error in preprocessing prompt inputs" in messages
    assert "Traceback (most recent call last):" in messages
    assert not any("^[" in m or "^M" in m for m in messages)
    # the traceback is cut before its exception; the frame below it names the chat template's Jinja renderer
    assert primary(line + "\n") == "chat-template-error"
    # without the renderer's frame it stays a bare Python exception
    assert primary(line.replace("render_jinja_template", "apply") + "\n") == "python-exception"


test_batch_log_gets_its_class, test_the_index_is_the_folder_and_the_left_ones_are_in_it = held_batch_tests(
    BATCH, LEFT, logs=45, failing=33
)
