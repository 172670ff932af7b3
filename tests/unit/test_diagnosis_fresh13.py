# ruff: noqa: E501 (realistic log lines are long; wrapping them would change what is matched)
"""Issue 44: fresh13/, the thirteenth batch (collected and labelled by a helper that never ran stackproof, committed
at 68e84ec), scored once as a held-out batch (FIRST-RUN.txt: 15/32, four failures called clean) and seen since:
the mechanisms written for its misses, each proven both ways, and the batch held log by log; the pastes left
standing are strict xfails with the reason.
"""

from __future__ import annotations

import pytest

from tests.unit.test_diagnosis_beyond import BEYOND
from tests.unit.test_diagnosis_unseen import held_batch_tests, primary

BATCH = BEYOND / "fresh13"
_NOT_IN_THE_LINES = "labelled from the thread, not from the lines: "
LEFT = {
    "sglang-6229-grammar-queue-indexerror-stress.log": "an IndexError under SGLang's scheduler, which then dies: "
    "engine-dead outranks a bare Python exception by design (as fresh11's sglang#37105)",
    "hass-local-openai-19-vllm-tool-request-400.log": _NOT_IN_THE_LINES + "access-log lines of 400 answers; a "
    "commenter's missing tool-calling flags are the config error; called clean",
    "llmd-benchmark-668-gke-vllm-pod-crashed-container.log": _NOT_IN_THE_LINES + "a pod status with no error line; "
    "called clean",
    "vllm-9193-k8s-completions-500-internal-server-error.log": _NOT_IN_THE_LINES
    + "uvicorn access lines of 500 answers "
    "are the server's INFO, not an error it logged; called clean",
    "sglang-14814-page-trtllm-mha-sm120-traceback-cut.log": _NOT_IN_THE_LINES + "the traceback is cut before its raise "
    "line; the attention backend's refusal is the thread's word",
    "ovms-4322-page-chat-template-not-loaded.log": "OpenVINO Model Server's 'Chat template not loaded correctly' is "
    "read as a chat template problem as much as a tokenizer one (the labeller's doubtful call); its C++ 'Error: ...' "
    "line is an error no class names (a Python exception until diag15 read a bare 'Error:' as no Python raise line)",
    "mlx-lm-296-tiktoken-load-tokenizer-model-valueerror.log": "a ValueError unpacking a line of the tiktoken "
    "vocabulary inside transformers' slow-to-fast conversion; the last exception's frames are outside the tokenizer "
    "libraries, and naming tokenizer-error from one frame of a chained traceback would take any conversion bug for a "
    "bad tokenizer file",
    "tt-inference-1682-buildkernels-link-failure-disk.log": _NOT_IN_THE_LINES + "a link failure; the full disk is the "
    "thread's diagnosis; called clean",
    "verl-6677-vllm-workerproc-failed-to-start-dist-port.log": _NOT_IN_THE_LINES + "the traceback is cut before the "
    "bind's error; the port conflict is the thread's word",
    "gpustack-4312-vllm-port-conflict-traceback-cut.log": _NOT_IN_THE_LINES + "the traceback is cut before the bind's "
    "error; the port conflict is the thread's word",
    "vllm-41834-sm12x-dmesg-nvrm-nv-err-no-memory.log": "NVRM's NV_ERR_NO_MEMORY lines also appear on healthy GB10 "
    "starts (beyond/test's clean-vllm-56824), so they cannot name out-of-memory alone (as fresh12's ogkm#848)",
}


@pytest.mark.parametrize(
    ("line", "cls"),
    [
        # ollama/ollama#13494: llama.cpp's loader through ollama's runner
        (
            "Error: 500 Internal Server Error: llama runner process has terminated:\nerror loading model: unable to allocate CUDA0 buffer\n",
            "out-of-memory",
        ),
        # a vLLM RayExecutorV2 page: Gloo's recv timeout
        (
            "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1800000ms for recv operation to complete\n",
            "nccl-timeout",
        ),
        # leptonai/gpud#604
        ("XID 79(GPU has fallen off the bus) detected on PCI:0000:ae:00\n", "xid-79"),
        # sgl-project/sglang#25564: flash-attention 4's arch check on an SM 10.3 B300... and another kernel's wording
        (
            'assert self.arch >= Arch.sm_100 and self.arch <= Arch.sm_110f, "Only SM 10.x and 11.x are supported"\nAssertionError: Only SM 10.x and 11.x are supported\n',
            "unsupported-on-gpu",
        ),
        ("RuntimeError: Only SM90 is supported\n", "unsupported-on-gpu"),
        # vllm-project/vllm#569
        (
            "RuntimeError: Failed to load the tokenizer. If you are using a LLaMA-based model, use 'hf-internal-testing/llama-tokenizer' instead of the original tokenizer.\n",
            "tokenizer-error",
        ),
        # ggml-org/llama.cpp#13178: minja's runtime error with the template's source under it, in a 500 body
        (
            "openai.InternalServerError: Error code: 500 - {'error': {'code': 500, 'message': \"Cannot subscript null at row 23, column 40:\\n    {%- set start_of_message = message.content[:tool_start_length] %}\"}}\n",
            "chat-template-error",
        ),
    ],
)
def test_a_real_line_names_its_class(line: str, cls: str) -> None:
    assert primary(line) == cls


@pytest.mark.parametrize(
    ("line", "cls"),
    [
        ("llama_model_load: allocated CUDA0 buffer of 4096 MiB\n", "out-of-memory"),
        ("INFO gloo: waiting 1800000ms for recv operation to complete is the timeout\n", "nccl-timeout"),
        ("XID 13(Graphics Engine Exception) detected on PCI:0000:ae:00\n", "xid-79"),
        ("INFO: SM 10.x and 11.x kernels are supported on this build\n", "unsupported-on-gpu"),
        ("INFO 01-01 tokenizer.py:1] Loaded the tokenizer in 0.2 s\n", "tokenizer-error"),
        ("error: expected ';' at row 3, column 7:\n    int x = 1\n", "chat-template-error"),
    ],
)
def test_a_near_line_is_not_that_class(line: str, cls: str) -> None:
    assert primary(line) != cls


test_batch_log_gets_its_class, test_the_index_is_the_folder_and_the_left_ones_are_in_it = held_batch_tests(
    BATCH, LEFT, logs=44, failing=32
)
