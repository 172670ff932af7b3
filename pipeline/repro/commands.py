"""Commands inside a report: the first `docker run ... vllm/vllm-openai:TAG ...` or `vllm serve ...`
line, and the image, env, model, serve args and settings it names."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from pipeline.guard.redact import secret_arg, secret_env
from pipeline.repro.facts import Finding, Kind, Seen
from pipeline.repro.util import _IMAGE_REF

REPRODUCED_ENV_PREFIXES = ("VLLM_", "FLASHINFER_")
TOOL_OWNED = ("--host", "--port")
SECRET_ARGS = ("--api-key",)
SETTING_FLAGS = {
    "quantization": "--quantization",
    "kv-cache-dtype": "--kv-cache-dtype",
    "max-num-batched-tokens": "--max-num-batched-tokens",
}


@dataclass(frozen=True, kw_only=True)
class _Args:
    model: Seen | None = None
    args: tuple[str, ...] = ()
    settings: dict[str, Seen] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class _Commands:
    image: Seen | None = None
    commit: Seen | None = None
    model: Seen | None = None
    args: tuple[str, ...] = ()
    line: int | None = None
    settings: tuple[tuple[str, Seen], ...] = ()
    env: tuple[tuple[str, Seen], ...] = ()


_MENTIONED_IMAGE = re.compile(r"(?:docker\.io/)?vllm/vllm-openai:[\w.-]+")


def _scan_commands(lines: list[str], findings: list[Finding]) -> _Commands:
    """The first `docker run ... vllm/vllm-openai:TAG ...` or `vllm serve ...` command, and any
    image of vLLM's the text mentions."""
    image = None
    for number, line in enumerate(lines, start=1):
        match = _MENTIONED_IMAGE.search(line)
        if match:
            image = Seen(value=match.group(0).removeprefix("docker.io/"), line=number)
            break
    logical: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, raw in enumerate(lines, start=1):
        text = raw.strip().removeprefix("$ ").strip("`")
        if pending is not None:
            text = pending[1] + " " + text
            number = pending[0]
        if text.endswith("\\"):
            pending = (number, text[:-1].strip())
            continue
        pending = None
        logical.append((number, text))
    for number, text in logical:
        if not re.search(r"\bvllm serve\b|vllm/vllm-openai|vllm\.entrypoints\.openai\.api_server", text):
            continue
        if not re.match(r"(?:sudo\s+)?(?:docker|podman|vllm|python3?)\b", text):
            continue
        try:
            tokens = shlex.split(text)
        except ValueError as exc:
            findings.append(
                Finding(topic="command", kind=Kind.AMBIGUOUS, line=number, message=f"cannot split it ({exc}): ignored")
            )
            continue
        env: list[tuple[str, Seen]] = []
        if tokens and tokens[0] in ("docker", "podman", "sudo"):
            at = next((i for i, t in enumerate(tokens) if _IMAGE_REF.match(t)), None)
            if at is None:
                continue
            image = Seen(value=tokens[at].removeprefix("docker.io/"), line=number)
            env = _docker_env(tokens[:at], number, findings)
            rest = tokens[at + 1 :]
            if rest[:2] == ["vllm", "serve"]:
                rest = rest[2:]
        elif "serve" in tokens:
            rest = tokens[tokens.index("serve") + 1 :]
        else:
            rest = tokens[tokens.index("vllm.entrypoints.openai.api_server") + 1 :] if "-m" in tokens else []
        parsed = _vllm_args(rest, number, findings)
        commit = re.search(r"nightly-([0-9a-f]{40})\b", image.value) if image else None
        return _Commands(
            image=image,
            commit=Seen(value=commit.group(1), line=number) if commit else None,
            model=parsed.model,
            args=parsed.args,
            line=number,
            settings=tuple(sorted(parsed.settings.items())),
            env=tuple(env),
        )
    commit = re.search(r"nightly-([0-9a-f]{40})\b", image.value) if image else None
    return _Commands(image=image, commit=Seen(value=commit.group(1), line=image.line) if commit and image else None)


def _docker_env(tokens: list[str], line: int, findings: list[Finding]) -> list[tuple[str, Seen]]:
    env = []
    for i, token in enumerate(tokens):
        value = None
        if token in ("-e", "--env") and i + 1 < len(tokens):
            value = tokens[i + 1]
        elif token.startswith("--env="):
            value = token.removeprefix("--env=")
        if value and "=" in value:
            var, _, text = value.partition("=")
            secret = secret_env(var, text)
            if secret:
                findings.append(
                    Finding(topic=var, kind=Kind.NOTE, line=line, message="a secret; never copied into the cell")
                )
            elif var.startswith(REPRODUCED_ENV_PREFIXES):
                env.append((var, Seen(value=text, line=line)))
            elif re.search(r"TOKEN|SECRET|KEY|PASSWORD", var):
                findings.append(
                    Finding(topic=var, kind=Kind.NOTE, line=line, message="a secret; never copied into the cell")
                )
    return env


def _vllm_args(tokens: list[str], line: int | None, findings: list[Finding]) -> _Args:
    """`MODEL --flag value ...` -> the model, the args a cell keeps, and the settings named."""
    model = None
    args: list[str] = []
    settings: dict[str, Seen] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        flag, has_eq, inline = token.partition("=")
        takes_value = token.startswith("--") and not has_eq and i + 1 < len(tokens)
        takes_value = takes_value and not tokens[i + 1].startswith("-")
        value = inline if has_eq else (tokens[i + 1] if takes_value else None)
        step = 2 if takes_value else 1
        if not token.startswith("-") and model is None:
            model = Seen(value=token, line=line)
        elif flag == "--model" and value is not None:
            model = Seen(value=value, line=line)
        elif flag in TOOL_OWNED:
            findings.append(
                Finding(topic=flag, kind=Kind.NOTE, line=line, message="dropped: the tool binds the server itself")
            )
        elif flag in SECRET_ARGS or secret_arg(token, value):
            findings.append(
                Finding(topic=flag, kind=Kind.NOTE, line=line, message="a secret; never copied into the cell")
            )
        else:
            args += [token] if has_eq or value is None else [token, value]
            for setting, setting_flag in (*SETTING_FLAGS.items(), ("quantization", "-q")):
                if flag == setting_flag and value is not None:
                    settings[setting] = Seen(value=value, line=line)
            if flag in ("--compilation-config", "-O", "-cc") and value is not None:
                match = re.search(r'"?cudagraph_mode"?\s*[:=]\s*"?(\w+)', value)
                if match:
                    settings["cudagraph-mode"] = Seen(value=match.group(1), line=line)
        i += step
    return _Args(model=model, args=tuple(args), settings=settings)
