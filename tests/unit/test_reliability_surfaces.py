"""Issue 43: reliability on the surfaces added since issue 27 (A/B, bisect, sweep, propose, audit
--fix, the host runtime, the console), one test per mechanism, each seen failing first against main.
The end-to-end cases are tests/unit/test_fuzz.py's `i43-*` (benchmarks/hostile_inputs.py counts them)."""

from __future__ import annotations

import io
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pipeline.errors import InputError
from pipeline.guard.atomic import replace_text
from pipeline.guard.redact import RedactingStream, redact
from pipeline.matrix.model import RegistryBase
from pipeline.releases.dockerfile import read_dockerfile
from pipeline.releases.propose import _base_yaml

REPO = Path(__file__).resolve().parents[2]

# -- 1. quadratic work on ordinary input -----------------------------------------------------------


@pytest.mark.parametrize("piece", ["a", "a.", "eyJ-", "aa.bb-", "sk-", "a://"])
def test_redaction_is_linear_on_long_runs(piece: str) -> None:
    """Seen failing first: 20,000 letters took 2.4 s through the URL user-info pattern, so a
    300 kB environment value kept `doctor --json` for minutes (200 kB: about 240 s); now 200 kB of
    each shape takes about 0.1 s (the bound leaves room for a loaded CI host)."""
    text = piece * (200_000 // len(piece))
    started = time.monotonic()
    redact(text)
    assert time.monotonic() - started < 5


def test_redaction_still_removes_what_it_removed() -> None:
    jwt = "eyJhbGciOiJIUzI1.eyJzdWIiOiIxMjM0.c2lnbmF0dXJl"
    out = redact(f"https://bob:pw@host/x {jwt} HF_TOKEN=abc a" * 3)
    assert "bob" not in out and "pw@" not in out and "eyJhbGci" not in out and "abc" not in out


def test_nested_args_are_refused_at_their_line_not_grown(tmp_path: Path) -> None:
    """Billion laughs: each ARG four of the one before. Seen failing first (memory ran out)."""
    lines = ["FROM x", "ARG A0=xxxxxxxxxx"] + [f"ARG A{i}=" + f"${{A{i - 1}}}" * 4 for i in range(1, 40)]
    (tmp_path / "Dockerfile").write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=r"Dockerfile:7: \$\{A4\} expands past"):
        read_dockerfile(tmp_path / "Dockerfile")


