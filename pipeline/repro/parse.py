"""`parse_source`: recognise which of the four kinds of source a text is and hand it to that kind's parser."""

from __future__ import annotations

import json

from pipeline.errors import InputError
from pipeline.repro.collect_env import _from_collect_env, _looks_like_collect_env
from pipeline.repro.doctor_json import _from_doctor
from pipeline.repro.env_block import _from_env_block
from pipeline.repro.facts import Report
from pipeline.repro.pip_freeze import _from_freeze, _looks_like_freeze


def parse_source(text: str, name: str) -> Report:
    """Recognise the kind of source and parse it; `InputError` (exit 2) names the line at fault."""
    try:
        return _parse(text, name)
    except InputError as exc:  # parsers that know only the line: name the source too
        message = str(exc)
        if message.startswith("line ") and ":" in message:
            number, rest = message.removeprefix("line ").split(":", 1)
            raise InputError(f"{name}:{number}:{rest}") from None
        raise


def _parse(text: str, name: str) -> Report:
    stripped = text.strip()
    if not stripped:
        raise InputError(f"{name}: the source is empty")
    if stripped.startswith("{"):
        try:
            document = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise InputError(f"{name}:{exc.lineno}: not valid JSON: {exc.msg}") from exc
        except RecursionError:
            raise InputError(f"{name}: a JSON document nested too deeply to read") from None
        if isinstance(document, dict) and ("doctor_schema" in document or "probe_schema" in document):
            return _from_doctor(document, name)
        raise InputError(
            f"{name}: a JSON document, but not the output of `stackproof doctor --json` (no doctor_schema)"
        )
    lines = text.splitlines()
    if _looks_like_collect_env(lines):
        return _from_collect_env(lines, name)
    if _looks_like_freeze(lines):
        return _from_freeze(lines, name)
    report = _from_env_block(lines, name)
    if not (report.packages or report.gpus or report.vllm or report.model):
        raise InputError(
            f"{name}: recognised neither `vllm collect-env` output, an environment block (GPU:, vLLM:, "
            "PyTorch:, FlashInfer: ... lines), a pip freeze, nor `stackproof doctor --json` output"
        )
    return report
