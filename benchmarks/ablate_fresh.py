"""Would the catalog have caught the fresh batches without the patterns tuned on them? (issue 44, diag4)

Each of the five fresh batches (tests/fixtures/logs/beyond/fresh*/) missed the bar on its first run and was
then tuned on: some thirty patterns whose comment says "tuned on the ... fresh batch". This script copies
two trees (a base commit, default main, and this working tree), removes from each catalog every match
pattern whose own comment block says so, and runs benchmarks/diagnosis.py on the fresh batches: the base
column is what its general rules alone get, this tree's column what the mechanisms (errno, CUDA, NVML and
NCCL tables, process death, components) get. It is no held-out figure (the misses were read before the
mechanisms were written); the held-out figure is the next batch's first run.

Usage: python benchmarks/ablate_fresh.py [--base main]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CATALOG = Path("verify/logs/failure_classes.yaml")
SETS = "beyond-fresh,beyond-fresh2,beyond-fresh3,beyond-fresh4,beyond-fresh5"


def ablate(text: str) -> tuple[str, int]:
    """The catalog without the patterns whose own comment block says they were tuned on a fresh batch."""
    out: list[str] = []
    comment: list[str] = []
    after_pattern, dropped = False, 0
    for line in text.split("\n"):
        stripped = line.strip()
        if stripped.startswith("#"):
            comment = [] if after_pattern else comment
            comment.append(line)
            out.append(line)
            after_pattern = False
        elif line.startswith("      - "):
            after_pattern = True
            if any("fresh batch" in c or "beyond/fresh" in c for c in comment):
                dropped += 1
                continue
            out.append(line)
        else:
            comment, after_pattern = [], False
            out.append(line)
    return "\n".join(out), dropped


def tree(source: str | None, into: Path) -> int:
    """A copy of `source` (a commit; None: the working tree) with its catalog ablated; the patterns dropped."""
    into.mkdir(parents=True)
    if source is None:
        files = subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True, check=True
        ).stdout.split(b"\0")
        for name in filter(None, files):
            target = into / name.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            if (REPO / name.decode()).is_file():
                target.write_bytes((REPO / name.decode()).read_bytes())
    else:
        archive = subprocess.run(["git", "archive", source], cwd=REPO, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    text, dropped = ablate((into / CATALOG).read_text())
    (into / CATALOG).write_text(text)
    return dropped


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="main", help="the commit whose general rules are the baseline")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base, here = Path(tmp) / "base", Path(tmp) / "here"
        dropped = (tree(args.base, base), tree(None, here))
        print(f"# patterns tuned on the fresh batches, dropped: {args.base} {dropped[0]}, this tree {dropped[1]}")
        run = [sys.executable, str(here / "benchmarks" / "diagnosis.py"), "--sets", SETS, "--before", str(base)]
        return subprocess.run(run, cwd=here, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
