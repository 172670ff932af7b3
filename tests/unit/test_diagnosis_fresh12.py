# ruff: noqa: E501 (realistic log lines are long; wrapping them would change what is matched)
"""Issue 44: fresh12/, the twelfth batch (collected and labelled by a helper that never ran stackproof, committed
at ac0c006), scored once as a held-out batch (FIRST-RUN.txt: 24/32, three failures called clean, one clean
excerpt called a failure) and seen since: the mechanisms written for its misses, each proven both ways, and the
batch held log by log; the pastes left standing are strict xfails with the reason.
"""

from __future__ import annotations

import pytest

from tests.unit.test_diagnosis_beyond import BEYOND
from tests.unit.test_diagnosis_unseen import held_batch_tests, primary

BATCH = BEYOND / "fresh12"
LEFT = {
    "gpustack-5014-raylet-dev-shm-request-exceeds.log": "Ray's plasma store logs 'System memory request exceeds memory "
    "available in /dev/shm' at WARNING and goes on with a fallback directory; a Ray WARNING about /dev/shm is also in "
    "clean logs (fresh11's vllm#1111), and the crash the thread reports is not in the lines; called clean",
    "ogkm-848-nvrm-nv-err-no-memory-sysmem.log": "NVRM's NV_ERR_NO_MEMORY lines also appear on healthy GB10 starts "
    "(beyond/test's clean-vllm-56824), so they cannot name out-of-memory alone; detected, unclassified",
}


@pytest.mark.parametrize(
    ("line", "cls"),
    [
        # vllm-project/vllm#5727: a local path missing on a Ray peer node, taken for a repo id by HfFileSystem
        (
            "(RayWorkerWrapper pid=164587, ip=128.1.219.180) ERROR 06-21 03:49:38 worker_base.py:148] FileNotFoundError: /model/models/Qwen2-72B-Instruct (invalid repository id)\n",
            "model-files-missing",
        ),
        # logicalclocks/hopsworks#1557: the DataLoader's bus error and torch's shm segment out of space
        (
            "RuntimeError: DataLoader worker (pid 729) is killed by signal: Bus error. It is possible that dataloader's workers are out of shared memory. Please try to raise your shared memory limit.\n",
            "shm-too-small",
        ),
        (
            "RuntimeError: unable to write to file </torch_739_144252761_4>: No space left on device (28)\n",
            "shm-too-small",
        ),
        # ray-project/ray#27716: the raylet's memory monitor
        (
            "(raylet) [2022-08-29 15:18:33,592 E 30307 30344] (raylet) node_manager.cc:2963: System memory low at node with IP 172.17.0.2. Used memory (23.63GB) / total capacity (33.28GB) (0.709971) exceeds threshold 0.7, killing latest task with name the_real_oom_actor\n",
            "host-out-of-memory",
        ),
        # huggingface/text-generation-inference#3130
        (
            "ERROR warmup{max_input_length=Some(30000)}:warmup: text_generation_router_v3::client: backends/v3/src/client/mod.rs:45: Server error: Not enough memory to handle 31000 prefill tokens. You need to decrease `--max-batch-prefill-tokens`\n",
            "out-of-memory",
        ),
        # NVIDIA/open-gpu-kernel-modules#1045
        (
            "Jun 12 16:31:50 fedora-box kernel: NVRM: GPU0 nvCheckOkFailedNoLog: Check failed: Reset required [NV_ERR_RESET_REQUIRED] (0x00000062) returned from _gpushareddataSendDataPollRpc(pGpu, polle>\n",
            "gpu-lost",
        ),
        # ollama/ollama#6364
        ("cuInit err: 999\n", "no-gpu-visible"),
        # a Ray C++ error line is an error line, whatever its words (the extractor)
        (
            "[2023-08-09 22:39:16,002 E 209 223] (raylet) object_manager.cc:1: something went wrong in the store\n",
            "unclassified-error",
        ),
    ],
)
def test_a_real_line_names_its_class(line: str, cls: str) -> None:
    assert primary(line) == cls


@pytest.mark.parametrize(
    ("line", "cls"),
    [
        ("INFO 01-01 hf_file_system.py:1] resolved /model/models/Qwen2 (a local repository)\n", "model-files-missing"),
        ("DataLoader worker (pid 12) exited normally\n", "shm-too-small"),
        ("RuntimeError: unable to write to file </tmp/data.bin>: No space left on device (28)\n", "shm-too-small"),
        (
            "(raylet) [2022-08-29 15:18:33,592 I 1 1] (raylet) System memory at node with IP 172.17.0.2 is fine\n",
            "host-out-of-memory",
        ),
        ("INFO text_generation_router: Warming up with 31000 prefill tokens\n", "out-of-memory"),
        ("NVRM: GPU0 nvCheckFailedNoLog: Check failed: Out of memory [NV_ERR_NO_MEMORY] (0x00000051)\n", "gpu-lost"),
        ("cuInit err: 0\n", "no-gpu-visible"),
        ("[2023-08-09 22:39:16,002 I 209 223] (raylet) object_manager.cc:1: store started\n", "unclassified-error"),
        # Python's warnings format is not an error line, whatever its words (sglang#22987's check_env)
        (
            "/usr/local/lib/python3.12/dist-packages/requests/__init__.py:86: RequestsDependencyWarning: Unable to find acceptable character detection dependency (chardet or charset_normalizer).\n",
            "unclassified-error",
        ),
    ],
)
def test_a_near_line_is_not_that_class(line: str, cls: str) -> None:
    assert primary(line) != cls


def test_a_warnings_line_a_class_names_still_counts_for_it() -> None:
    """huggingface_hub's free-space check is a warnings.warn line too: disk-full still reads it."""
    line = "/usr/lib/python3/dist-packages/huggingface_hub/file_download.py:1: UserWarning: Not enough free disk space to download the file. The expected file size is: 9000 MB.\n"
    assert primary(line) == "disk-full"


test_batch_log_gets_its_class, test_the_index_is_the_folder_and_the_left_ones_are_in_it = held_batch_tests(
    BATCH, LEFT, logs=44, failing=32
)
