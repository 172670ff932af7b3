# ruff: noqa: E501 (realistic log lines are long; wrapping them would change what is matched)
"""Issue 44 (diag5): the mechanisms written for fresh6/'s misses after its first run, each proven both ways.

Each real line (from the fresh6/ thread named beside it) must name its class; each near-miss (written in the
same component's format, saying something that is not that failure) must not. verify/logs/failure_classes.yaml
cites the upstream source line of each.
"""

from __future__ import annotations

import pytest

from tests.unit.test_diagnosis_unseen import primary
from verify.logs.diagnosis import diagnose


@pytest.mark.parametrize(
    ("text", "cls"),
    [
        # the docker CLI's cobra refusal, with its usage hint (NVIDIA/gpu-monitoring-tools#112)
        ("unknown flag: --gpus\nSee 'docker run --help'.\n", "container-error"),
        # any stage of the NVIDIA hook, quoted inside the daemon's answer (NVIDIA/libnvidia-container#256)
        (
            "docker: Error response from daemon: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: error during container init: error running hook #0: error running hook: exit status 1, stdout: , stderr: Auto-detected mode as 'legacy'\nnvidia-container-cli: mount error: failed to add device rules: unable to generate new device filter program from existing programs: unable to create new device filters program: load program: invalid argument: 0: (69) r2 = *(u16 *)(r1 +0)\n",
            "container-gpu-runtime",
        ),
        # a runner built for another CPU (ollama/ollama#1019): an error line, no class of its own
        (
            "2023/11/08 13:26:51 llama.go:386: error starting the external llama runner: fork/exec /var/folders/2h/T/ollama1345459382/llama.cpp/gguf/build/metal/bin/ollama-runner: bad CPU type in executable\n",
            "unclassified-error",
        ),
        # TGI's model refused for lack of its sm80+ flash attention kernels (huggingface/text-generation-inference#686)
        (
            "NotImplementedError: Sharded Llama requires Flash Attention enabled models.\n rank=0\n2023-07-24T02:39:20.704629Z ERROR text_generation_launcher: Shard 0 failed to start\n",
            "unsupported-on-gpu",
        ),
        # a launcher naming the engine it could not start (instructlab/instructlab#3466)
        (
            "vLLM failed to start.  Retry with --enable-serving-output to learn more about the failure.\n",
            "engine-init-failed",
        ),
        # transformers naming the artefact it could not load (tenstorrent/tt-inference-server#177)
        (
            "E           OSError: Can't load tokenizer for 'stabilityai/stable-diffusion-3.5-medium'. If you were trying to load it from 'https://huggingface.co/models', make sure you don't have a local directory with the same name.\n",
            "model-files-missing",
        ),
        # a launcher's own torch.cuda.is_available() check (AUTOMATIC1111/stable-diffusion-webui#16189)
        (
            "RuntimeError: Torch is not able to use GPU; add --skip-torch-cuda-test to COMMANDLINE_ARGS variable to disable this check\n",
            "no-gpu-visible",
        ),
    ],
)
def test_a_fresh6_mechanism_names_its_class(text: str, cls: str) -> None:
    assert primary(text) == cls, diagnose(text.encode()).summary()


@pytest.mark.parametrize(
    ("text", "not_cls"),
    [
        # a flag refused by another cobra CLI (format of spf13/pflag): an error, not the container engine's
        ("Error: unknown flag: --gpus\nSee 'ollama run --help'.\n", "container-error"),
        # the hook's own informational lines name no error stage (format of libnvidia-container's debug log)
        ("nvidia-container-cli: initialization done, mounting driver libraries\n", "container-gpu-runtime"),
        # the launcher saying the engine started, or has not started yet
        ("INFO vLLM did start after 3 retries; serving on :8000\n", "engine-init-failed"),
        ("Waiting for vLLM to start on port 8000...\n", "engine-init-failed"),
        # flash attention named as an option, not as a requirement the GPU failed
        ("INFO Using Flash Attention enabled models for Llama\n", "unsupported-on-gpu"),
        # a tokenizer loaded, and a tokenizer that cannot *encode* (a different failure)
        ("INFO Loaded tokenizer for 'stabilityai/stable-diffusion-3.5-medium'\n", "model-files-missing"),
        # a GPU that cannot use a feature is not a GPU the process cannot see
        ("WARNING Cannot use GPU memory pool; falling back to the default allocator\n", "no-gpu-visible"),
        ("ERROR could not use CUDA kernel for rope; using the reference kernel\n", "no-gpu-visible"),
    ],
)
def test_a_near_miss_of_a_fresh6_mechanism_does_not_name_it(text: str, not_cls: str) -> None:
    assert primary(text) != not_cls, diagnose(text.encode()).summary()


def test_an_executable_for_another_cpu_is_an_error_and_a_format_word_alone_is_not() -> None:
    assert diagnose(b"exec /usr/bin/python3: exec format error\n").verdict == "failed"
    assert diagnose(b"INFO detected file format: gguf (executable bit unset)\n").verdict == "clean"
