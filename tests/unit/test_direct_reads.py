"""No file the user hands in is read past the bounded reader (issue 27's Done-when).

A source scan, not a grep: the AST of every module of the three packages is read and every direct
file read (`.read_text()`, `.read_bytes()`, `open(...)`/`Path.open(...)` for reading, `json.load`,
`zipfile.ZipFile`, a `shutil` copy) is named by module and function. Each such function must be in
ALLOWED with its reason: the tool's own output read back, a kernel file (/proc, /sys), the
system's configuration, the tool's cache or store, a probe run inside the image (which has no
`pipeline` package), or the package's own data. Anything a user hands in (a path from argv or the
environment, the user's home config, a file in a directory the user names) goes through
pipeline/guard/boundedio.py (or jsonfile.read_json, built on it) and never appears here. A new
direct read fails the test; so does an entry that no longer reads (the list stays exact). The scan
is shown to find a planted read, so an empty answer is not a blind one.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("stackproof", "verify", "pipeline")
THE_READER = "pipeline/guard/boundedio.py"

OWN = "the tool's own file, written by this process or an earlier run of it"
CACHE = "the tool's cache (STACKPROOF_CACHE_DIR): written by the tool, any unreadable entry is rebuilt"
KERNEL = "a kernel file (/proc, /sys/fs/cgroup)"
SYSTEM = "the system's own configuration (/etc, /usr/include), root's, not an input"
PROBE = "a probe run inside the image: stdlib only, its input written by the tool for it"
PACKAGE = "the package's own data, shipped with it"
STORE = "the tool's model or environment store: written by the tool (or the hub client it runs)"
WHEEL = "a wheel the tool downloaded into its cache (audit members are read under a byte cap)"
LOG = "a log the tool's own child process wrote"

# module -> {function: reason}; "<module>" for a read at module level.
ALLOWED: dict[str, dict[str, str]] = {
    "stackproof/ab.py": {"_log_head": LOG + " (the side's server log, read under a 16 MiB cap)"},
    "stackproof/site_report/render.py": {"render_site": PACKAGE},
    "pipeline/guard/typeddoc.py": {"_validator": PACKAGE + " (docs/*.schema.json)"},
    "pipeline/build/bootstrap.py": {"_unmount_below": KERNEL},
    "pipeline/build/image.py": {
        "_built_mark": LOG,
        "write_context": OWN + "; a mirror's wheel is copied after file_sha256 opened it through boundedio",
    },
    "pipeline/cache.py": {"file_sha256": CACHE},
    "pipeline/docker/client.py": {"_detect_cli_cached": CACHE},
    "pipeline/docker/gc.py": {"stat_fields": KERNEL},
    "pipeline/docker/gpuaccess.py": {
        "_spec_kind": SYSTEM + "; CDI specs in the directories docker info names, size-capped"
    },
    "pipeline/host/env.py": {"built_env_at": STORE},
    "pipeline/host/facts.py": {"_cdi_specs": SYSTEM},
    "pipeline/host/geometry.py": {"cpu_model": KERNEL, "_os_name": SYSTEM},
    "pipeline/host/layer.py": {"_rewrite_scripts": STORE},
    "pipeline/host/modelstore.py": {"verify_snapshot": STORE, "_hashes": STORE},
    "pipeline/host/proc.py": {"_marks": KERNEL},
    "pipeline/matrix/site.py": {"_apt_mirror": SYSTEM},
    "pipeline/releases/pins.py": {"fetch_metadata": LOG},
    "pipeline/releases/table.py": {"load_table": PACKAGE, "write_release": PACKAGE, "cached_release": CACHE},
    "verify/audit/__init__.py": {"_archive": WHEEL},
    "verify/audit/index.py": {
        "index_files": WHEEL,
        "_index_members": WHEEL,
        "_index_batch": WHEEL,
        "_read_members": WHEEL,
    },
    "verify/audit/store.py": {"read_document": CACHE},
    "verify/audit/wheels.py": {
        "fetch_wheel": LOG,
        "_latest": CACHE,
        "_remember_latest": CACHE,
        "_missing": CACHE,
        "_remember_missing": CACHE,
        "_known": CACHE,
        "_remember": CACHE,
        "_sha256": CACHE,
    },
    "verify/forensics/cpucost.py": {"read": KERNEL, "_quota": KERNEL, "_stat": KERNEL},
    "verify/forensics/pyspy.py": {"_fetch": WHEEL, "_extract": WHEEL},
    "verify/load/baselines.py": {"read_baseline": CACHE},
    "verify/probes/doctor_probe.py": {
        "_cpu_model": KERNEL,
        "_os_release": SYSTEM,
        "_container": KERNEL,
        "security_facts": KERNEL,
        "_cudnn_header_version": SYSTEM,
    },
    "verify/probes/inimage_probe.py": {"distributions": PROBE},
    "verify/probes/kernel_probe.py": {"main": PROBE + " (--config is stackproof/kernels.py's file)"},
    "verify/runtime/host.py": {
        "follow_logs": LOG,
        "copy_out": OWN + " (the host run's files, copied into --out)",
        "remove_dead_host_runs": OWN,
        "_remove_home": OWN,
    },
    "verify/stages/autotune.py": {"run_autotune": LOG, "_keep": OWN + " (the tuner's output)"},
    "verify/stages/imports.py": {"probe_base": CACHE},
    "verify/stages/load.py": {"run_load_stage": LOG},
    "verify/stages/startup.py": {"run_startup": LOG},
}

READ_METHODS = frozenset({"read_text", "read_bytes"})
COPIES = frozenset({"copy", "copy2", "copyfile", "copytree", "copyfileobj"})


def direct_reads(source: str) -> list[tuple[str, int, str]]:
    """(enclosing function, line, what) for each direct file read in `source`."""
    tree = ast.parse(source)
    found: list[tuple[str, int, str]] = []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            function = node.name
        if isinstance(node, ast.Call):
            what = _read_call(node)
            if what:
                found.append((function, node.lineno, what))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, "<module>")
    return found


def _read_call(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Attribute):
        owner = func.value.id if isinstance(func.value, ast.Name) else None
        if func.attr in READ_METHODS and owner != "boundedio":
            return f".{func.attr}()"
        if func.attr == "open" and owner not in ("os", "tarfile", "io") and _reads(call, mode_at=0):
            return ".open() for reading"
        if func.attr == "load" and owner == "json":
            return "json.load()"
        if func.attr == "ZipFile":
            return "zipfile.ZipFile()"
        if func.attr in COPIES and owner == "shutil":
            return f"shutil.{func.attr}()"
    elif isinstance(func, ast.Name):
        if func.id == "open" and _reads(call, mode_at=1):
            return "open() for reading"
        if func.id == "ZipFile":
            return "ZipFile()"
    return None


def _reads(call: ast.Call, *, mode_at: int) -> bool:
    mode: ast.expr | None = call.args[mode_at] if len(call.args) > mode_at else None
    mode = next((k.value for k in call.keywords if k.arg == "mode"), mode)
    if mode is None:
        return True
    return not (isinstance(mode, ast.Constant) and isinstance(mode.value, str) and set(mode.value) & set("wax"))


def unlisted(allowed: dict[str, dict[str, str]]) -> tuple[list[str], list[str]]:
    """(direct reads in no allowed function, allowed functions that no longer read)."""
    new, seen = [], set()
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            module = str(path.relative_to(REPO))
            if module == THE_READER:
                continue
            for function, line, what in direct_reads(path.read_text()):
                if function in allowed.get(module, {}):
                    seen.add((module, function))
                else:
                    new.append(f"{module}:{line}: {function} reads a file directly ({what})")
    stale = [f"{m}: {f}" for m, functions in allowed.items() for f in functions if (m, f) not in seen]
    return new, stale


def test_no_file_a_user_hands_in_is_read_past_the_bounded_reader() -> None:
    new, stale = unlisted(ALLOWED)
    assert new == [], (
        "read these through pipeline.guard.boundedio (or jsonfile.read_json), or, for the tool's own "
        "output or a kernel file, list the function in ALLOWED with its reason:\n" + "\n".join(new)
    )
    assert stale == [], "these no longer read a file directly: take them off ALLOWED:\n" + "\n".join(stale)


def test_the_scan_sees_each_kind_of_direct_read() -> None:
    planted = """
import json, shutil, zipfile
from pathlib import Path

def reads(path: Path, args):
    a = path.read_text()
    b = Path(args.config).read_bytes()
    with open(args.canary) as f:
        c = json.load(f)
    with path.open("rb") as f:
        d = f.read()
    e = zipfile.ZipFile(path)
    shutil.copyfile(path, "x")
    return a, b, c, d, e

def writes(path: Path):
    path.write_text("x")
    with open(path, "w") as f, path.open(mode="a") as g:
        f.write("x"); g.write("y")
"""
    assert [(f, line) for f, line, _ in direct_reads(planted)] == [
        ("reads", 6),
        ("reads", 7),
        ("reads", 8),
        ("reads", 9),
        ("reads", 10),
        ("reads", 12),
        ("reads", 13),
    ]
