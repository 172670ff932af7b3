"""What makes a receipt the output of a run: the run directory it was written into.

`stackproof run`/`verify` write a receipt into its own run directory (`OUT/CELL/run-<time>`),
beside its renderings (junit.xml, summary.md: pipeline.receiptrender.write_all) and the files its stages
kept (the imports probe, the server logs, the load's records), which its stages name as artifacts.
The receipt is the one document of a run; publish believes it to be a run's output only when the
directory it sits in holds together with it:
- its renderings are beside it, and every file its stages name is in this directory (not another
  run's), and is there;
- the summary its run rendered records the cell, the image and the stages (each with its status)
  that the receipt gives: a receipt edited after its run (a stage made to pass, another image's
  receipt re-labelled) no longer matches what the run wrote beside it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePath

from pipeline.errors import InputError
from pipeline.guard import boundedio
from pipeline.receipt import Receipt

__all__ = ["RENDERINGS", "RunDir", "run_problems"]

RENDERINGS = ("junit.xml", "summary.md")  # what write_all writes beside every receipt
_MAX_FILES = 10_000
_HEADER = re.compile(r"^### \S* ?stackproof `(?P<cell>[^`]*)`(?: / arm `(?P<arm>[^`]*)`)?: ", re.MULTILINE)
_IMAGE = re.compile(r"^- image `(?P<ref>[^`]*)` id `(?P<id>[^`]*)`", re.MULTILINE)
_TABLE = "| stage | status | seconds | checks |"


@dataclass(frozen=True, kw_only=True)
class RunDir:
    """The directory a receipt sits in: its name, the files and folders under it (paths relative to it) and
    the text of its summary.md (None: none there, or not readable as one)."""

    name: str
    files: frozenset[str]
    summary: str | None

    @classmethod
    def read(cls, directory: Path) -> RunDir:
        files: set[str] = set()
        for path in directory.rglob("*"):
            if len(files) >= _MAX_FILES:
                break
            files.add(path.relative_to(directory).as_posix())
        summary = None
        if "summary.md" in files:
            try:
                summary = boundedio.read_text(directory / "summary.md", "run's summary", limit=4 * 2**20)
            except InputError:
                summary = None
        return cls(name=directory.name, files=frozenset(files), summary=summary)


def run_problems(receipt: Receipt, run: RunDir) -> list[str]:
    """Why `receipt` is not the output of the run whose directory is `run` (pure). Empty: it is."""
    missing = [name for name in RENDERINGS if name not in run.files]
    if missing:
        return [f"no {' or '.join(missing)} beside it: it is not the output of a `stackproof run`/`verify`"]
    problems = _artifact_problems(receipt, run)
    problems += _summary_problems(receipt, run.summary or "")
    return problems


def _artifact_problems(receipt: Receipt, run: RunDir) -> list[str]:
    """The files the receipt's stages name: each in this run directory, and there."""
    elsewhere, absent = [], []
    for stage in receipt.stages:
        for name, path in sorted(stage.artifacts.items()):
            inside = _inside(path, run.name)
            if inside is None:
                elsewhere.append(f"{stage.stage} {name} {path}")
            elif inside not in run.files:
                absent.append(f"{stage.stage} {name} {inside}")
    problems = []
    if elsewhere:
        problems.append(f"its stages name another run's files ({'; '.join(elsewhere)}), not files beside it")
    if absent:
        problems.append(f"the files its stages name are not beside it ({'; '.join(absent)})")
    return problems


def _inside(path: str, run_name: str) -> str | None:
    """`path` (as the run wrote it: relative to where it ran, or absolute) relative to the run
    directory `run_name`; None when it is not under a directory of that name."""
    parts = PurePath(path).parts
    if run_name not in parts[:-1]:
        return None
    last = len(parts) - 1 - parts[::-1].index(run_name)
    return PurePath(*parts[last + 1 :]).as_posix()


def _summary_problems(receipt: Receipt, summary: str) -> list[str]:
    """The run's summary.md against the receipt: the cell (and arm), the image and the stages."""
    header, image = _HEADER.search(summary), _IMAGE.search(summary)
    if header is None or image is None:
        return ["the run's summary.md beside it is not a stackproof summary"]
    problems = []
    if (header["cell"], header["arm"]) != (receipt.cell, receipt.arm):
        arm = f" arm {header['arm']}" if header["arm"] else ""
        problems.append(f"the run's summary.md beside it is for another cell ({header['cell']}{arm})")
    if (image["ref"], image["id"]) != (receipt.image.ref, receipt.image.id):
        problems.append(f"the run's summary.md beside it is for another image ({image['ref']} {image['id']})")
    ran = _stage_rows(summary)
    said = [f"{stage.stage} {stage.status}" for stage in receipt.stages]
    if ran != said:
        recorded = ", ".join(ran)
        problems.append(f"its stages [{', '.join(said)}] are not those its run recorded in summary.md [{recorded}]")
    return problems


def _stage_rows(summary: str) -> list[str]:
    """`stage STATUS` for each row of the summary's stage table (its status cell is `ICON STATUS`)."""
    lines = summary.splitlines()
    start = lines.index(_TABLE) + 2 if _TABLE in lines else len(lines)
    rows = []
    for line in lines[start:]:
        cells = [cell.strip() for cell in line.split("|")]
        if not line.startswith("|") or len(cells) < 4:
            break
        rows.append(f"{cells[1]} {cells[2].split()[-1] if cells[2] else ''}")
    return rows
