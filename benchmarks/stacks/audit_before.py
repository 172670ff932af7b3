"""The meanings audit (verify/audit/meanings.py) on the matrix as it was before issue 42: main's
matrix.yaml, signatures.yaml and autotune_policies.yaml, and the vLLM driver without `dead_bodies`. It
must find, by itself, the dead-engine body that names no engine, the #55571 `fixed_in` that does not
hold on cuDNN 9.24, and the autotune policy whose cuDNN key does not cover the pins in force.

    python benchmarks/stacks/audit_before.py OLD_MATRIX OLD_SIGNATURES OLD_POLICIES CELL...

Prints each meaning finding and the time; exit 1 when the two findings are not both there.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from pipeline.matrix.read import load_matrix
from stackproof.auditjob import release_lookup
from verify import serving
from verify.audit.checks import Status


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("matrix_file", help="main's matrix.yaml as it was before issue 42")
    parser.add_argument("signatures_file", help="its signatures.yaml")
    parser.add_argument("policies_file", help="its autotune_policies.yaml")
    parser.add_argument("cells", nargs="+", help="the cells to audit")
    args = parser.parse_args(argv)
    matrix_file, signatures_file, policies_file, cells = (
        args.matrix_file,
        args.signatures_file,
        args.policies_file,
        args.cells,
    )
    import verify.audit
    import verify.logs.logscan as logscan
    from verify.kernels.policies import load_policies
    from verify.logs.catalog import load_catalog

    old_policies = load_policies(Path(policies_file))
    verify.audit.load_policies = lambda *a, **k: old_policies  # type: ignore[attr-defined]

    old = load_catalog(Path(signatures_file))
    logscan.load_catalog = lambda *a, **k: old  # type: ignore[assignment]
    before = dataclasses.replace(serving.DRIVERS["vllm"], dead_bodies=())
    serving.DRIVERS["vllm"] = before  # type: ignore[index]
    from stackproof.auditjob import audit_cells

    matrix = load_matrix(Path(matrix_file), images_dir=Path("images"))
    started = time.monotonic()
    report = audit_cells(matrix, [matrix.cell(c) for c in cells], release_lookup(matrix))
    seconds = time.monotonic() - started
    seen = set()
    for cell in report.cells:
        for f in cell.findings:
            if f.kind == "meaning":
                print(f"{cell.cell}: {f.status}: {f.subject}: {f.message}")
                if f.status is Status.ERROR:
                    kind = "policy" if "autotune policy" in f.subject else "fixed_in"
                    seen.add("body" if "dead-engine body" in f.subject else kind)
    print(f"audit of {len(cells)} cell(s) on the matrix before issue 42: {seconds:.1f} s")
    return 0 if seen == {"body", "fixed_in", "policy"} else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
