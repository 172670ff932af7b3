"""A `pip freeze` -> `Report`."""

from __future__ import annotations

import re

from packaging.utils import canonicalize_name

from pipeline.errors import InputError
from pipeline.repro.facts import Finding, Kind, Report, Seen
from pipeline.repro.util import _check_version

_FREEZE = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*(?P<version>\S*)\s*$")
_FREEZE_OTHER = re.compile(r"^(?:-e\s|[A-Za-z0-9][A-Za-z0-9._-]*\s*@\s)")


def _looks_like_freeze(lines: list[str]) -> bool:
    relevant = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
    hits = sum(1 for line in relevant if _FREEZE.match(line) or _FREEZE_OTHER.match(line))
    return len(relevant) >= 3 and hits >= 0.6 * len(relevant)


def _from_freeze(lines: list[str], name: str) -> Report:
    packages: dict[str, Seen] = {}
    findings: list[Finding] = []
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _FREEZE.match(line)
        if match:
            canonical = str(canonicalize_name(match.group("name")))
            if not match.group("version"):
                raise InputError(f"{name}:{number}: {line!r}: no version after ==")
            _check_version(name, number, canonical, match.group("version"))
            packages[canonical] = Seen(value=match.group("version"), line=number)
        elif _FREEZE_OTHER.match(line):
            findings.append(
                Finding(
                    topic=line.split()[0] if not line.startswith("-e") else "editable install",
                    kind=Kind.AMBIGUOUS,
                    line=number,
                    message=f"{line!r} is a direct reference (a local path or VCS URL), not a version on an index: "
                    "not reproduced",
                )
            )
        else:
            raise InputError(f"{name}:{number}: {line!r} is not a `pip freeze` line (name==version)")
    findings.append(
        Finding(
            topic="GPU, driver, kernel",
            kind=Kind.SILENT,
            message="a pip freeze names no GPU, driver, kernel or cuDNN library: give --arch; no host expectations",
        )
    )
    return Report(
        source=name,
        kind="pip-freeze",
        packages=tuple(sorted(packages.items())),
        complete=True,
        vllm=packages.get("vllm"),
        findings=tuple(findings),
    )
