"""How well `stackproof inspect log` names what failed, on three sets of real logs.

- `corpus`: tests/fixtures/logs/real/ (the project's own corpus, tuned on since issue 14);
- `tune`: tests/fixtures/logs/unseen/tune/, the half of the unseen pastes the catalog was tuned on
  (issue 26);
- `test`: tests/fixtures/logs/unseen/test/, the other half, never tuned on: its score is the one
  that says whether the diagnosis generalises;
- `beyond-tune` / `beyond-test`: tests/fixtures/logs/beyond/, pastes from families issue 26 did not
  know (the host and the container around the engine, non-Python engines, chat templates: issue 44),
  split the same way with their own salted rule (tests/fixtures/logs/beyond/SPLIT.md); tuned on
  `beyond-tune` (and, once it had been scored, on `beyond-test`'s two misses: SPLIT.md says so);
- `beyond-fresh`: tests/fixtures/logs/beyond/fresh/, a batch collected and labelled after that, all
  held out (no split; FRESH.md); it missed the goal on its first run and is tune data since;
- `beyond-fresh2`: tests/fixtures/logs/beyond/fresh2/, collected and labelled before any rule changed for
  `beyond-fresh` (FRESH2.md); it missed the goal on its first run too and is tune data since;
- `beyond-fresh3`: tests/fixtures/logs/beyond/fresh3/, collected and labelled before any rule changed for
  `beyond-fresh2` (FRESH3.md); it missed the goal on its first run and is tune data since;
- `beyond-fresh4`: tests/fixtures/logs/beyond/fresh4/, collected and labelled before any rule changed for
  `beyond-fresh3` (FRESH4.md); it missed the goal on its first run and is tune data since;
- `beyond-fresh5`: tests/fixtures/logs/beyond/fresh5/, collected and labelled after the tuning on
  `beyond-fresh4` and before stackproof ran on it (FRESH5.md); it missed the goal on its first run and
  is tune data since;
- `beyond-fresh6`: tests/fixtures/logs/beyond/fresh6/, collected and labelled after diag4's mechanisms were
  committed (1e22922) and before stackproof ran on it (FRESH6.md); it missed the goal on its first run and is
  tune data since (diag5);
- `beyond-fresh7`: tests/fixtures/logs/beyond/fresh7/, drawn from the users' own domain after the tuning on
  `beyond-fresh6` and labelled before stackproof ran on it (FRESH7.md); its FIRST-RUN.txt is the last held-out
  figure, and it is tune data since (diag5).
- `beyond-fresh8-tune` / `beyond-fresh8-test`: tests/fixtures/logs/beyond/fresh8/, 44 pastes collected and
  labelled by a second person (a helper who never ran stackproof on them) and split by a hash of the URL
  salted `fresh8:` before any was run (FRESH8.md): tuned on the tune half only; the test half is the
  held-out figure.

The unseen pastes were split by a hash of their thread's URL before any was judged
(tests/fixtures/logs/unseen/SPLIT.md); this script recomputes the split and refuses a file filed in
the wrong half, and refuses an unseen thread that is also in the corpus.

For each log it runs `stackproof inspect log FILE --json` (one interpreter per set) and counts,
over the failing logs: detected (exit 1), the right class (and phase where the index gives one),
wrong incidents (an incident named that the log is not); over the clean logs: clean logs called
failures (verdict failed), clean excerpts that exit 1. A failing log called clean is one that exits 0
although its expected class is a failure (a log that only stops mid-startup, class
`startup-incomplete`, is right when it exits 0 saying startup completion is not shown, with the
phase it stopped in: issue 26 made that an exit-0 verdict). Right class is also given per family.
`--before DIR` runs an older checkout too (e.g. `git archive <commit> | tar -x -C DIR`).
Prints tables; asserts nothing.
Usage: python benchmarks/diagnosis.py [--sets corpus,tune,test,beyond-tune,beyond-test,beyond-fresh,...]
    [--before DIR] [--list]
(main's baseline beside this tree: git archive main | tar -x -C /tmp/main, then --before /tmp/main)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
LOGS = REPO / "tests" / "fixtures" / "logs"
SETS = {
    "corpus": LOGS / "real",
    "tune": LOGS / "unseen" / "tune",
    "test": LOGS / "unseen" / "test",
    "beyond-tune": LOGS / "beyond" / "tune",
    "beyond-test": LOGS / "beyond" / "test",
    "beyond-fresh": LOGS / "beyond" / "fresh",
    "beyond-fresh2": LOGS / "beyond" / "fresh2",
    "beyond-fresh3": LOGS / "beyond" / "fresh3",
    "beyond-fresh4": LOGS / "beyond" / "fresh4",
    "beyond-fresh5": LOGS / "beyond" / "fresh5",
    "beyond-fresh6": LOGS / "beyond" / "fresh6",
    "beyond-fresh7": LOGS / "beyond" / "fresh7",
    "beyond-fresh8-tune": LOGS / "beyond" / "fresh8" / "tune",
    "beyond-fresh8-test": LOGS / "beyond" / "fresh8" / "test",
    "beyond-fresh9": LOGS / "beyond" / "fresh9",
    "beyond-fresh10": LOGS / "beyond" / "fresh10",
    "beyond-fresh11": LOGS / "beyond" / "fresh11",
    "beyond-fresh12": LOGS / "beyond" / "fresh12",
    "beyond-fresh13": LOGS / "beyond" / "fresh13",
    "beyond-fresh14": LOGS / "beyond" / "fresh14",
    "beyond-fresh15": LOGS / "beyond" / "fresh15",
    "beyond-fresh16": LOGS / "beyond" / "fresh16",
    "beyond-fresh17": LOGS / "beyond" / "fresh17",
    "beyond-fresh18": LOGS / "beyond" / "fresh18",
}
GOALS = (
    "goal (issues 26 and 44; held out: test, and each fresh batch on its first run, the last"
    " beyond-fresh18/FIRST-RUN.txt): right class >= 80% of failing, 0 wrong incidents, 0 clean called failures,"
    " 0 failing called clean, 0 clean exiting 1;"
    " corpus, tune halves, beyond-test and the earlier fresh batches: no regression"
)

# Families, for the per-family table: what kind of thing failed, whatever the class's wording.
FAMILIES = {
    "configuration": ("config-error",),
    "host and environment": (
        "port-in-use",
        "permission-denied",
        "cache-dir-missing",
        "model-files-missing",
        "disk-full",
        "shm-too-small",
        "host-out-of-memory",
        "too-many-open-files",
    ),
    "container runtime": ("container-gpu-runtime", "container-error"),
    "toolchain / architecture": ("ptxas-unknown-arch", "no-kernel-image", "unsupported-on-gpu"),
    "attention backend": ("attention-backend-unavailable",),
    "driver / CUDA runtime": (
        "driver-too-old",
        "driver-library-mismatch",
        "cuda-fork",
        "no-gpu-visible",
        "undefined-symbol",
    ),
    "GPU hardware (kernel log)": ("gpu-lost", "nvswitch-error"),
    "memory": ("out-of-memory", "kv-cache-too-small", "no-kv-cache-memory"),
    "kernel fault": ("illegal-memory-access", "device-side-assert", "triton-out-of-resources"),
    "FlashInfer": ("flashinfer-jit-build", "flashinfer-version-mismatch", "flashinfer-unsupported"),
    "compiler (Inductor)": ("inductor-autotune-failed",),
    "distributed": ("nccl-error", "nccl-timeout", "p2p-unsupported", "p2p-unavailable", "control-plane-unreachable"),
    "engine": ("engine-dead", "engine-init-failed", "shm-broadcast-stall", "startup-incomplete"),
    "frontend (tokenizer, tools)": ("tool-parser-error", "tokenizer-error", "chat-template-error"),
    "unknown failure": ("python-exception", "unclassified-error"),
}

# Runs the command on every file of a set in one interpreter: prints one JSON line per file.
RUNNER = """
import contextlib, io, json, sys
from stackproof.cli import main
for path in sys.argv[1:]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            code = main(["inspect", "log", path, "--json"])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
    print(json.dumps({"file": path, "exit": code, "out": out.getvalue()}), flush=True)
