"""The SGLang driver: every SGLang fact the checks use, keyed by release where it moved.

Lines cited are in sgl-project/sglang at the tag named (python/sglang/...).
"""

from __future__ import annotations

from verify.serving.driver import LaunchSpec, MetricNames, ServingDriver, Since

__all__ = ["SGLANG"]


def _launch(spec: LaunchSpec) -> tuple[str, ...]:
    """`python3 -m sglang.launch_server --model-path M --host H --port N [--revision R]
    --enable-metrics` plus the cell's and the arm's args: /metrics answers only with
    --enable-metrics (srt/server_args.py), and the load stage's progress rule needs it."""
    serve = spec.serve
    argv = ["python3", "-m", "sglang.launch_server", "--model-path", serve.model.location]
    argv += ["--host", spec.host, "--port", str(spec.port)]
    if serve.model.kind == "hf" and serve.model.revision:
        argv += ["--revision", serve.model.revision]
    extra = (*serve.args, *(spec.arm.args if spec.arm else ()))
    if "--enable-metrics" not in extra:
        argv.append("--enable-metrics")
    return (*argv, *extra)


_METRICS = MetricNames(
    generated="sglang:generation_tokens_total",
    prompt="sglang:prompt_tokens_total",
    running="sglang:num_running_reqs",
    waiting="sglang:num_queue_reqs",
    steps=None,  # SGLang exports no engine-iteration counter: progress is generated tokens alone
    source="python/sglang/srt/metrics/collector.py",
)

SGLANG = ServingDriver(
    name="sglang",
    title="SGLang",
    distributions=("sglang",),
    imports=("torch?", "flashinfer?", "sglang?", "sgl_kernel?"),
    launch=_launch,
    ready_line=r"The server is fired up and ready to roll!",
    # /health runs a 1-token generation (SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION defaults to true,
    # srt/environ.py:319 @0.5.18; http_server.py:668-675), waiting up to SGLANG_HEALTH_CHECK_TIMEOUT
    # (20 s, http_server.py:192): with the scheduler stopped it times out, /v1/models and /metrics answer.
    health_runs_engine=True,
    metrics=(Since(version="0.5.0", value=_METRICS, source=_METRICS.source),),
    dead_markers=("Scheduler hit an exception",),
    process_titles=("sglang::",),
    engine_process="sglang::scheduler",
    env_prefixes=("SGLANG_", "SGL_"),
    batch_invariant_env=None,
    disabled_kernels_env=None,
    autotune=(),  # FlashInfer's autotune cache is not placed or announced by SGLang
    ignore_eos_field="ignore_eos",
    rulesets=("sglang-server",),
    version_source="the installed sglang distribution",
)
