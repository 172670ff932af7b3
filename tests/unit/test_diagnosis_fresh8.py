# ruff: noqa: E501 (realistic log lines are long; wrapping them would change what is matched)
"""Issue 44 (diag6): the mechanisms written for the misses of fresh8/'s tune half, each proven both ways, and that
half held log by log.

fresh8/ was split by its own salted hash before anything ran (FRESH8.md); only fresh8/tune/ is read here or was
tuned on. fresh8/test/ is the held-out half: no test opens it. Each real line (from the fresh8/tune/ thread named
beside it) must name its class; each near-miss (in the same component's format, saying something that is not that
failure) must not. verify/logs/failure_classes.yaml cites the upstream source line of each.

diag9: fresh8/test/ was scored once (FIRST-RUN.txt, 5/18) and is seen from then on (SPLIT.md): its misses were
tuned on by mechanism below, and the half is held log by log like the tune half; the two pastes left standing are
strict xfails with the reason.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.unit.test_diagnosis_beyond import BEYOND
from tests.unit.test_diagnosis_unseen import labelled_diagnosis, primary
from verify.logs.diagnosis import diagnose

TUNE = BEYOND / "fresh8" / "tune"
TUNE_HALF = yaml.safe_load((TUNE / "index.yaml").read_text())["logs"]
TEST = BEYOND / "fresh8" / "test"
TEST_HALF = yaml.safe_load((TEST / "index.yaml").read_text())["logs"]
# Left standing after diag9, each with why (the label is kept; no rule is bent to it)
LEFT = {
    "kserve-3562-openshift-hf-cache-not-writable.log": "labelled cache-dir-missing, but its one error line is transformers' "
    "'There was a problem when trying to write in your cache folder ... set TRANSFORMERS_CACHE to a writable directory' "
    "(utils/hub.py: the makedirs/open of the cache under HOME=/ raised, EACCES for a non-root UID): a cache that cannot "
    "be written, permission-denied, the reading the labeller names as the other one",
    "vllm-12847-docker-no-platform-detected.log": "its only evidence is vLLM's INFO 'No platform detected, vLLM is running "
    "on UnspecifiedPlatform', which a server that went on to serve also logs (vllm-project/vllm#23661); the failure the "
    "thread reports (Failed to infer device type, no-gpu-visible now) is not in the paste (as fresh7's llm-d-deployer#273)",
    "clean-vllm-33545-local-path-repo-id-retries.log": "labelled clean (a judgement call), but the paste ends on the last "
    "attempt's ERROR (no 'retrying'), which vLLM's with_retry re-raises, and nothing shows the server going on; "
    "'Repo id must be in the form' for a local path is exactly what a path missing on this node gives (model-files-missing)",
}


@pytest.mark.parametrize("entry", TUNE_HALF, ids=[e["file"] for e in TUNE_HALF])
def test_tune_half_log_gets_its_class(entry: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    d = labelled_diagnosis(TUNE / entry["file"], entry, capsys)
    if d is None:
        return
    assert d["incident"] is None and "Traceback (most recent call last)" not in d["summary"]
    assert not d["summary"].startswith("python-exception")  # each is named at its mechanism


@pytest.mark.parametrize(
    "entry",
    [
        pytest.param(e, marks=pytest.mark.xfail(strict=True, reason=LEFT[e["file"]])) if e["file"] in LEFT else e
        for e in TEST_HALF
    ],
    ids=[e["file"] for e in TEST_HALF],
)
def test_test_half_log_gets_its_class(entry: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    d = labelled_diagnosis(TEST / entry["file"], entry, capsys)
    if d is None:
        return
    assert d["incident"] is None and "Traceback (most recent call last)" not in d["summary"]
    assert not d["summary"].startswith("python-exception")


def test_the_test_half_is_the_whole_index_and_the_left_ones_are_in_it() -> None:
    assert {e["file"] for e in TEST_HALF} == {p.name for p in TEST.glob("*.log")}
    assert len(TEST_HALF) == 25 and sum(e["status"] == "failing" for e in TEST_HALF) == 18
    assert set(LEFT) <= {e["file"] for e in TEST_HALF}


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
        # diag9 (fresh8's test half, after its first run): the GPU's ways into a container in older and other runtimes'
        # words: runc before 1.0 (NVIDIA/nvidia-docker#1225), crun running the CDI spec's nvidia-ctk hook
        # (NixOS/nixpkgs#278969), the NVIDIA runtime itself failing (NVIDIA/nvidia-container-runtime#68)
        (
            '/run/torcx/bin/docker: Error response from daemon: OCI runtime create failed: container_linux.go:348: starting container process caused "process_linux.go:402: container init caused \\"process_linux.go:385: running prestart hook 1 caused \\\\\\"error running hook: exit status 1, stdout: , stderr: nvidia-container-cli.real: initialization error: driver error: failed to process request\\\\\\\\n\\\\\\"\\"": unknown.\n',
            "container-gpu-runtime",
        ),
        (
            'docker: Error response from daemon: OCI runtime create failed: container_linux.go:345: starting container process caused "process_linux.go:424: container init caused \\"process_linux.go:407: running prestart hook 0 caused \\\\\\"error running hook: exit status 1\\\\\\"\\"": unknown.\n',
            "container-gpu-runtime",
        ),
        (
            "nvidia-container-cli.real: mount error: file creation failed: /var/lib/docker/overlay2/x/merged/usr/bin/nvidia-smi: file exists\n",
            "container-gpu-runtime",
        ),
        (
            'Error: OCI runtime error: crun: {"msg":"error executing hook `/run/current-system/sw/bin/nvidia-ctk` (exit code: 1)","level":"error","time":"..."}\n',
            "container-gpu-runtime",
        ),
        (
            "Error: OCI runtime error: crun: error executing hook `/usr/bin/nvidia-container-toolkit` (exit code: 1)\n",
            "container-gpu-runtime",
        ),
        (
            "docker: Error response from daemon: OCI runtime create failed: unable to retrieve OCI runtime error (open /run/containerd/io.containerd.runtime.v1.linux/moby/af42/log.json: no such file or directory): nvidia-container-runtime did not terminate sucessfully: 2019/07/23 17:28:30 ERROR: nvidia-container-runtime: inject NVIDIA hook: stat /usr/bin/nvidia-container-runtime-hook: no such file or directory\n",
            "container-gpu-runtime",
        ),
        # the device plugin that found no GPU (NVIDIA/k8s-device-plugin#414); vLLM with no platform (vllm-project/vllm#13946)
        ("2023/06/12 09:21:25 No devices found. Waiting indefinitely.\n", "no-gpu-visible"),
        (
            '    raise RuntimeError("Failed to infer device type")\nRuntimeError: Failed to infer device type\n',
            "no-gpu-visible",
        ),
        # TensorRT's allocators out of device memory in an engine build (NVIDIA/TensorRT-LLM#346, huggingface/optimum-nvidia#146)
        (
            "[11/10/2023-06:30:40] [TRT] [E] 2: [virtualMemoryBuffer.cpp::resizePhysical::140] Error Code 2: OutOfMemory (no further information)\n",
            "out-of-memory",
        ),
        (
            "[08/11/2024-06:10:36] [TRT] [E] [globWriter.cpp::makeResizableGpuMemory::435] Error Code 2: OutOfMemory (Requested size was 16654532608 bytes.)\n",
            "out-of-memory",
        ),
        (
            "[03/01/2024-10:00:00] [TRT] [E] 1: [defaultAllocator.cpp::allocate::20] Error Code 1: Cuda Runtime (out of memory)\n",
            "out-of-memory",
        ),
        # vLLM V0's front end reporting the engine process gone (vllm-project/vllm#10812)
        ("ERROR 12-01 13:05:02 client.py:282] RuntimeError('Engine process (pid 76) died.')\n", "engine-dead"),
        (
            "CRITICAL 12-01 13:05:02 launcher.py:99] MQLLMEngine is already dead, terminating server process\n",
            "engine-dead",
        ),
        # NCCL's socket connect refused by the OS, beneath the engine's death (sgl-project/sglang#3820)
        (
            "node5:240:240 [6] misc/socket.cc:533 NCCL WARN socketPollConnect: Connect to 10.0.0.4<56849> returned 113(No route to host) errno 115(Operation now in progress)\n[2025-02-24 14:09:34 TP14] Scheduler hit an exception: Traceback (most recent call last):\n",
            "nccl-error",
        ),
        # Triton without the model's backend (triton-inference-server/server#7950)
        (
            "E0120 08:28:09.425599 2049 model_lifecycle.cc:654] \"failed to load 'tensorrt_llm' version 1: Invalid argument: unable to find backend library for backend 'tensorrtllm', try specifying runtime on the model configuration.\"\n",
            "config-error",
        ),
        (
            "E0120 08:28:09.425599 2049 model_lifecycle.cc:654] failed to load 'preprocessing' version 1: Invalid argument: unable to find 'libtriton_python.so' or 'python/model.py' for model 'preprocessing', in /opt/tritonserver/backends/python\n",
            "config-error",
        ),
        # Ray cannot place the parallelism asked for (ray-project/kuberay#4366)
        (
            "ValueError: Not enough resources to allocate 2 placement groups, only created 1 placement groups. Available resources: {'GPU': 1.0}\n",
            "config-error",
        ),
        (
            "ValueError: The number of required GPUs exceeds the total number of available GPUs in the placement group.\n",
            "config-error",
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
        # diag9: a hook that is not NVIDIA's, a hook that exited 0, the NVIDIA runtime named as configured, not failing
        (
            "Error: OCI runtime error: crun: error executing hook `/usr/libexec/oci/hooks.d/oci-systemd-hook` (exit code: 1)\n",
            "container-gpu-runtime",
        ),
        ("DEBU[0000] crun: executing hook `/usr/bin/nvidia-ctk` (exit code: 0)\n", "container-gpu-runtime"),
        ("INFO Runtimes: io.containerd.runc.v2 nvidia-container-runtime runc\n", "container-gpu-runtime"),
        # the device plugin that found its devices; vLLM's device inferred
        ("2023/06/12 09:21:25 Starting GRPC server for 'nvidia.com/gpu'\n", "no-gpu-visible"),
        ("INFO 05-14 04:44:35 [config.py:1433] Inferred device type: cuda\n", "no-gpu-visible"),
        # TensorRT's other error categories are not an out-of-memory; its warning of a retried allocation is advice
        (
            "[TRT] [E] 2: [optimizer.cpp::computeCosts::3728] Error Code 2: Internal Error (Assertion false failed.)\n",
            "out-of-memory",
        ),
        (
            "[TRT] [E] 1: [defaultAllocator.cpp::allocate::20] Error Code 1: Cuda Runtime (an illegal memory access was encountered)\n",
            "out-of-memory",
        ),
        # an engine process that exited as asked; an engine that is ready
        ("INFO 12-01 13:05:02 client.py:282] Engine process (pid 76) exited normally.\n", "engine-dead"),
        ("INFO 12-01 13:05:02 launcher.py:99] MQLLMEngine is ready\n", "engine-dead"),
        # NCCL's socket connect that went through
        ("node5:240:240 [6] NCCL INFO Connected to 10.0.0.4<56849>\n", "nccl-error"),
        # a backend that loaded; a placement group created
        (
            "I0120 08:28:09.437259 2049 backend_manager.cc:138] \"Loading backend library for backend 'tensorrtllm'\"\n",
            "config-error",
        ),
        ("INFO 01-12 05:53:37 utils.py:1] Created 2 placement groups for data parallel size 2\n", "config-error"),
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
        "2023/06/12 09:21:25 Starting GRPC server for 'nvidia.com/gpu'\n",
        "INFO 05-14 04:44:35 [config.py:1433] Inferred device type: cuda\n",
        "node5:240:240 [6] NCCL INFO Connected to 10.0.0.4<56849>\n",
        "I0120 08:28:09.437259 2049 backend_manager.cc:138] \"Loading backend library for backend 'tensorrtllm'\"\n",
        "[TRT] [W] Requested amount of GPU memory (1024 bytes) could not be allocated. There may not be enough free memory for allocation to succeed.\n",
    ],
)
def test_the_lines_around_those_mechanisms_stay_clean(text: str) -> None:
    assert diagnose(text.encode()).verdict == "clean", diagnose(text.encode()).summary()
