# ruff: noqa: E501 (realistic log lines are long; wrapping them would change what is matched)
"""Issue 44 (diag4): the diagnosis by mechanism, not wording, each proven both ways.

The error tables (errno, CUDA runtime, NVML, NCCL) name a class in any component's words; a process's
death is never clean; an error no pattern classifies gets its component's class; a line that calls itself
a warning is not an error line. Each rule here has a line that must name its class and one that must not.
Lines marked "format of" are written in that component's format (its source is cited in
verify/logs/failure_classes.yaml); the others are real lines from the threads named beside them.
"""

from __future__ import annotations

import pytest

from tests.unit.test_diagnosis_unseen import primary
from verify.logs.classes import load_classes
from verify.logs.components import component_class, component_text
from verify.logs.diagnosis import diagnose
from verify.logs.logscan import LogMatch


@pytest.mark.parametrize(
    ("text", "cls"),
    [
        # EADDRINUSE through Go (ollama/ollama#707), Python, Rust's io::Error
        ("Error: listen tcp 127.0.0.1:11434: bind: address already in use\n", "port-in-use"),
        ("OSError: [Errno 98] Address already in use\n", "port-in-use"),
        ('Error: Os { code: 98, kind: AddrInUse, message: "Address already in use" } (os error 98)\n', "port-in-use"),
        # ENOSPC through docker's layer extraction (NVIDIA-NeMo/Speech#1029) and node's fs (format of libuv)
        (
            "failed to register layer: Error processing tar file(exit status 1): write /opt/conda/lib/python3.6/site-packages/torch/lib/libtorch.so: no space left on device.\n",
            "disk-full",
        ),
        ("Error: ENOSPC: no space left on device, write\n", "disk-full"),
        # EACCES through node (format of libuv) and a shell
        ("Error: EACCES: permission denied, mkdir '/models/.cache'\n", "permission-denied"),
        ("OSError: [Errno 30] Read-only file system: '/models/llama/.locks'\n", "permission-denied"),
        # EMFILE, ENOMEM
        ("Error: EMFILE: too many open files, open '/data/shard-00017.safetensors'\n", "too-many-open-files"),
        ("OSError: [Errno 12] Cannot allocate memory\n", "host-out-of-memory"),
        ("terminate called after throwing an instance of 'std::bad_alloc'\n", "host-out-of-memory"),
        # the CUDA runtime's errors by number, name or string (ggml-org/llama.cpp#3199; format of torch 0.4)
        ("CUDA error 2 at /data/llama.cpp/ggml-cuda.cu:5509: out of memory\n", "out-of-memory"),
        (
            "RuntimeError: cuda runtime error (2) : out of memory at /pytorch/aten/src/THC/THCCachingAllocator.cpp:510\n",
            "out-of-memory",
        ),
        (
            "[TensorRT-LLM][ERROR] CUDA runtime error in ::cudaMallocAsync(ptr, n, mCudaStream->get()): out of memory\n",
            "out-of-memory",
        ),
        ("RuntimeError: CUDA error: no CUDA-capable device is detected\n", "no-gpu-visible"),
        ("RuntimeError: CUDA error: invalid device ordinal\n", "config-error"),
        ("cudaErrorInsufficientDriver: CUDA driver version is insufficient\n", "driver-too-old"),
        # NVML's and NCCL's result codes
        ("Failed to initialize NVML: GPU is lost\n", "gpu-lost"),
        (
            "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:268, unhandled system error\n",
            "nccl-error",
        ),
        # a model artefact named with its absence (format of transformers' hub.py and huggingface_hub)
        ("OSError: /models/llama does not appear to have a file named config.json.\n", "model-files-missing"),
        (
            "FileNotFoundError: [Errno 2] No such file or directory: '/models/llama/tokenizer.json'\n",
            "model-files-missing",
        ),
        # a GPU generation required (vllm-project/vllm#8189), a CLI parser's refusal (clap, Go's flag), an architecture
        ("RuntimeError: FlashAttention only supports Ampere GPUs or newer.\n", "unsupported-on-gpu"),
        ("error: unexpected argument '--max-batch-size' found\n", "config-error"),
        ("flag provided but not defined: -modelpath\n", "config-error"),
        (
            "llama_model_load: error loading model: error loading model architecture: unknown model architecture: 'phi3'\n",
            "config-error",
        ),
        # Python's exception types for EACCES and a failed host allocation; cuBLAS's and CUDA's code tables
        ("PermissionError: [Errno 1] Operation not permitted: '/dev/nvidia0'\n", "permission-denied"),
        ("MemoryError\n", "host-out-of-memory"),
        (
            "RuntimeError: CUBLAS_STATUS_ARCH_MISMATCH when calling `cublasGemmEx( handle, opa, opb, m, n, k)`\n",
            "unsupported-on-gpu",
        ),
        ("CUDA error 209 at /llama.cpp/ggml-cuda.cu:1234: no kernel image is available\n", "no-kernel-image"),
        (
            "RuntimeError: cuda runtime error (710) : device-side assert triggered at /pytorch/aten/src/THC/generic/THCTensorMath.cu:26\n",
            "device-side-assert",
        ),
        ("CUDA_ERROR_UNSUPPORTED_PTX_VERSION\n", "driver-too-old"),
        # an engine's part that failed to start (huggingface/text-generation-inference#1627)
        ("2024-03-06T17:53:31.149443Z ERROR text_generation_launcher: Shard 0 failed to start\n", "engine-init-failed"),
    ],
)
def test_an_error_table_names_the_class_in_any_components_words(text: str, cls: str) -> None:
    assert primary(text) == cls, diagnose(text.encode()).summary()


