"""The SGLang driver: every SGLang fact the checks use, keyed by release where it moved.

Lines cited are inside the released sglang wheels (a wheel's `sglang/X` is upstream `python/sglang/X`),
written `file:line @version`; the 0.5.18 facts were also seen live on a CPU server (the cell
sglang-cpu-tiny). Where a fact is the same in 0.5.17 and 0.5.18 but its line moved, both are cited;
where the checks read a fact per release (`Since`), each entry cites its own release.
"""

from __future__ import annotations

from verify.serving.driver import AutotuneFacts, LaunchSpec, MetricNames, ServingDriver, Since

__all__ = ["SGLANG"]

METRICS_FLAG = "--enable-metrics"


def _launch(spec: LaunchSpec) -> tuple[str, ...]:
    """`python3 -m sglang.launch_server --model-path M --host H --port N [--revision R]
    --enable-metrics` plus the cell's and the arm's args.

    The flags are ServerArgs fields: `model_path` (srt/server_args.py:492 @0.5.18, :483 @0.5.17),
    `revision` (:598 / :589), `host` and `port` (:1277-1278 / :1228-1229), `enable_metrics`
    (:1547 / :1492, default False). /metrics is mounted only with --enable-metrics
    (srt/entrypoints/http_server.py:285 @0.5.18) and the load stage's progress rule reads it, so
    the flag is added once unless the cell passes it. `python -m sglang.launch_server` still works
    in both releases; it only warns that `sglang serve` is recommended (launch_server.py:58 @0.5.18)."""
    serve = spec.serve
    argv = ["python3", "-m", "sglang.launch_server", "--model-path", serve.model.location]
    argv += ["--host", spec.host, "--port", str(spec.port)]
    if serve.model.kind == "hf" and serve.model.revision:
        argv += ["--revision", serve.model.revision]
    extra = (*serve.args, *(spec.arm.args if spec.arm else ()))
    if METRICS_FLAG not in extra:
        argv.append(METRICS_FLAG)
    return (*argv, *extra)


# The counters are declared with `_total` in their names and scraped so (`# TYPE
# sglang:prompt_tokens_total counter`, seen live at 0.5.18). `steps` is
# sglang:cuda_graph_passes_total: one increment per forward pass, labelled by `mode`
# (prefill_cuda_graph, prefill_none, decode_cuda_graph, decode_none); verify/load/progress.py sums a
# sample name over its labels, so the sum over the modes is the engine's step count. SGLang has no
# counter of the tokens those steps carried: `step_tokens` stays None. The warm-up request is
# counted and /health's generations step the engine too, so only before/after differences mean
# anything (the load stage diffs).
def _metrics(version: str, lines: str) -> MetricNames:
    return MetricNames(
        generated="sglang:generation_tokens_total",
        prompt="sglang:prompt_tokens_total",
        running="sglang:num_running_reqs",
        waiting="sglang:num_queue_reqs",
        steps="sglang:cuda_graph_passes_total",
        step_tokens=None,
        source=f"srt/observability/metrics_collector.py:{lines} @{version}",
    )


# generation, prompt, running, waiting, cuda_graph_passes (the `name=` lines)
_METRICS_0_5_17 = _metrics("0.5.17", "1487,1482,270,276,600")
_METRICS_0_5_18 = _metrics("0.5.18", "1519,1514,269,275,599")
# The same names through 0.5.23; only the lines moved (upstream-drift-4.md §1.2, read from the wheels).
_METRICS_LATER = {
    "0.5.20": _metrics("0.5.20", "1564,1559,280,286,610"),
    "0.5.21": _metrics("0.5.21", "1559,1554,282,288,623"),
    "0.5.22": _metrics("0.5.22", "1796,1791,357,363,718"),
    "0.5.23": _metrics("0.5.23", "1861,1856,365,371,738"),
}
# The two announcements and the cache variable: (flashinfer_autotune.py lines, environ.py line) per release.
_AUTOTUNE_LINES = {"0.5.20": ("261,269", 1060), "0.5.21": ("263,271", 1104), "0.5.22": ("277,287", 1144)}
_AUTOTUNE_LINES["0.5.23"] = ("304,314", 1278)