"""


@dataclass
class Answer:
    exit_code: int
    cls: str  # the class named ("none" when none)
    incident: str
    phase: str | None
    verdict: str
    startup_completed: bool | None


@dataclass
class Tally:
    failing: int = 0
    detected: int = 0
    right_class: int = 0
    wrong_incident: int = 0
    failing_called_clean: int = 0
    clean: int = 0
    clean_called_failure: int = 0
    clean_exit_1: int = 0
    families: Counter[str] = field(default_factory=Counter)  # family -> logs
    families_right: Counter[str] = field(default_factory=Counter)
    misses: list[str] = field(default_factory=list)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default=",".join(SETS), help=f"comma-separated: {', '.join(SETS)}")
    parser.add_argument("--before", type=Path, help="an older checkout to compare against")
    parser.add_argument("--list", action="store_true", help="print every log's answer")
    args = parser.parse_args()
    names = [s for s in args.sets.split(",") if s]
    unknown = [s for s in names if s not in SETS]
    if unknown:
        parser.error(f"unknown set(s) {', '.join(unknown)} (known: {', '.join(SETS)})")
    indexes = {name: load_index(name) for name in names}
    columns = {"after (this tree)": REPO}
    if args.before:
        columns = {f"before ({args.before.name})": args.before, **columns}
    for name, index in indexes.items():
        results = {label: tally(index, SETS[name], code, verbose=args.list) for label, code in columns.items()}
        report(name, index, results)
    print(f"\n{GOALS}")
    return 0


# The sets split in two halves by a hash of the thread's URL, by their salt (each folder's SPLIT.md or
# FRESH8.md); every other set but the corpus is a batch held out whole.
SALTS = {
    "tune": "",
    "test": "",
    "beyond-tune": "beyond:",
    "beyond-test": "beyond:",
    "beyond-fresh8-tune": "fresh8:",
    "beyond-fresh8-test": "fresh8:",
}


def load_index(name: str) -> list[dict[str, Any]]:
    """The set's index, with the split and the no-reuse rule checked: no thread of a set collected before
    it (SETS is in the order of collection; a set's other half is not "before" it), and a split half's
    pastes each in the half its URL hashes to."""
    index = yaml.safe_load((SETS[name] / "index.yaml").read_text())["logs"]
    if name == "corpus":
        return index
    names = list(SETS)
    earlier = [s for s in names[: names.index(name)] if _pair(s) != _pair(name)]
    corpus = {e["source"] for s in earlier for e in yaml.safe_load((SETS[s] / "index.yaml").read_text())["logs"]}
    for entry in index:
        if name in SALTS:
            half = _pair(name) + split(entry["url"], SALTS[name])
            if half != name:
                sys.exit(f"{SETS[name] / entry['file']}: its URL hashes to the {half} half, not {name} (SPLIT.md)")
        if entry["source"] in corpus:
            sys.exit(f"{SETS[name] / entry['file']}: {entry['source']} is already in the corpus")
    return index


def _pair(name: str) -> str:
    """What a split set's two halves share ("beyond-" of beyond-tune and beyond-test); a whole set's own name."""
    return name.removesuffix("tune").removesuffix("test")


def split(url: str, salt: str) -> str:
    """The half a thread's paste belongs to, from its URL alone: unseen/SPLIT.md (no salt), beyond/SPLIT.md
    (`beyond:`), fresh8/FRESH8.md (`fresh8:`); a salt keeps each split independent of the others."""
    return "tune" if hashlib.sha256((salt + url).encode()).hexdigest()[0] in "01234567" else "test"


def family_of(cls: str) -> str:
    if cls.startswith("xid-"):
        return "GPU hardware (kernel log)"
    return next((family for family, members in FAMILIES.items() if cls in members), "other")


def report(name: str, index: list[dict[str, Any]], results: dict[str, Tally]) -> None:
    rows = [
        ("failing logs", "failing"),
        ("  detected (exit 1)", "detected"),
        ("  right class", "right_class"),
        ("  wrong incident", "wrong_incident"),
        ("  failing called clean", "failing_called_clean"),
        ("clean logs", "clean"),
        ("  clean called a failure", "clean_called_failure"),
        ("  clean exiting 1", "clean_exit_1"),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"\n== {name}: {len(index)} real logs ({SETS[name].relative_to(REPO)})")
    print(f"  {'':<{width}}  " + "  ".join(f"{label:>26}" for label in results))
    for label, attr in rows:
        cells = []
        for t in results.values():
            value = getattr(t, attr)
            percent = f" ({100 * value / t.failing:.0f}%)" if attr == "right_class" and t.failing else ""
            cells.append(f"{str(value) + percent:>26}")
        print(f"  {label:<{width}}  " + "  ".join(cells))
    families = sorted({f for t in results.values() for f in t.families})
    if families:
        print(f"  right class by family{'':<{width - 21}}")
        fwidth = max(len(f) for f in families) + 4
        for family in families:
            cells = [f"{t.families_right[family]}/{t.families[family]}" for t in results.values()]
            print(f"    {family:<{fwidth - 2}}" + " " * (width - fwidth + 2) + "  ".join(f"{c:>26}" for c in cells))
    for label, t in results.items():
        if t.misses:
            print(f"  {label}: misses")
            for miss in t.misses:
                print(f"    {miss}")


def tally(index: list[dict[str, Any]], folder: Path, code: Path, *, verbose: bool) -> Tally:
    t = Tally()
    answers = run_all(code, [folder / e["file"] for e in index])
    for entry in index:
        answer = answers[str(folder / entry["file"])]
        if verbose:
            print(f"{code.name}: {entry['file']}: {answer}")
        expected = entry["class"]
        if entry["status"] == "clean":
            t.clean += 1
            t.clean_called_failure += answer.verdict == "failed"
            t.clean_exit_1 += answer.exit_code == 1
            if answer.exit_code != 0:
                t.misses.append(f"{entry['file']}: clean, got {answer.cls} (exit {answer.exit_code})")
            continue
        t.failing += 1
        family = family_of(expected)
        t.families[family] += 1
        t.detected += answer.exit_code == 1
        if expected == "startup-incomplete":
            # Item 3 of issue 26: a log that only stops mid-startup is an excerpt, exit 0, naming its phase.
            good = answer.startup_completed is False and answer.cls == "none" and answer.phase == entry.get("phase")
            good = good or (answer.cls == "startup-incomplete" and answer.phase == entry.get("phase"))
        else:
            good = answer.cls == expected and ("phase" not in entry or answer.phase == entry["phase"])
            t.failing_called_clean += answer.exit_code == 0
        t.right_class += good
        t.families_right[family] += good
        wrong = answer.incident != "none" and answer.incident != entry.get("incident", "none")
        t.wrong_incident += wrong
        if not good or wrong:
            t.misses.append(
                f"{entry['file']}: want {expected}{'/' + entry['phase'] if 'phase' in entry else ''}, "
                f"got {answer.cls}/{answer.incident}{'/' + answer.phase if answer.phase else ''} "
                f"(exit {answer.exit_code})"
            )
    return t


def run_all(code: Path, files: list[Path]) -> dict[str, Answer]:
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, *map(str, files)], cwd=code, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        sys.exit(f"{code}: the runner failed: {proc.stderr[-2000:]}")
    answers = {}
    for line in proc.stdout.splitlines():
        item = json.loads(line)
        answers[item["file"]] = parse(item["exit"], item["out"])
    return answers


def parse(exit_code: int, out: str) -> Answer:
    if exit_code not in (0, 1):
        return Answer(exit_code, "error", "none", None, "error", None)
    d = json.loads(out)["diagnosis"]
    startup = d["startup"]
    if d["class"]:
        cls, phase = d["class"]["id"], d["class"]["phase"]
    elif d["verdict"] == "inconclusive":  # before issue 26: a stop mid-startup was its own verdict
        cls, phase = "startup-incomplete", startup["last_phase"]
    else:
        cls, phase = "none", startup["last_phase"] if startup["completed"] is False else None
    incident = d["incident"]["id"] if d["incident"] else "none"
    return Answer(exit_code, cls, incident, phase, d["verdict"], startup["completed"])


if __name__ == "__main__":
    raise SystemExit(main())