@pytest.mark.parametrize(
    "text",
    [
        # the same words where the writer says they are not an error, or not this one
        "INFO 01-11 13:09:40 api_server.py:12] port 8000: address already in use, trying 8001\n",
        "WARNING 01-11 13:09:40 utils.py:12] /tmp: no space left on device would stop the compile cache\n",
        "INFO 01-11 13:09:40 utils.py:12] CUDA graph memory: 0.52 GiB; out of memory errors are retried\n",
        "INFO 01-11 13:09:40 config.py:12] generation_config.json not found, using defaults\n",
        "llm_load_print_meta: arch             = phi3\n",
        # sgl-project/sglang#12496: a line that calls itself a warning
        "[2025-11-01 16:50:36 TP1] Setup Custom allreduce failed with CUDART error: peer access is not supported between these two devices. To silence this warning, specify --disable-custom-all-reduce explicitly.\n",
        # a clean exit
        "model-download-1 exited with code 0\n",
        "WARNING 01-11 13:09:40 client.py:12] connection refused, retrying in 1 s\n",
    ],
)
def test_the_same_words_quiet_or_benign_stay_clean(text: str) -> None:
    assert diagnose(text.encode()).verdict == "clean", diagnose(text.encode()).summary()


@pytest.mark.parametrize(
    "text",
    [
        "FileNotFoundError: [Errno 2] No such file or directory: '/data/train.jsonl'\n",  # not a model artefact
        "RuntimeError: CUDA error: unspecified launch failure\n",  # a CUDA error with no class of its own
        "CUDA error 2090 at /llama.cpp/ggml-cuda.cu:1234: x\n",  # a number is read whole
        "ValueError: MemoryError is raised when the host runs out\n",  # the type named in a message
    ],
)
def test_a_table_does_not_reach_past_its_entries(text: str) -> None:
    assert primary(text) in ("python-exception", "unclassified-error")


@pytest.mark.parametrize(
    "text",
    [
        "Aborted (core dumped)\n",  # bash's report of SIGABRT
        "python3: ../nptl/pthread_mutex_lock.c:81: __pthread_mutex_lock: Assertion `mutex->__data.__owner == 0' failed.\n",  # glibc assert
        "panic: runtime error: invalid memory address or nil pointer dereference\n",  # Go's runtime
        "model-download-1 exited with code 1\n",  # compose v2 (tannisroot/wyoming-whisper-cpp-intel-gpu-docker#6)
        "ERROR 01-11 13:09:40 multiproc_worker_utils.py:123] Worker VllmWorkerProcess pid 26961 died, exit code: -15\n",  # vllm-project/vllm#8189
        "srv    load_model: failed to load model, '/home/user/models/gemma-3-12b-it-qat-q4_0.gguf'\n",  # llama-server's format
        "/run.sh: line 16: ./download-ggml-model.sh: No such file or directory\n",  # ENOENT through a shell
        "/entrypoint.sh: line 3: vllm: command not found\n",  # bash's exit 127
    ],
)
def test_a_process_dying_or_failing_a_step_is_never_clean(text: str) -> None:
    assert diagnose(text.encode()).verdict == "failed", text


def test_the_exit_is_quoted_with_the_line_before_it() -> None:
    log = b"model-download-1  | Failed to download medium model\nmodel-download-1 exited with code 1\n"
    d = diagnose(log)
    assert d.primary is not None and d.primary.id == "unclassified-error"
    assert "Failed to download medium model" in d.summary() and "exited with code 1" in d.summary(), d.summary()
    bare = diagnose(b"Loading checkpoint shards: 100%\nAborted (core dumped)\n")
    assert bare.primary is not None and "the last line before it: Loading checkpoint shards" in bare.summary()
    # an error line with no exit after it is quoted alone
    alone = diagnose(b"ERROR 01-11 13:09:40 x.py:1] something odd\n")
    assert alone.primary is not None and "then, line" not in alone.summary()


