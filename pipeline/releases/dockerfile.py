"""What a vLLM release's docker/Dockerfile installs over its wheels' metadata, read from the file.

vLLM's release Dockerfile (v0.28.0, release commit 2cf0a691, runtime stage) pins packages past the
metadata through uv's override file: `ARG NCCL_VERSION=2.30.7`, then
`echo "nvidia-nccl-cu${CUDA_MAJOR}==${NCCL_VERSION}" > /etc/uv-overrides.txt` and
`ENV UV_OVERRIDE=/etc/uv-overrides.txt` before the requirements install. This module evaluates just
enough of the file to read those: `ARG`/`ENV` defaults, shell assignments inside `RUN`
(`CUDA_MAJOR="${CUDA_VERSION%%.*}"`) with the `${V}`, `${V%pat}`, `${V%%pat}`, `${V#pat}`,
`${V##pat}` expansions, and `echo "name==version" >[>] FILE` into a file that `UV_OVERRIDE` or
`--override(s)` names. `ARG CUDA_VERSION` gives the image's `require_cuda` (`cuda>=MAJOR.MINOR`).
A spec whose variables the file does not define is bad input (exit 2, file and line).
"""

from __future__ import annotations

import fnmatch
import re
import shlex
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from pipeline.errors import InputError
from pipeline.guard import boundedio
from pipeline.releases.table import DockerfileFacts

__all__ = ["read_dockerfile"]

_EXPANSION = re.compile(r"\$\{(?P<name>\w+)(?:(?P<op>%%|%|##|#)(?P<pat>[^}]*))?\}|\$(?P<bare>[A-Za-z_]\w*)")
_ASSIGN = re.compile(r"(?:^|[;&|(]\s*|\s)(?:export\s+)?(?P<name>[A-Za-z_]\w*)=(?P<value>\"[^\"]*\"|'[^']*'|[^\s;&|]+)")
_ECHO = re.compile(r"echo\s+(?P<spec>\"[^\"]*\"|'[^']*'|\S+)\s*>>?\s*(?P<file>\S+)")
DOCKERFILE_LIMIT = 4 * 2**20  # vLLM's is about 20 KB
_USES = re.compile(r"(?:UV_OVERRIDE[= ]\s*|--overrides?[= ]\s*)(?P<file>[^\s;&|\"']+)")
# Issue 43: a value is at most VALUE_LIMIT characters once expanded (vLLM's longest is a few dozen),
# so nested ARGs (`ARG B=${A}${A}...`, each doubling: billion laughs) are refused at the line that
# passes it, not grown until memory runs out; and `${V%%pat}` tries each cut once per value of at
# most that size (the fnmatch per cut made a long value quadratic).
VALUE_LIMIT = 4096


class _TooLong(Exception):
    pass


def read_dockerfile(path: Path) -> DockerfileFacts:
    """The overrides and CUDA version a release Dockerfile sets, with the ARGs they came from."""
    text = boundedio.read_text(path, "Dockerfile", limit=DOCKERFILE_LIMIT)
    variables: dict[str, str] = {}
    written: list[tuple[int, str, str, str]] = []  # (line, raw spec, spec as expanded there, file)
    used: set[str] = set()
    for line, instruction in _instructions(text):
        try:
            _evaluate(instruction, line, variables, written, used)
        except _TooLong as exc:
            raise InputError(
                f"{path}:{line}: {exc} expands past {VALUE_LIMIT:,} characters: not a release Dockerfile's value"
            ) from None
    overrides: dict[str, str] = {}
    referenced: set[str] = set()
    for line, raw, spec, file in written:
        if _expand(file, variables, None) not in used:
            continue  # a file no install reads is no override
        referenced |= {m.group("name") or m.group("bare") for m in _EXPANSION.finditer(raw)}
        # Expanded as of its own line (a later ARG of the same name does not change it); whatever
        # is still unexpanded was never set before it.
        name, version = _pin(_expand(spec, {}, f"{path}:{line}"), f"{path}:{line}")
        overrides[name] = version
    cuda = variables.get("CUDA_VERSION")
    require_cuda = (
        f"cuda>={'.'.join(cuda.split('.')[:2])}" if cuda and re.fullmatch(r"\d+\.\d+(\.\d+)*", cuda) else None
    )
    args = {k: variables[k] for k in sorted(referenced | ({"CUDA_VERSION"} if cuda else set())) if k in variables}
    return DockerfileFacts(
        source=f"{path.name} (given with --dockerfile)",
        overrides=tuple(sorted(overrides.items())),
        args=tuple(sorted(args.items())),
        require_cuda=require_cuda,
    )


