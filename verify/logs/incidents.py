"""Known incidents (signatures.yaml entries with refs): named as the diagnosis when every fact they
require is shown, offered as a *candidate* when some are unknown, never mentioned when one is
contradicted.

An incident's text is often any kernel's failure text (an illegal memory access, a Triton shared
memory overflow); what makes it the incident is the stack it ran on (SM12x, an FP8 linear kernel,
an FP8 KV cache, MLA, a FlashInfer release). A pasted log rarely shows all of that. Issue 26 named
the incident when all was shown and said nothing when none was: the seed's own incidents then went
unmentioned for the pastes that showed them. Issue 44: when no fact contradicts the incident, it is
a candidate, with each unknown fact and how to check it (`--cell`, the startup log, `stackproof
doctor`, `stackproof inspect autotune`). A candidate never sets the verdict or the diagnosis: a
wrong attribution stays impossible, and the benchmark counts only named incidents.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from verify.logs.catalog import Signature
from verify.logs.logscan import LogMatch

__all__ = ["Candidate", "Fact", "Incident", "check_for", "incidents"]


@dataclass(frozen=True, kw_only=True)
class Fact:
    name: str
    value: str
    source: str  # "line 12" or "cell <id>"


@dataclass(frozen=True, kw_only=True)
class Incident:
    id: str
    title: str
    refs: tuple[str, ...]
    workaround: str
    fixed_in: tuple[tuple[str, str], ...]
    line_no: int
    shown_by: tuple[str, ...]  # the facts that satisfied its preconditions, with their source


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """An incident whose text the log shows and whose preconditions are unknown, none contradicted."""

    id: str
    title: str
    refs: tuple[str, ...]
    line_no: int
    shown: tuple[str, ...]  # the preconditions the log or the cell shows (may be none)
    missing: tuple[str, ...]  # the preconditions neither shows, in words
    checks: tuple[str, ...]  # for each missing one: how to find out
    text: str


# How to find out each fact a `requires` may test, when neither the log nor the cell shows it.
_CHECKS = {
    "arch": (
        "the GPU: `--cell CELL`, `stackproof doctor` on the host, or the startup log's GPU name or compute capability"
    ),
    "gpu": "the GPU: `--cell CELL`, `stackproof doctor` on the host, or nvidia-smi in the log",
    # fixed_if {cudnn: ...}: the cuDNN torch brings (its nvidia-cudnn-cu1x pin), as pip lists it
    "cudnn": "the cuDNN: `--cell CELL` (its release pins), or `pip list | grep nvidia-cudnn` in the image",
    "fp8_linear": (
        "the FP8 linear kernel: the startup log's `Selected <Kernel> for <Method>` line,"
        " or --quantization fp8 in the cell"
    ),
    "kernel": (
        "the kernel: the startup log's selected kernels, or `stackproof inspect autotune` on the FlashInfer"
        " autotune cache (the runner that won)"
    ),
    "kv_cache_dtype": (
        "the KV cache dtype: --kv-cache-dtype in the serve args (`--cell CELL`),"
        " or kv_cache_dtype= in the engine's config line"
    ),
    "mla": (
        "MLA attention: the attention backend the startup log names (TRITON_MLA, FLASHMLA, FLASHINFER_MLA,"
        " CUTLASS_MLA) or the model (DeepSeek V2/V3, Kimi K2)"
    ),
    "quantization": (
        "the quantisation: --quantization in the serve args (`--cell CELL`), or quantization= in the config line"
    ),
    "attention_backend": "the attention backend: the startup log's `Using <backend> attention backend` line",
}
_KNOWN_ARCHS = ("sm70", "sm75", "sm80", "sm86", "sm89", "sm90", "sm100", "sm103", "sm110", "sm120", "sm121")
_FACT_WORDS = {
    "fp8_linear": "an FP8 linear kernel serves the model",
    "kv_cache_dtype": "the KV cache is {pattern}",
    "mla": "the model uses MLA attention",
}


def check_for(name: str) -> str:
    """How to find out a fact an incident requires (`stackproof inspect log` prints it for a candidate)."""
    return _CHECKS.get(name, f"{name}: `--cell CELL` or the startup log")


def incidents(
    catalog: Sequence[Signature], matches: Sequence[LogMatch], facts: Sequence[Fact]
) -> tuple[Incident | None, list[Candidate]]:
    """The first incident whose preconditions are all shown; candidates for those partly or wholly unknown."""
    by_id = {s.id: s for s in catalog}
    named: Incident | None = None
    candidates: list[Candidate] = []
    for sig_id in dict.fromkeys(m.id for m in sorted(matches, key=lambda m: m.line_no)):
        sig = by_id[sig_id]
        if sig.severity != "fail":
            continue
        line_no = next(m.line_no for m in matches if m.id == sig_id)
        shown, missing, ruled_out = _preconditions(sig, facts)
        if ruled_out:
            continue  # a shown fact contradicts it: say nothing of it
        if not missing and named is None:
            named = Incident(
                id=sig.id,
                title=sig.title,
                refs=sig.refs,
                workaround=sig.workaround,
                fixed_in=sig.fixed_in,
                line_no=line_no,
                shown_by=tuple(shown) or ("its text names the failing component",),
            )
        elif missing:
            words = [w for w, _ in missing]
            refs = ", ".join(sig.refs)
            candidates.append(
                Candidate(
                    id=sig.id,
                    title=sig.title,
                    refs=sig.refs,
                    line_no=line_no,
                    shown=tuple(shown),
                    missing=tuple(words),
                    checks=tuple(dict.fromkeys(check_for(name) for _, name in missing)),
                    text=f"if {' and '.join(words)}: {sig.title} ({refs}); {sig.workaround}",
                )
            )
    return named, candidates


def _preconditions(sig: Signature, facts: Sequence[Fact]) -> tuple[list[str], list[tuple[str, str]], bool]:
    """(shown, missing as (words, fact), ruled out): each `requires` fact shown, unknown or contradicted."""
    shown: list[str] = []
    missing: list[tuple[str, str]] = []
    for name, pattern in sig.requires:
        values = [f for f in facts if f.name == name]
        good = [f for f in values if re.search(pattern, f.value)]
        if good:
            shown.append(f"{name}={good[0].value} ({good[0].source})")
        elif values:
            return [], [], True  # shown, and not what the incident needs
        else:
            missing.append((_describe(name, pattern), name))
    for package, fixed in sig.fixed_in:
        for f in facts:
            if f.name == package and _at_least(f.value, fixed):
                unknown = _fix_unknown(sig, facts)
                if unknown is None:
                    return [], [], True  # this stack already has the fix, and its conditions hold
                missing += unknown  # the fix is installed; whether it is in force is not shown
    versions = {f.name: f.value for f in facts if f.name in ("vllm", "flashinfer")}
    for package, spec in sig.applies_to:
        if package in versions and not _spec_holds(versions[package], spec):
            return [], [], True
    return shown, missing, False


def _fix_unknown(sig: Signature, facts: Sequence[Fact]) -> list[tuple[str, str]] | None:
    """None when every `fixed_if` condition is shown to hold (the fix is in force); else the
    conditions under which the incident is still possible, as (words, fact): [] where one is shown not
    to hold (the fix is off: cuDNN 9.24 for #55571's gate), the unknown ones otherwise."""
    unknown = []
    for package, spec in sig.fixed_if:
        values = [f.value for f in facts if f.name == package]
        if values and not _spec_holds(values[0], spec):
            return []
        if not values:
            unknown.append((f"{package} is not {spec} (the fix of {', '.join(sig.refs)} is off there)", package))
    return unknown or None


def _describe(name: str, pattern: str) -> str:
    """A precondition in words, for the candidate ("if this is sm120/sm121 and ...")."""
    if name == "arch":
        archs = [a for a in _KNOWN_ARCHS if re.search(pattern, a)]
        if archs:
            return f"this is {'/'.join(archs)}"
    if name in _FACT_WORDS:
        return _FACT_WORDS[name].format(pattern=pattern.strip("^$").replace("\\", ""))
    return f"{name} matches /{pattern}/"


def _at_least(version: str, fixed: str) -> bool:
    try:
        return Version(version) >= Version(fixed)
    except InvalidVersion:
        return False


def _spec_holds(version: str, spec: str) -> bool:
    try:
        return SpecifierSet(spec).contains(Version(version), prereleases=True)
    except InvalidVersion:
        return True