@pytest.mark.parametrize(
    ("text", "cls"),
    [
        # the binary a line starts with (format of nvidia-container-cli, src/cli/main.c)
        (
            "nvidia-container-cli: mount error: file creation failed: /var/lib/docker/overlay2/x/merged/run/nvidia-persistenced/socket\n",
            "container-gpu-runtime",
        ),
        ("containerd: failed to start shim: context canceled\n", "container-error"),
        # a Node stack below the error (withcatai/node-llama-cpp#263)
        (
            "Error: Conversation roles must alternate user/assistant/user/assistant/...\n"
            "    at ~/p/node_modules/@huggingface/jinja/dist/index.js:1555:13\n",
            "chat-template-error",
        ),
        # a CUDA kernel's own assert (haotian-liu/LLaVA#882)
        (
            '../aten/src/ATen/native/cuda/IndexKernel.cu:92: operator(): block: [0,0,0], thread: [92,0,0] Assertion `index >= -sizes[i] && index < sizes[i] && "index out of bounds"` failed.\n',
            "device-side-assert",
        ),
        # a Python exception whose type names the component
        ("nats.errors.NoServersError: nats: no servers available for connection\n", "control-plane-unreachable"),
    ],
)
def test_an_unclassified_error_gets_its_components_class(text: str, cls: str) -> None:
    assert primary(text) == cls, diagnose(text.encode()).summary()


@pytest.mark.parametrize(
    "text",
    [
        # the component is in the message, not the writer: not mapped
        "[2025-11-01 16:50:36 TP1] Setup NCCL failed with CUDART error: unspecified launch failure\n",
        # a .cu path inside a message (not the assert format)
        "CUDA error 719 at /data/llama.cpp/ggml-cuda.cu:100: unspecified launch failure\n",
        "ERROR 01-11 13:09:40 engine.py:366] RuntimeError: Error in model execution\n",
    ],
)
def test_a_component_named_only_in_the_message_is_not_mapped(text: str) -> None:
    assert primary(text) in ("python-exception", "unclassified-error"), diagnose(text.encode()).summary()


def test_components_are_read_from_the_head_frames_and_exception() -> None:
    classes = load_classes()
    found = LogMatch(id="exception", kind="evidence", line_no=1, line="zmq.error.ZMQError: Address already in use")
    text = component_text(b"zmq.error.ZMQError: Address already in use\n", found, None)
    assert text.splitlines() == ["zmq.error.ZMQError"]
    assert component_class(classes, "ERROR\nnvidia-container-cli") is not None
    assert component_class(classes, "ERROR\nvllm") is None


def test_every_class_pattern_has_a_literal_for_the_scans_prefilter() -> None:
    # a pattern without one is run on every line of a 200 MB log (benchmarks/logscan.py's goal: grep's throughput);
    # a global (?i) is what takes it away, so the mechanisms spell their case variants ([Aa]ddress already in use)
    from verify.logs import logscan
    from verify.logs.classes import catalog_rules

    rules = [r for r in catalog_rules(load_classes()) if r.id.startswith("class:")]
    assert [r.id for r in rules if logscan._anchors(r.pattern) is None] == []
    assert logscan._anchors("(?i)\\baddress already in use\\b") is None
    assert logscan._anchors("\\b[Aa]ddress already in use\\b") == ["ddress already in use"]


# The same error line twice, each copy with its own frames (format of Node's stack: "    at f (file:line:col)"):
# the first from the app, the second from @huggingface/jinja rendering a chat template.
_REPEATED = b"""Error: Cannot read properties of undefined (reading 'x')
    at handle (/app/server.js:10:5)
    at run (/app/server.js:20:3)
Error: Cannot read properties of undefined (reading 'x')
    at Environment.evaluate (/app/node_modules/@huggingface/jinja/dist/index.js:1:100)
    at Template.render (/app/node_modules/@huggingface/jinja/dist/index.js:2:200)
"""


def test_a_repeated_error_line_reads_the_frames_below_its_own_copy() -> None:
    line = _REPEATED.decode().splitlines()[0]
    first = component_text(_REPEATED, LogMatch(id="e", kind="evidence", line_no=1, line=line), None)
    second = component_text(_REPEATED, LogMatch(id="e", kind="evidence", line_no=4, line=line), None)
    assert "server.js" in first and "jinja" not in first
    assert "jinja" in second and "server.js" not in second


def test_the_frames_of_a_later_copy_do_not_name_the_first_copys_component() -> None:
    # the diagnosis quotes the first copy; its frames are the app's, so no chat-template class from the second's
    assert primary(_REPEATED.decode()) == "unclassified-error"
    swapped = b"\n".join([*_REPEATED.splitlines()[3:], *_REPEATED.splitlines()[:3]]) + b"\n"
    assert primary(swapped.decode()) == "chat-template-error"
