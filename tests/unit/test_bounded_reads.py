"""Every file the tool reads on the user's word goes through the bounded reader (issue 27, classes 3
and 4): a FIFO with no writer, `/dev/zero` and a 4 GiB sparse file given as each of them is an
InputError naming the file (exit 2), never a wait without end, an out-of-memory exit 3 or a read
of gigabytes.

Each reader runs in a child process under an address-space cap and a timeout, as
tests/unit/test_fuzz.py runs the CLI: a reader that waits for a writer or reads an endless input
whole ends only that child. The CLI-level cases (`--matrix` a FIFO, `PIP_CONFIG_FILE` endless)
are in test_fuzz.py's `rel3-`/`rel4-` cases; tests/unit/test_direct_reads.py keeps new direct
reads from coming back.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CAP = 1 * 2**30  # the child's address space: the interpreter and the package fit, a 4 GiB read does not
TIMEOUT = 20

# Each reader, called on the hostile path `P` (a pathlib.Path), in a child that prints the
# InputError and exits 2 (the CLI's contract); whatever else happens (a hang, a MemoryError,
# a read that returns) fails the case.
READERS: dict[str, str] = {
    # --matrix (and the rule sets, signature catalog, autotune policies: one YAML loader)
    "matrix": "from pipeline.matrix.yamlsrc import load_yaml; load_yaml(P)",
    # `repro --write`: the matrix read again to append the cell (the cell is used only after the read)
    "repro-write-matrix": "from stackproof.reprocell import write_cell; write_cell(P, None, images_dir=P)",
    # `audit --fix`: the rule file read to apply the edits
    "audit-fix-rules": "from verify.audit.fix import apply_edits; apply_edits(P, [])",
    # `matrix propose --dockerfile`
    "propose-dockerfile": "from pipeline.releases.dockerfile import read_dockerfile; read_dockerfile(P)",
    # docker's config ($DOCKER_CONFIG/config.json, ~/.docker/config.json): registry credentials
    "docker-config": (
        "from pipeline.registry.oci import find_credentials;"
        "find_credentials('r.example', env={'DOCKER_CONFIG': str(P.parent), 'HOME': str(P.parent)})"
    ),
    # pip's configuration (PIP_CONFIG_FILE, ~/.pip/pip.conf): find-links and cert for the build
    "pip-config": (
        "from pipeline.matrix.site import _pip_config;"
        "_pip_config({'PIP_CONFIG_FILE': str(P), 'HOME': str(P.parent)}, ('global',), 'cert')"
    ),
    # a local mirror's wheel (STACKPROOF_MIRRORS or pip's find-links: a directory the user names)
    "mirror-wheel-hash": "from pipeline.cache import file_sha256; file_sha256(P)",
    # a `path:` model's directory (the matrix names it): its config.json for preflight
    "model-config": (
        "from types import SimpleNamespace as N; from pipeline.host.rules import model_config;"
        "model = N(kind='path', location=str(P.parent), source='path:' + str(P.parent));"
        "config, why = model_config(N(serve=N(model=model)));"
        "assert config is None and str(P) in why, why; print(why); sys.exit(2)"
    ),
    # `load --questions-file`: hashed for the degeneration baseline's key
    "questions-digest": "from verify.load.baselines import _digest; _digest(str(P))",
    # the canary file (the package's own today, read through the same reader)
    "canaries": "from verify.load.canary import read_canaries; read_canaries(P)",
    # `--images`: a template and a recipe's files
    "images-template": "from pipeline.build.render import template_text; template_text(P.parent, P.name)",
    "images-jinja": "from pipeline.build.render import render_template; render_template(P.parent, P.name)",
    # ab, sweep, bisect: the report written into --out and read back (a planted FIFO or symlink there)
    "out-read-back": (
        "from pipeline.guard.jsonfile import write_json_read_back;"
        "doc = write_json_read_back(P, {'a': 1}, 'A/B report'); assert doc == {'a': 1}, doc;"
        "assert P.is_file() and not P.is_symlink(); sys.exit(2)"
    ),
}

# Where the reader looks: the name the hostile file must have in its directory.
NAMES = {"docker-config": "config.json", "model-config": "config.json"}

CHILD = """
import sys
from pathlib import Path
from pipeline.errors import InputError
P = Path(sys.argv[1])
try:
{body}
except InputError as exc:
    print(f"InputError: {{exc}}")
    sys.exit(2)
print("returned without an error")
"""


def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))


def hostile(kind: str, directory: Path, name: str) -> Path:
    path = directory / name
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    else:  # a 4 GiB regular file that costs no disk: st_size is honest, a whole read is not affordable
        with path.open("wb") as f:
            f.truncate(4 * 2**30)
    return path


def run_reader(reader: str, path: Path, root: Path = REPO) -> subprocess.CompletedProcess[str]:
    body = textwrap.indent(READERS[reader].replace("; ", "\n").replace(";", "\n"), "    ")
    env = {**os.environ, "PYTHONPATH": str(root), "STACKPROOF_CACHE_DIR": str(path.parent / "cache")}
    return subprocess.run(
        [sys.executable, "-c", CHILD.format(body=body), str(path)],
        cwd=root,
        env=env,
        preexec_fn=_cap,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "sparse-4gib"])
@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_hostile_file_is_refused_naming_it(reader: str, kind: str, tmp_path: Path) -> None:
    if reader in ("out-read-back", "mirror-wheel-hash") and kind == "sparse-4gib":
        pytest.skip("a regular file is replaced (the report) or streamed, however large (a wheel)")
    path = hostile(kind, tmp_path, NAMES.get(reader, "input" + (".j2" if reader.startswith("images") else "")))
    try:
        proc = run_reader(reader, path)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{reader} given a {kind}: no answer within {TIMEOUT}s")
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 2, f"exit {proc.returncode}: {proc.stdout[-500:]} {proc.stderr[-2000:]}"
    if reader != "out-read-back":
        assert str(path) in proc.stdout, proc.stdout