def test_a_suffix_cut_of_a_long_value_is_bounded(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text(
        f'FROM x\nARG V={"a" * 4000}\nRUN X="${{V%%*a*a*b}}"\nARG CUDA_VERSION=12.9.1\n'
    )
    started = time.monotonic()
    assert read_dockerfile(tmp_path / "Dockerfile").require_cuda == "cuda>=12.9"
    assert time.monotonic() - started < 2
    (tmp_path / "Dockerfile").write_text(f"FROM x\nARG V={'a' * 100_000}\n")
    with pytest.raises(InputError, match=r"Dockerfile:2: "):
        read_dockerfile(tmp_path / "Dockerfile")


# -- 2. in-place edits that can lose the file ------------------------------------------------------

_WRITER = """
import signal, sys
from pathlib import Path
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit a write fails (EFBIG) instead of killing
path = Path(sys.argv[1])
if sys.argv[2] == "atomic":
    from pipeline.guard.atomic import replace_text
    replace_text(path, "y" * 50_000)
else:
    path.write_text("y" * 50_000)
"""


@pytest.mark.parametrize("how", ["atomic", "plain"])
def test_a_write_stopped_half_way_leaves_the_file_whole(tmp_path: Path, how: str) -> None:
    """A real file-size limit (RLIMIT_FSIZE) stops the write at 20,000 bytes. The plain write (what
    audit --fix and propose did) leaves a torn file; replace_text leaves the old one, and no temporary."""
    target = tmp_path / "matrix.yaml"
    target.write_text("x" * 1000)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))

    proc = subprocess.run(
        [sys.executable, "-c", _WRITER, str(target), how],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        preexec_fn=limit,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and "File too large" in proc.stderr
    if how == "plain":
        assert target.read_text() != "x" * 1000  # the torn file the fix replaces
    else:
        assert target.read_text() == "x" * 1000
        assert sorted(p.name for p in tmp_path.iterdir()) == ["matrix.yaml"]


def test_replace_text_keeps_the_mode(tmp_path: Path) -> None:
    target = tmp_path / "m.yaml"
    target.write_text("a")
    target.chmod(0o640)
    replace_text(target, "b")
    assert target.read_text() == "b" and target.stat().st_mode & 0o777 == 0o640


# -- 3. generated YAML that takes input verbatim ---------------------------------------------------


def _finding(rule: tuple[str, str, str], suggestion: str) -> object:
    from pipeline.result import Status
    from verify.audit.checks import Finding

    return Finding(kind="rule", subject="x", where="cell a", status=Status.ERROR, rule=rule, suggestion=suggestion)


RULES = """\
cells:
  - id: a
    rules:
      - {id: 'same', expect: 'same'}  # an id spelled like its pattern
      - {id: other, expect: 'old text'}
"""


def test_a_fix_rewrites_the_pattern_never_the_id(tmp_path: Path) -> None:
    from verify.audit.fix import plan_fix

    path = tmp_path / "matrix.yaml"
    path.write_text(RULES)
    plan = plan_fix(path, [_finding(("same", "expect", "same"), "same new")])
    assert plan.unfixed == 0
    assert yaml.safe_load(plan.new_text)["cells"][0]["rules"][0] == {"id": "same", "expect": "same new"}


def test_a_multi_line_replacement_is_escaped_not_folded(tmp_path: Path) -> None:
    """Seen failing first: a replacement holding a newline was single-quoted across two lines, which
    YAML folds into a space, and reported rewritten."""
    from verify.audit.fix import plan_fix

    path = tmp_path / "matrix.yaml"
    path.write_text(RULES)
    plan = plan_fix(path, [_finding(("other", "expect", "old text"), "new\ntext")])
    assert plan.unfixed == 0 and len(plan.new_text.splitlines()) == len(RULES.splitlines())
    assert yaml.safe_load(plan.new_text)["cells"][0]["rules"][1]["expect"] == "new\ntext"


def test_a_fix_that_does_not_read_back_is_not_claimed(tmp_path: Path) -> None:
    from verify.audit.fix import Edit, reread_problems

    edit = Edit(line=5, old="old text", new="new", rule_id="other", kind="expect")
    assert reread_problems(RULES, RULES.replace("'old text'", "'new'"), [edit]) == []
    assert reread_problems(RULES, RULES.replace("'old text'", "'new'").replace("'same'}", "'x'}"), [edit])


def test_a_file_name_with_a_newline_writes_no_line_of_its_own() -> None:
    """Seen failing first: `propose --dockerfile` with a name holding a newline put a `digest:`
    line into the proposed base (exit 0)."""
    old = RegistryBase(name="old", image="vllm/vllm-openai:v0.28.0", digest=None, python="python3")
    why = "From ARG CUDA_VERSION of x\n    digest: sha256:" + "e" * 64 + " (given with --dockerfile)."
    text = "bases:\n" + _base_yaml("vllm-openai-0.33.0", "0.33.0", old, ("cuda>=13.0", why))
    base = yaml.safe_load(text)["bases"]["vllm-openai-0.33.0"]
    assert "digest" not in base and base["require_cuda"] == "cuda>=13.0"


# -- 7. a terminal that is not a terminal -------------------------------------------------------------


def test_escape_sequences_never_reach_the_terminal() -> None:
    out = io.StringIO()
    stream = RedactingStream(out)
    stream.write("value \x1b]0;owned\x07 \x1b[2J\x9b end\n")
    stream.write_control("\x1b[1A\x1b[J")
    stream.flush()
    assert out.getvalue() == "value \\x1b]0;owned\\x07 \\x1b[2J\\x9b end\n\x1b[1A\x1b[J"


@pytest.mark.parametrize(
    ("redirect", "code"),
    [(">&-", 3), (">/dev/full", 3), ("2>&- >/dev/null", 0)],
    ids=["stdout-closed", "stdout-full", "stderr-closed"],
)
def test_a_stdout_that_cannot_take_output_is_exit_3_without_traceback(redirect: str, code: int) -> None:
    """Seen failing first: a closed stdout or stderr was a traceback and exit 120."""
    shell = f"{sys.executable} -m pipeline matrix list {redirect}"
    proc = subprocess.run(
        ["bash", "-c", shell],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == code and "Traceback" not in proc.stdout + proc.stderr
    if code == 3:
        assert "stdout" in proc.stderr


# -- 4. false passes on the host runtime -----------------------------------------------------------


def _host_cell() -> object:
    from pipeline.matrix.read import load_matrix

    return load_matrix(REPO / "matrix.yaml", images_dir=REPO / "images").cell("cpu-tiny-host")


def test_a_given_environment_without_the_lock_fails_the_lock_check() -> None:
    """Seen failing first: a locked host cell given an environment holding none of its lock passed
    `--stages imports` (no check compared the two)."""
    from pipeline.build.lock import read_lock
    from pipeline.host.env import HostEnv
    from pipeline.result import Status
    from stackproof.runjob import _lock_check

    cell = _host_cell()
    lock = read_lock(cell)  # type: ignore[arg-type]
    whole = tuple((p.name, p.version) for p in lock.packages)
    env = HostEnv(python=Path(sys.executable), root=None, digest="sha256:x", python_version="3.11.9", packages=3,
                  source="given", versions=(("pyyaml", "6.0"),))  # fmt: skip
    check = _lock_check(cell, env)  # type: ignore[arg-type]
    assert check is not None and check.status is Status.FAIL and "locked at" in check.message
    held = HostEnv(**{**env.__dict__, "versions": whole})
    passed = _lock_check(cell, held)  # type: ignore[arg-type]
    assert passed is not None and passed.status is Status.PASS


def test_a_module_that_shadows_its_distribution_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen failing first: a `given:` environment whose metadata says one version and whose
    importable module is another copy passed. Now the file `import` loads must be the distribution's."""
    from pipeline.host.env import import_differences

    assert import_differences(Path(sys.executable), ("pyyaml",)) == ()
    (tmp_path / "yaml").mkdir()
    (tmp_path / "yaml" / "__init__.py").write_text("__version__ = 'other'\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    (found,) = import_differences(Path(sys.executable), ("pyyaml",))
    assert "import yaml" in found and str(tmp_path) in found


_FORKER = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(child.pid, flush=True)
if sys.argv[1] == "hang":
    time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text() if Path(f"/proc/{pid}/stat").exists() else ""
    return bool(stat) and stat.split(")")[-1].split()[0] != "Z"


def test_what_a_command_starts_ends_with_it(tmp_path: Path) -> None:
    """Seen failing first: the grandchild of an interpreter (a `--python` that forks) outlived the
    command, and on a timeout it kept the pipe open, so the caller waited for it, not its timeout."""
    from pipeline import cmd
    from pipeline.errors import InfraError

    done = cmd.run([sys.executable, "-c", _FORKER, "exit"], quiet=True, timeout=30)
    pid = int(done.stdout.split()[0])
    time.sleep(0.2)
    assert not _alive(pid)
    started = time.monotonic()
    with pytest.raises(InfraError, match="timed out"):
        cmd.run([sys.executable, "-c", _FORKER, "hang"], quiet=True, timeout=1)
    assert time.monotonic() - started < 8