# FlashInfer autotuning runs only on CUDA (`mr.device != "cuda"` returns False) for the MoE,
# FP4 and FP8 GEMM backends that need it, and not with --disable-flashinfer-autotune or
# deterministic inference (srt/model_executor/runner/flashinfer_autotune.py:50-128 @0.5.18). When it
# runs it announces the file it tunes into, under $SGLANG_CACHE_DIR (default ~/.cache/sglang):
# <root>/flashinfer/autotune/<flashinfer version>/<smXY>/<sha256(model key)[:16]>/rank_tp{t}_pp{p}_dp{d}.json,
# or, with SGLANG_FLASHINFER_AUTOTUNE_CACHE=0, a timestamped file under runs/ beside it. The file is
# FlashInfer's own (`flashinfer.autotuner.autotune(True, cache=path)`). Read from the source only:
# no GPU run of SGLang has been seen here, so the first GPU verify of an SGLang cell proves it.
# The same facts in both releases, at the lines the Since entries below cite.
_AUTOTUNE = AutotuneFacts(
    cache_env="SGLANG_CACHE_DIR",
    # reuse of an earlier result, and where the fresh one is written
    controlled_env=("SGLANG_FLASHINFER_AUTOTUNE_CACHE",),
    announcements=(
        r"Running FlashInfer autotune with cache: (?P<path>\S+)",
        r"SGLANG_FLASHINFER_AUTOTUNE_CACHE=0\); writing fresh result to: (?P<path>\S+)",
    ),
    files=(
        "flashinfer/autotune/*/*/*/rank_tp*_pp*_dp*.json",
        "flashinfer/autotune/*/*/*/runs/rank_tp*_pp*_dp*.*.json",
    ),
    disabled_line=None,  # a server that does not tune says nothing
)

