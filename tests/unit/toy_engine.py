"""A toy third serving engine, to show that a new engine is one file: this one.

It is no real engine: its paths and metric names are made up so that nothing in the checks can
pass by knowing vLLM's or SGLang's. tests/unit/test_serving.py runs the load against a fake server
speaking this dialect (tests/unit/fake_openai.py), through the same code the real engines use.
"""

from __future__ import annotations

from verify.serving import Endpoints, MetricNames, ServingDriver, Since
from verify.serving.driver import LaunchSpec


def _launch(spec: LaunchSpec) -> tuple[str, ...]:
    return (
        "toy-serve",
        "--weights",
        spec.serve.model.location,
        "--listen",
        f"{spec.host}:{spec.port}",
        *spec.serve.args,
    )


TOY = ServingDriver(
    name="toy",
    title="Toy",
    distributions=("toy-engine",),
    imports=("toy_engine?",),
    launch=_launch,
    ready_line=r"toy: serving",
    endpoints=Endpoints(
        health="/toy/alive", models="/toy/models", completions="/toy/complete", chat="/toy/chat", metrics="/toy/prom"
    ),
    metrics=(
        Since(
            version="1.0",
            value=MetricNames(
                generated="toy:out_tokens_total",
                prompt="toy:in_tokens_total",
                running="toy:busy",
                waiting="toy:queued",
                steps="toy:ticks_count",
                step_tokens="toy:ticks_sum",
            ),
            source="made up",
        ),
    ),
    dead_markers=("ToyEngineGone",),
    process_titles=("toy::",),
    engine_process="toy::core",
    env_prefixes=("TOY_",),
    ignore_eos_field="ignore_eos",
)