def _evaluate(
    instruction: str, line: int, variables: dict[str, str], written: list[tuple[int, str, str, str]], used: set[str]
) -> None:
    keyword, _, rest = instruction.partition(" ")
    keyword = keyword.upper()
    if keyword in ("ARG", "ENV"):
        _declare(keyword, rest, variables)
    if keyword == "RUN" or keyword == "ENV":
        for match in _ASSIGN.finditer(rest if keyword == "RUN" else ""):
            variables[match.group("name")] = _expand(_unquote(match.group("value")), variables, None)
        for match in _ECHO.finditer(rest):
            raw = _unquote(match.group("spec"))
            written.append((line, raw, _expand(raw, variables, None), match.group("file")))
    for match in _USES.finditer(instruction):
        used.add(_expand(match.group("file"), variables, None))


def _instructions(text: str) -> list[tuple[int, str]]:
    """(first line number, instruction) with continuation lines joined and comments dropped."""
    out: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # a comment inside a continued RUN
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1])
            continue
        pending.append(stripped)
        out.append((start, " ".join(pending)))
        pending = []
    if pending:
        out.append((start, " ".join(pending)))
    return out


def _declare(keyword: str, rest: str, variables: dict[str, str]) -> None:
    try:
        words = shlex.split(rest)
    except ValueError:
        return
    if keyword == "ENV" and len(words) == 2 and "=" not in words[0]:
        variables[words[0]] = _expand(words[1], variables, None)  # legacy `ENV NAME value`
        return
    for word in words:
        name, eq, value = word.partition("=")
        if eq and re.fullmatch(r"[A-Za-z_]\w*", name):
            variables[name] = _expand(value, variables, None)


def _expand(value: str, variables: dict[str, str], where: str | None) -> str:
    grown = [0]

    def one(match: re.Match[str]) -> str:
        out = _one(match)
        grown[0] += len(out)
        if grown[0] > VALUE_LIMIT:
            raise _TooLong(f"${{{match.group('name') or match.group('bare')}}}")
        return out

    def _one(match: re.Match[str]) -> str:
        name = match.group("name") or match.group("bare")
        if name not in variables:
            if where is None:
                return match.group(0)
            raise InputError(f"{where}: ${{{name}}} is not set by any ARG, ENV or assignment before it")
        current, op, pattern = variables[name], match.group("op"), match.group("pat") or ""
        if op in ("%", "%%"):
            cuts = [i for i in range(len(current) + 1) if fnmatch.fnmatchcase(current[i:], pattern)]
            return current[: (min(cuts) if op == "%%" else max(cuts))] if cuts else current
        if op in ("#", "##"):
            cuts = [i for i in range(len(current) + 1) if fnmatch.fnmatchcase(current[:i], pattern)]
            return current[(max(cuts) if op == "##" else min(cuts)) :] if cuts else current
        return current

    if len(value) > VALUE_LIMIT:
        raise _TooLong(f"{value[:40]!r}...")
    return _EXPANSION.sub(one, value)


def _unquote(value: str) -> str:
    return value[1:-1] if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'" else value


def _pin(spec: str, where: str) -> tuple[str, str]:
    try:
        requirement = Requirement(spec)
    except InvalidRequirement as exc:
        raise InputError(f"{where}: {spec!r} is not a requirement ({exc})") from None
    specs = list(requirement.specifier)
    if len(specs) != 1 or specs[0].operator != "==":
        raise InputError(f"{where}: {spec!r} is not an exact pin (name==version)")
    return str(canonicalize_name(requirement.name)), specs[0].version
