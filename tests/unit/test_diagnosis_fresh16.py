# ruff: noqa: E501 (realistic log lines are long; wrapping them would change what is matched)
"""Issue 44: fresh16/, the sixteenth batch (collected and labelled by a helper that never ran stackproof, committed
at cbde667 under fresh14's tighter rule), scored once as a held-out batch at diag15 (FIRST-RUN.txt: 13/28, three
failures called clean) and seen since: the mechanisms written for its misses, each proven both ways, and the batch
held log by log; the pastes left standing are strict xfails with the reason.
"""

from __future__ import annotations

import pytest

from tests.unit.test_diagnosis_beyond import BEYOND
from tests.unit.test_diagnosis_unseen import held_batch_tests, primary

BATCH = BEYOND / "fresh16"
_RAISED_LAST = (
    "a Python raise line ends the paste, and a Python exception is what the lines show (the labeller's other reading): "
)
LEFT = {
    "sd-webui-tensorrt-54-trtexec-plugin-not-found-engine-setup-failed.log": _RAISED_LAST
    + "trtexec's [E] lines above it, then the web UI's 'RuntimeError: Error running command.'",
    "autogptq-402-exllama-kernels-not-installed-importerror.log": _RAISED_LAST
    + "AutoGPTQ's ImportError for its exllama kernels",
    "basaran-289-hf-401-unauthorized-tokenizer-config-llama2.log": "a Hugging Face 401 for a gated model's file "
    "through requests' HTTPError: access to the hub repo, which neither permission-denied (a path this process may "
    "not write) nor model-files-missing names; a Python exception",
}


@pytest.mark.parametrize(
    ("line", "cls"),
    [
        (
            '(EngineCore_DP0 pid=1511501) ERROR 12-15 18:57:10 [core.py:918] ValueError: Loading lora ["table_qc failed: No adapter found for /data/output/checkpoint-57"]\n',
            "model-files-missing",
        ),
        (
            "ERROR:root:fail to locate model file for model sklearn-iris under dir /mnt/models,trying loading from model repository.\n",
            "model-files-missing",
        ),
        (
            "huggingface_hub.errors.RepositoryNotFoundError: 401 Client Error. (Request ID: Root=1-68a1df1f)\nRepository Not Found for url: https://huggingface.co/api/models/xcodec_tps25_0215/revision/main.\n",
            "model-files-missing",
        ),
        (
            "2025-04-29 22:14:28.456 | ValueError: Invalid repository ID or local directory specified: '/models'.\n",
            "model-files-missing",
        ),
        (
            "ERROR: [request 7533] Leave chat, error: You set image=2 (or defaulted to 1) in `--limit-mm-per-prompt`, but passed 3 image items in the same prompt., elapsed time: 0 s\n",
            "config-error",
        ),
        (
            "openai.BadRequestError: Error code: 400 - {'object': 'error', 'message': 'At most 1 image(s) may be provided in one request.', 'type': 'BadRequestError', 'param': None, 'code': 400}\n",
            "config-error",
        ),
        (
            "Detailed export error: Weight shape is not divisible for block size for block quantization.\n",
            "config-error",
        ),
        (
            "ERROR: The Compose file './.devcontainer/docker-compose.yml' is invalid because:\nservices.instant-ngp.deploy.resources.reservations value 'devices' does not match any of the regexes: '^x-'\n",
            "container-error",
        ),
        (
            "E0526 16:43:07.419860 1 model_lifecycle.cc:597] failed to load 'ocr' version 1: Invalid argument: unable to load model 'ocr', TensorRT backend supports only GPU device\n",
            "no-gpu-visible",
        ),
        (
            "  \u00d7 No solution found when resolving dependencies:\n      And because you require vllm, we can conclude that your requirements are unsatisfiable.\n",
            "unclassified-error",
        ),
        (
            "2022-05-14T00:01:14.2115330Z E: Sub-process /usr/bin/dpkg returned an error code (1)\n",
            "unclassified-error",
        ),
        (
            "1758 -- Didn't receive health check response for replica Replica(id='rut1591v', deployment='vLLM:Qwen3-32B', app='RayServeApp') after 10.0s, marking it unhealthy.\n",
            "unclassified-error",
        ),
    ],
)
def test_a_real_line_names_its_class(line: str, cls: str) -> None:
    assert primary(line) == cls


@pytest.mark.parametrize(
    ("line", "cls"),
    [
        (
            "INFO 12-15 18:57:10 [worker_manager.py:90] Loaded adapter table_qc from /data/output/checkpoint-57\n",
            "model-files-missing",
        ),
        (
            "INFO 03-12 09:29:12 [processing.py:88] --limit-mm-per-prompt image=5: up to 5 image items per prompt\n",
            "config-error",
        ),
        (
            "Creating network \"devcontainer_default\" with the default driver\nThe Compose file './docker-compose.yml' is valid\n",
            "container-error",
        ),
        (
            "I0526 16:43:07.419860 1 model_lifecycle.cc:597] successfully loaded 'ocr' version 1 on GPU device 0\n",
            "no-gpu-visible",
        ),
    ],
)
def test_a_near_line_is_not_that_class(line: str, cls: str) -> None:
    assert primary(line) != cls


@pytest.mark.parametrize(
    "line",
    [
        "Resolved 142 packages in 1.20s\n",
        "Setting up nvidia-dkms-535 (535.183.01-0ubuntu1) ...\n",
        "INFO 2025-07-01 ray.serve: Replica(id='rut1591v') is healthy after its health check.\n",
    ],
)
def test_a_clean_line_stays_clean(line: str) -> None:
    assert primary(line) is None


test_batch_log_gets_its_class, test_the_index_is_the_folder_and_the_left_ones_are_in_it = held_batch_tests(
    BATCH, LEFT, logs=41, failing=28
)