SGLANG = ServingDriver(
    name="sglang",
    title="SGLang",
    distributions=("sglang",),
    # The kernel package installs the module `sgl_kernel` under either distribution name
    # (sgl-kernel up to sglang 0.5.9, sglang-kernel from 0.5.10); it raises ImportError where the
    # CUDA libraries are missing, so it is optional here.
    imports=("torch?", "flashinfer?", "sglang?", "sgl_kernel?"),
    launch=_launch,
    # After the warm-up request answered (_wait_and_warmup): srt/entrypoints/http_server.py:2402
    # @0.5.18 (:2813 on the SGLANG_RUST_SERVER path), :2355 / :2762 @0.5.17; :2428, :2476, :2506, :2600
    # @0.5.20-0.5.23. From 0.5.22 the SGLANG_RUST_SERVER copy is compiled into
    # srt/rust_extensions/_server.*.so (no Python line to cite); the Python path's text is unchanged.
    ready_line=r"The server is fired up and ready to roll!",
    # /health runs a 1-token generation (SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION defaults to true,
    # srt/environ.py:319 @0.5.18; http_server.py:668-675), waiting up to SGLANG_HEALTH_CHECK_TIMEOUT
    # (20 s, http_server.py:192): with the scheduler stopped it times out, /v1/models and /metrics answer.
    health_runs_engine=True,
    metrics=(
        Since(version="0.5.17", value=_METRICS_0_5_17, source=_METRICS_0_5_17.source),
        Since(version="0.5.18", value=_METRICS_0_5_18, source=_METRICS_0_5_18.source),
        *(Since(version=v, value=m, source=m.source) for v, m in _METRICS_LATER.items()),
    ),
    # A failed child takes the whole process tree down (the port closes); these are the lines it
    # leaves. Scheduler exception: managers/scheduler.py:5068 @0.5.18 (:4951 @0.5.17); a child that
    # died (e.g. SIGKILL): `Subprocess scheduler_0 (pid=N) crashed with exit code -9. Triggering
    # SIGQUIT for cleanup...` utils/watchdog.py:216-219 (both); the main process's SIGQUIT handler:
    # managers/tokenizer_manager.py:3632 @0.5.18 (:3755 @0.5.17); a child failing during launch:
    # entrypoints/engine.py:1728 @0.5.18 (:1651 @0.5.17); the other components:
    # detokenizer_manager.py:536, tokenizer_manager.py:3591, data_parallel_controller.py:864 @0.5.18.
    # (A hung scheduler is no dead engine: /health answers 503 after SGLANG_HEALTH_CHECK_TIMEOUT,
    # http_server.py:719 @0.5.18, while /v1/models keeps answering: the stall rule's case.)
    dead_markers=(
        "Scheduler hit an exception",
        "crashed with exit code",
        "It usually means one child failed",
        "Received sigquit from a child process",
        "DetokenizerManager hit an exception",
        "TokenizerManager hit an exception",
        "DataParallelController hit an exception",
    ),
    # setproctitle: `sglang::scheduler` (+ `_TP{n}`... suffixes only when that size > 1),
    # managers/scheduler.py:4977 @0.5.18 (:4859 @0.5.17); `sglang::detokenizer`,
    # managers/detokenizer_manager.py:522 @0.5.18 (:521 @0.5.17). The main (HTTP) process keeps
    # its `python3 -m sglang.launch_server` command line. /proc/PID/comm cuts at 15 characters
    # (`sglang::schedul`): match the command line.
    process_titles=("sglang::",),
    engine_process="sglang::scheduler",
    # srt/environ.py reads SGLANG_* (and a few legacy SGL_*) variables; SGLANG_USE_CPU_ENGINE is a
    # plain getenv (srt/utils/common.py:215 @0.5.18).
    env_prefixes=("SGLANG_", "SGL_"),
    # --enable-deterministic-inference is a flag (srt/server_args.py:3397 @0.5.18), not a variable.
    batch_invariant_env=None,
    disabled_kernels_env=None,
    autotune=(
        Since(
            version="0.5.17",
            value=_AUTOTUNE,
            source="srt/model_executor/runner/flashinfer_autotune.py:171,179 and environ.py:1314 @0.5.17",
        ),
        Since(
            version="0.5.18",
            value=_AUTOTUNE,
            source="srt/model_executor/runner/flashinfer_autotune.py:180,188 and environ.py:991 @0.5.18",
        ),
        # Same texts and layout through 0.5.23 (globs still match the 0.5.22 `_gpu<uuid>` rank file).
        *(
            Since(
                version=v,
                value=_AUTOTUNE,
                source=f"srt/model_executor/runner/flashinfer_autotune.py:{lines} and environ.py:{env} @{v}",
            )
            for v, (lines, env) in _AUTOTUNE_LINES.items()
        ),
    ),
    # CompletionRequest.ignore_eos and ChatCompletionRequest.ignore_eos
    # (entrypoints/openai/protocol.py:368, :836 @0.5.18). Greedy logprobs come back with `tokens` as text, which is
    # what the determinism check compares: no extra request fields.
    ignore_eos_field="ignore_eos",
    greedy_extras=(),
    rulesets=("sglang-server",),
    version_source="the installed sglang distribution",
    # The release images are tagged v<version> plus a CUDA/platform suffix (v0.5.18-cu130, -runtime,
    # -rocm...). Their pins of the packages the audit reads: Requires-Dist in each release's wheel
    # METADATA (flashinfer_python[cu13], torch, transformers).
    release_image="lmsysorg/sglang",
    # sglang's x86_64 and aarch64 wheels are manylinux_2_34 only (cp312 for the images' Python).
    release_wheel_glibc="manylinux_2_34",
    # From 0.5.20 (read from each wheel's METADATA, cp312 manylinux_2_34: shared/reference/upstream-drift-4.md
    # §1.2): flashinfer_python[cu13] :230 @0.5.20, :232 @0.5.21-0.5.23; torch :277, :280, :279, :281;
    # transformers :283, :286, :285, :287; sglang-kernel :268, :271, :271, :273. cuDNN is torch's pin:
    # torch 2.13.0 -> nvidia-cudnn-cu13 9.20.0.48, torch 2.14.1 -> 9.24.0.43 (their METADATA), the cuDNN that
    # decides FlashInfer's #4165 gate (verify/logs/signatures.yaml fixed_if). 0.5.22 is the one current
    # stack on FlashInfer 0.7.1, which still raises on a mismatched kernel package (0.7.2+ only warns).
    release_pins={
        "0.5.17": {"flashinfer-python": "0.6.15.post1", "torch": "2.11.0", "transformers": "5.12.1"},
        "0.5.18": {
            "flashinfer-python": "0.6.17",
            "torch": "2.13.0",
            "transformers": "5.12.1",
            "nvidia-cudnn-cu13": "9.20.0.48",
        },
        "0.5.19": {
            "flashinfer-python": "0.6.18",
            "torch": "2.13.0",
            "transformers": "5.12.1",
            "nvidia-cudnn-cu13": "9.20.0.48",
        },
        "0.5.20": {
            "flashinfer-python": "0.6.18",
            "torch": "2.13.0",
            "transformers": "5.12.1",
            "sglang-kernel": "0.4.7",
            "nvidia-cudnn-cu13": "9.20.0.48",
        },
        "0.5.21": {
            "flashinfer-python": "0.6.18",
            "torch": "2.13.0",
            "transformers": "5.12.1",
            "sglang-kernel": "0.4.7",
            "nvidia-cudnn-cu13": "9.20.0.48",
        },
        "0.5.22": {
            "flashinfer-python": "0.7.1",
            "torch": "2.14.1",
            "transformers": "5.19.0",
            "sglang-kernel": "0.4.9",
            "nvidia-cudnn-cu13": "9.24.0.43",
        },
        "0.5.23": {
            "flashinfer-python": "0.7.2",
            "torch": "2.14.1",
            "transformers": "5.19.0",
            "sglang-kernel": "0.4.10",
            "nvidia-cudnn-cu13": "9.24.0.43",
        },
    },
)
