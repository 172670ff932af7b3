# ruff: noqa: E501 (realistic log lines are long; wrapping them would change what is matched)
"""Issue 44: the fresh batches of real pastes collected after the 'beyond' held-out half had been seen.

Each of fresh/ to fresh6/ missed the bar on its first run (its FIRST-RUN.txt) and is tune data since: held
log by log (fresh6/ since diag5). fresh7/ (diag5, the users' own domain) too, after its first run, which stays a floor. Each rule tuned
on fresh/ is proven both ways here, with a line that must name its class and one that must not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.test_diagnosis_beyond import BEYOND, HALVES, LOGS, benchmark, held_out_figures
from tests.unit.test_diagnosis_unseen import labelled_diagnosis
from verify.logs import logscan
from verify.logs.diagnosis import diagnose

BATCHES = (
    "fresh",
    "fresh2",
    "fresh3",
    "fresh4",
    "fresh5",
    "fresh6",
    "fresh7",
)  # in the order they were collected; each is held out until it misses
FRESH = {name: yaml.safe_load((BEYOND / name / "index.yaml").read_text())["logs"] for name in BATCHES}
# fresh/ to fresh6/ were tuned on after their first runs (fresh6/ by diag5), so each is held log by log, less
# the misses left standing: ollama/ollama#53's "unexpectedly reached end of file" is what llama.cpp's loader
# says for a truncated file as well as for an architecture it does not know, so no mechanism can tell the
# judgement label (config-error) from the text; it is held as a detected failure instead
TUNED = BATCHES
LEFT_MISSED = {
    ("fresh6", "ollama-53-ggml-unexpected-eof.log"),
    # the driver's NV_ERR_NO_MEMORY line is also logged on healthy GB10 starts (beyond/test's vllm-project/vllm#56824)
    ("fresh7", "dgx-spark-playbooks-97-gb10-nv-err-no-memory.log"),
    # vLLM's "No platform detected" is INFO and is logged before an out-of-tree platform plugin activates
    ("fresh7", "llm-d-deployer-273-k8s-no-platform-detected.log"),
}
TUNE_DATA = [(name, e) for name in TUNED for e in FRESH[name] if (name, e["file"]) not in LEFT_MISSED]
# fresh7/ (diag5) was collected from the users' own domain after the tuning on fresh6/, labelled and committed
# before its first run (fresh7/FIRST-RUN.txt: 10/17, 3 failures called clean, 2 clean called failures, the same
# as main's code), the held-out figure; it was tuned on after that (SPLIT.md), so it is held log by log above and
# its first run stays a floor
HELD_OUT_BATCH = "fresh7"
HELD_OUT = {"failing": 17, "right_class": 10, "wrong_incident": 0, "failing_called_clean": 3, "clean_called_failure": 2}
# fresh6/'s first run (fresh6/FIRST-RUN.txt), the held-out figure of diag4's mechanisms, stays a floor too
FRESH6_FIRST_RUN = {
    "failing": 18,
    "right_class": 10,
    "wrong_incident": 0,
    "failing_called_clean": 2,
    "clean_called_failure": 0,
}


def earlier_sources() -> set[str]:
    indexes = [
        LOGS / "real" / "index.yaml",
        LOGS / "unseen" / "tune" / "index.yaml",
        LOGS / "unseen" / "test" / "index.yaml",
    ]
    found = {e["source"] for index in indexes for e in yaml.safe_load(index.read_text())["logs"]}
    return found | {e["source"] for half in HALVES.values() for e in half}


@pytest.mark.parametrize("name", sorted(FRESH))
def test_a_fresh_batch_reuses_no_thread_and_is_labelled_whole(name: str) -> None:
    index, earlier = FRESH[name], earlier_sources()
    for before in BATCHES[: BATCHES.index(name)]:
        earlier |= {e["source"] for e in FRESH[before]}
    assert {e["file"] for e in index} == {p.name for p in (BEYOND / name).glob("*.log")}
    assert len({e["source"] for e in index}) == len(index) >= 24
    for e in index:
        assert e["source"] not in earlier and e["why"].strip(), e["file"]
        assert (e["class"] == "none") == (e["status"] == "clean") and e["incident"] == "none", e["file"]
        assert e["url"].startswith("https://github.com/") and "/issues/" in e["url"], e["file"]
    clean = sum(e["status"] == "clean" for e in index) / len(index)
    assert 0.2 <= clean <= 0.35, clean  # about a quarter clean, as the brief asks
    assert [e["file"] for e in benchmark().load_index(f"beyond-{name}")] == [e["file"] for e in index]


@pytest.mark.parametrize(("name", "entry"), TUNE_DATA, ids=[f"{n}/{e['file']}" for n, e in TUNE_DATA])
def test_fresh_tune_data_log_gets_its_class(
    name: str, entry: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    d = labelled_diagnosis(BEYOND / name / entry["file"], entry, capsys)
    if d is None:
        return
    assert d["incident"] is None


def test_a_miss_left_standing_is_as_recorded() -> None:
    # detected but unclassified, except the one called clean (fresh7's llm-d-deployer#273: INFO lines only)
    for name, file in sorted(LEFT_MISSED):
        d = diagnose((BEYOND / name / file).read_bytes())
        if file.startswith("llm-d-deployer-273"):
            assert d.verdict == "clean", file
            continue
        assert d.verdict == "failed" and d.primary is not None and d.primary.id == "unclassified-error", file


@pytest.mark.parametrize(("batch", "floor"), [(HELD_OUT_BATCH, HELD_OUT), ("fresh6", FRESH6_FIRST_RUN)])
def test_a_first_run_figure_does_not_regress(batch: str, floor: dict[str, int]) -> None:
    got = held_out_figures(BEYOND / batch, FRESH[batch])
    assert got["failing"] == floor["failing"] and got["right_class"] >= floor["right_class"], got
    for key in ("wrong_incident", "failing_called_clean", "clean_called_failure"):
        assert got[key] <= floor[key], (key, got)


@pytest.mark.parametrize(
    ("text", "cls"),
    [
        # the older driver's one line and the RM probe's three (Bumblebee-Project/Bumblebee#554, NVIDIA/NVSentinel#155)
        ("[   49.261458] NVRM: GPU at 0000:01:00.0 has fallen off the bus.\n", "gpu-lost"),
        (
            "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n               NVRM: (PCI ID: 10de:26b5) installed in this system has\n               NVRM: fallen off the bus and is not responding to commands.\n",
            "gpu-lost",
        ),
        # TensorRT-LLM's C++ runtime and its PyTorch executor (tensorrtllm_backend#281, TensorRT-LLM#5950)
        (
            "[TensorRT-LLM][ERROR] CUDA runtime error in ::cudaMallocAsync(ptr, n, mCudaStream->get()): out of memory (/app/tensorrt_llm/cpp/tensorrt_llm/runtime/tllmBuffers.h:112)\n",
            "out-of-memory",
        ),
        ("RuntimeError: Executor creation failed due to insufficient GPU memory.\n", "out-of-memory"),
        # a template's raise through JavaScript's Jinja (withcatai/node-llama-cpp#263)
        ("Error: Conversation roles must alternate user/assistant/user/assistant/...\n", "chat-template-error"),
        # the NVIDIA container hook's CUDA requirement: the driver is what to change (vllm-project/vllm#5635)
        (
            "docker: Error response from daemon: failed to create task for container: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: error during container init: error running hook #0: error running hook: exit status 1, stdout: , stderr: Auto-detected mode as 'legacy'\nnvidia-container-cli: requirement error: unsatisfied condition: cuda>=12.4, please update your driver to a newer version, or use an earlier cuda container: unknown.\n",
            "driver-too-old",
        ),
        # tuned on the second fresh batch: CUDA's device-side assertion lines alone (haotian-liu/LLaVA#882)
        (
            '../aten/src/ATen/native/cuda/IndexKernel.cu:92: operator(): block: [0,0,0], thread: [92,0,0] Assertion `index >= -sizes[i] && index < sizes[i] && "index out of bounds"` failed.\n',
            "device-side-assert",
        ),
        # dockerd's port publishing and Go's bind (ipostolaki/Comeo#2, woodjme/unifi-hotspot#11)
        (
            "ERROR: for django  Cannot start service django: driver failed programming external connectivity on endpoint comeo_django_1 (0e09c4fc61): Bind for 0.0.0.0:80 failed: port is already allocated\n",
            "port-in-use",
        ),
        (
            "docker: Error response from daemon: driver failed programming external connectivity on endpoint elastic_burnell (bbb96e93): Error starting userland proxy: listen tcp 0.0.0.0:80: bind: address already in use.\n",
            "port-in-use",
        ),
        # older ggml-cuda's check (ggml-org/llama.cpp#3199)
        ("CUDA error 2 at /data/llama.cpp/ggml-cuda.cu:5509: out of memory\ncurrent device: 0\n", "out-of-memory"),
        # P2P refused where the engine does not go on without it
        ("RuntimeError: CUDART error: peer access is not supported between these two devices\n", "p2p-unsupported"),
        # tuned on the third fresh batch: Go's ENOSPC while Docker extracts a layer (NVIDIA-NeMo/Speech#1029)
        (
            "failed to register layer: Error processing tar file(exit status 1): write /opt/conda/lib/python3.6/site-packages/torch/lib/libtorch.so: no space left on device.\n",
            "disk-full",
        ),
        # a shell's bare "Killed" (castorini/hedwig#70), ZeroMQ's bind (jina-ai/clip-as-service#84)
        ("100%|##########| 3000001/3000001 [03:33<00:00, 14061.26it/s]\nKilled\n", "host-out-of-memory"),
        ("zmq.error.ZMQError: Address already in use\n", "port-in-use"),
        # nvidia-smi without the GPU's handle (rwth-i6/returnn#1486), flash-attn's arch check (vllm-project/vllm#8189)
        ("Unable to determine the device handle for GPU0000:03:00.0: Unknown Error\n", "gpu-lost"),
        ("RuntimeError: FlashAttention only supports Ampere GPUs or newer.\n", "unsupported-on-gpu"),
        # tuned on the fourth fresh batch: a model directory without its config (vllm-project/vllm#13150)
        (
            "ValueError: No supported config format found in Benasd/Qwen2.5-VL-72B-Instruct-Pointer-AWQ\n",
            "model-files-missing",
        ),
        ("RuntimeError: CUDA error: invalid device ordinal\n", "config-error"),
        ("model-download-1  | /models/download-ggml-model.sh: Permission denied\n", "permission-denied"),
        (
            "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:268, remote process exited or there was a network error, NCCL version 2.21.5\n",
            "nccl-error",
        ),
        ("Error: ShardCannotStart\n", "engine-init-failed"),
        (
            "Error: listen tcp 127.0.0.1:11434: bind: Only one usage of each socket address (protocol/network address/port) is normally permitted.\n",
            "port-in-use",
        ),
        # tuned on the fifth fresh batch: NVML refused in a container, a config.json or GGUF file absent, an
        # architecture newer than llama.cpp, llama-server's argument parser (NVIDIA/nvidia-container-toolkit#210,
        # InternLM/lmdeploy#1299, ggml-org/llama.cpp#15919, ollama/ollama#3904, oobabooga/textgen#7237)
        ("Failed to initialize NVML: Insufficient Permissions\n", "container-gpu-runtime"),
        ("FileNotFoundError: [Errno 2] No such file or directory: '/models/qwen/config.json'\n", "model-files-missing"),
        ("gguf_init_from_file: failed to open GGUF file '/models/gemma-3-12b-it-q4_0.gguf'\n", "model-files-missing"),
        (
            "llama_model_load: error loading model: error loading model architecture: unknown model architecture: 'phi3'\n",
            "config-error",
        ),
        (
            "error while handling argument \"--flash-attn\": error: unkown value for --flash-attn: '--numa'\n",
            "config-error",
        ),
    ],
)
def test_a_rule_tuned_on_the_fresh_batch_names_its_class(text: str, cls: str) -> None:
    d = diagnose(text.encode())
    assert d.verdict == "failed" and d.primary is not None and d.primary.id == cls, d.summary()


@pytest.mark.parametrize(
    "text",
    [
        # a healthy probe and a bus that is fine, an executor that was created, a template that rendered
        "[    2.112233] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  570.158.01  Release Build\n",
        "[TensorRT-LLM][INFO] Executor creation succeeded; free GPU memory after creation: 12.31 GiB\n",
        "INFO 11-30 10:00:00 [chat_utils.py:1] Detected the chat template content format to be 'string'.\n",
        "I1128 17:35:08.651661 1737 nvc.c:376] initializing library context (version=1.14.3)\n",
        "INFO 11-30 10:00:00 [utils.py:1] device-side assertions are compiled in (TORCH_USE_CUDA_DSA)\n",
        "WARNING 11-30 10:00:00 [utils.py:1] port 8000 is already allocated to another service; using 8001\n",
        "INFO 11-30 10:00:00 [worker.py:1] Killed 3 idle workers after 600 s\n",
        "INFO 11-30 10:00:00 [selector.py:1] Cannot use FlashAttention-2 backend for Volta and Turing GPUs.\n",
        "Filesystem      Size  Used Avail Use% Mounted on\n/dev/nvme0n1p7  217G   63G  143G  31% /\n",
        "INFO 12-25 11:51:25 [config.py:1] Found config.json in /models/qwen (config format: hf)\n",
        "INFO 11-30 10:00:00 [x.py:1] /tmp/cache: Permission denied at first, retried in /var/tmp and went on\n",
        "2024-05-01T01:17:02.618817Z  INFO shard-manager: text_generation_launcher: Shard ready in 12.5s rank=0\n",
        "INFO 11-30 10:00:00 [nvml.py:1] NVML initialized: 8 GPUs, driver 570.158.01\n",
        "INFO 11-30 10:00:00 [config.py:1] no generation_config.json in /models/qwen; using the model's defaults\n",
        "llama_model_loader: loaded meta data with 34 key-value pairs and 389 tensors from /models/m.gguf (version GGUF V3 (latest))\n",
        "llm_load_print_meta: arch             = phi3\n",
    ],
)
def test_the_lines_around_those_rules_stay_clean(text: str) -> None:
    assert diagnose(text.encode()).verdict == "clean"


def test_a_warning_the_engine_goes_on_after_is_not_taken_for_an_error_line() -> None:
    # sgl-project/sglang#12496: SGLang skips custom all-reduce without P2P and says so; the catalog knows the
    # line as p2p-unavailable (warn), so neither p2p-unsupported nor the error-line extractor takes it
    line = "[2025-11-01 16:50:36 TP1] Setup Custom allreduce failed with CUDART error: peer access is not supported between these two devices. To silence this warning, specify --disable-custom-all-reduce explicitly.\n"
    d = diagnose(line.encode())
    assert d.verdict == "clean" and [w.id for w in d.warnings] == ["p2p-unavailable"], d.summary()
    # the same extractor still takes an error line the catalog does not know
    other = diagnose(b"[2025-11-01 16:50:36 TP1] Setup NCCL failed with CUDART error: unspecified launch failure\n")
    assert other.verdict == "failed" and other.primary is not None and other.primary.id == "unclassified-error"


def test_a_case_insensitive_group_gives_no_case_sensitive_prefilter() -> None:
    # the prefilter looks for its literals with bytes.find: a (?i:...) group's letters cannot be one
    assert logscan._anchors("(?i:conversation roles must alternate)") is None
    assert logscan._anchors("Error: (?i:roles) must alternate") == [" must alternate"]
    assert logscan._anchors("conversation roles must alternate") == ["conversation roles must alternate"]


def test_the_benchmark_reads_every_fresh_batch() -> None:
    bench = benchmark()
    assert all(bench.SETS[f"beyond-{name}"] == BEYOND / name for name in BATCHES)
    assert all(Path(BEYOND / name / f"{name.upper()}.md").is_file() for name in BATCHES)
