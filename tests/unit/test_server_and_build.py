"""Pure pieces of the build and server edges: the base digest read from the build log, the serve command."""

from __future__ import annotations

from pipeline.build.image import _RESOLVED_BASE
from pipeline.matrix.model import Arm, ModelSource, ServeSpec
from verify.stages.server import HOST, serve_argv


def _serve(source: str, revision: str | None = None, args: tuple[str, ...] = ()) -> ServeSpec:
    return ServeSpec(
        model=ModelSource(source=source, revision=revision),
        args=args,
        env=(),
        readiness_timeout_s=60,
        shm_size="1g",
        gpus=None,
    )


def test_resolved_base_digest_is_read_from_buildkit_plain_progress() -> None:
    digest = "sha256:" + "ab" * 32
    line = f"#4 resolve registry.example/vllm/vllm-openai:v0.28.0@{digest} 0.0s done"
    match = _RESOLVED_BASE.search(line)
    assert match is not None
    assert match.group(1) == f"registry.example/vllm/vllm-openai:v0.28.0@{digest}"
    assert _RESOLVED_BASE.search("#5 [2/7] RUN apt-get update") is None


def test_serve_command_binds_loopback_on_the_chosen_port_then_cell_then_arm_args() -> None:
    arm = Arm(name="eager", description="", env=(), args=("--enforce-eager",))
    argv = serve_argv(_serve("path:/models/tiny-llama", args=("--max-model-len", "512")), arm, 8123)
    assert argv == [
        "vllm",
        "serve",
        "/models/tiny-llama",
        "--host",
        HOST,
        "--port",
        "8123",
        "--max-model-len",
        "512",
        "--enforce-eager",
    ]


def test_serve_command_pins_a_hub_model_revision() -> None:
    argv = serve_argv(_serve("hf:org/model", revision="0123abc"), None, 9000)
    assert argv[:3] == ["vllm", "serve", "org/model"]
    assert argv[argv.index("--revision") + 1] == "0123abc"
