"""Issue 43: reliability on the surfaces added since issue 27 (A/B, bisect, sweep, propose, audit
--fix, the host runtime, the console), one test per mechanism, each seen failing first against main.
The end-to-end cases are tests/unit/test_fuzz.py's `i43-*` (benchmarks/hostile_inputs.py counts them)."""

from __future__ import annotations

import io
import os
import re
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


def test_a_given_environment_without_the_lock_fails_the_lock_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen failing first: a locked host cell given an environment holding none of its lock passed
    `--stages imports` (no check compared the two). The lock is cpu-tiny's own (locks/cpu-tiny.lock.json)."""
    from types import SimpleNamespace

    from pipeline.build.lock import Lock, LockedPackage
    from pipeline.guard.jsonfile import read_json
    from pipeline.host import env as host_env
    from pipeline.host.env import HostEnv
    from pipeline.result import Status
    from stackproof.runjob import _lock_check

    data = read_json(REPO / "locks" / "cpu-tiny.lock.json", "lock")
    packages = tuple(
        LockedPackage(name=p["name"], version=p["version"], index=p["index"], hashes=()) for p in data["packages"]
    )
    monkeypatch.setattr(host_env, "read_lock", lambda cell: Lock(cell="cpu-tiny", inputs_digest="", packages=packages))
    cell = SimpleNamespace(install=object(), uninstall=("triton",), overrides=())
    env = HostEnv(python=Path(sys.executable), root=None, digest="sha256:x", python_version="3.11.9", packages=3,
                  source="given", versions=(("pyyaml", "6.0"),))  # fmt: skip
    check = _lock_check(cell, env)  # type: ignore[arg-type]
    assert check is not None and check.status is Status.FAIL and "locked at" in check.message
    held = HostEnv(**{**env.__dict__, "versions": tuple((p.name, p.version) for p in packages if p.name != "triton")})
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


# -- 5. arguments checked before anything starts ------------------------------------------------------

VALID_MATRIX = """\
schema_version: 1
indexes:
  pypi: {url: "https://pypi.org/simple"}
bases:
  img:
    image: "example/img:1.0"
    digest: "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
cells:
  - id: a
    base: img
    platform: linux/amd64
    arch: none
    serve:
      model: {source: "hf:org/model", revision: "0123456789abcdef0123456789abcdef01234567"}
      load: {questions: 4, concurrency: 2}
"""


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["sweep", "a", "--sweep", "concurrency=1,1000000000"], "--sweep"),
        (["sweep", "a", "--sweep", "rate=1,1e9"], "--sweep"),
        (["ab", "a", "a", "--slice", "1e-9"], "--slice"),
        (["ab", "a", "a", "--slice", "604800"], "--slice"),
        (["bisect", "a", "--package", "../../etc", "--good", "1", "--bad", "2"], "--package"),
        (["bisect", "a", "--package", "", "--good", "1", "--bad", "2"], "--package"),
    ],
)
def test_an_absurd_argument_is_exit_2_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], option: str
) -> None:
    """Seen failing first: each was taken, and refused only after a server or an index was asked
    (here, with no docker daemon: exit 3), or never."""
    from stackproof.cli import main

    (tmp_path / "m.yaml").write_text(VALID_MATRIX)
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--matrix", str(tmp_path / "m.yaml")])
    assert exited.value.code == 2 and option in capsys.readouterr().err


def test_sensible_arguments_still_parse() -> None:
    from stackproof.cli.common import package_name, slice_seconds
    from verify.perf.sweep import parse_sweep

    assert slice_seconds("20") == 20.0 and package_name("flashinfer-python") == "flashinfer-python"
    assert parse_sweep("concurrency=1,4096").values == (1.0, 4096.0)


def test_a_bisection_past_its_version_cap_is_refused_before_any_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen failing first: 3,000 listed versions meant 3,000 environments built before any A/B."""
    from types import SimpleNamespace

    from packaging.version import Version

    from stackproof import bisection

    listed = tuple(Version(f"1.{i}") for i in range(3000))
    monkeypatch.setattr(bisection, "list_versions", lambda *a, **k: listed)
    cell = SimpleNamespace(install=None, platform="linux/amd64")
    site = SimpleNamespace(index_location=lambda matrix, index: None)
    ask = bisection.Bisect(cell=cell, package="x", good="1.0", bad="1.2999", metric="output_tok_s",  # type: ignore[arg-type]
                           threshold=0.05, index=None, plan=None)  # fmt: skip
    with pytest.raises(InputError, match=r"--good 1\.0 --bad 1\.2999: 3,000 versions"):
        bisection.candidate_versions(None, site, ask, (("x", "pypi", ""),))  # type: ignore[arg-type]
    small = bisection.Bisect(**{**ask.__dict__, "bad": "1.9"})
    assert len(bisection.candidate_versions(None, site, small, (("x", "pypi", ""),))) == 10  # type: ignore[arg-type]


def test_a_wheel_tag_that_does_not_parse_fits_nothing() -> None:
    """Seen failing first: `cp3x` in an abi3 wheel's tag raised ValueError out of bisect."""
    from pipeline.releases.simpleindex import versions_of_files

    files = [("x-1.0-cp3x-abi3-manylinux_2_28_x86_64.whl", False), ("x-2.0-cp39-abi3-manylinux_2_28_x86_64.whl", False)]
    assert [str(v) for v in versions_of_files(files, "x", python="3.11", machine="x86_64")] == ["2.0"]


def test_probe_kernels_gives_up_on_a_hung_interpreter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen failing first: a --python that never answers kept `probe kernels` for the probe's hour."""
    from pipeline.errors import InfraError
    from stackproof import kernels

    hung = tmp_path / "python"
    hung.write_text("#!/bin/sh\nsleep 300\n")
    hung.chmod(0o755)
    monkeypatch.setattr(kernels, "CHECK_TIMEOUT_S", 1)
    started = time.monotonic()
    with pytest.raises(InfraError, match="timed out"):
        kernels._check_interpreter(str(hung))
    assert time.monotonic() - started < 8
    # an interpreter that answers gets the real limit back: on a busy box its start alone can pass 1 s
    monkeypatch.setattr(kernels, "CHECK_TIMEOUT_S", 60)
    with pytest.raises(InfraError, match=r"cannot import .*flashinfer.*pip install"):
        kernels._check_interpreter(sys.executable)


# -- 6. documents read back by `report` ----------------------------------------------------------------

PERFDOCS = REPO / "tests" / "fixtures" / "perfdocs"


@pytest.mark.parametrize(
    ("raw", "value", "message"),
    [
        ('"slice_s": 5.0', "Infinity", "Infinity is not a JSON number"),
        ('"pairs": 10', "9" * 5000, "an integer of 5,000 digits"),
        ('"seed": 0', "1e999", "1e999 is past a number's range"),
    ],
    ids=["infinity", "huge-integer", "past-float"],
)
def test_a_document_holding_what_json_does_not_is_refused(tmp_path: Path, raw: str, value: str, message: str) -> None:
    """Seen failing first: Infinity was taken (exit 0), a 5,000-digit integer was a traceback."""
    from pipeline.guard.typeddoc import read_strict_json

    text = (PERFDOCS / "ab.json").read_text()
    assert raw in text
    (tmp_path / "ab.json").write_text(text.replace(raw, f"{raw.split(':')[0]}: {value}"))
    with pytest.raises(InputError, match=rf"ab\.json: not strict JSON: {re.escape(message)}"):
        read_strict_json(tmp_path / "ab.json", "A/B report", limit=1 << 20)


def test_a_field_of_the_wrong_type_is_refused_naming_it() -> None:
    """Seen failing first: `faults: {A: "many"}` was shown as a report (exit 0)."""
    import json

    from pipeline.guard.typeddoc import check_schema

    for name in ("ab", "sweep", "bisect"):  # the producers' own documents pass
        check_schema(json.loads((PERFDOCS / f"{name}.json").read_text()), f"{name}.json", name, f"{name}.schema.json")
    document = json.loads((PERFDOCS / "ab.json").read_text())
    document["faults"]["A"] = "many"
    with pytest.raises(InputError, match=r"ab\.json: faults\.A: 'many' is not of type 'integer'"):
        check_schema(document, "ab.json", "A/B report", "ab.schema.json")


# -- 8. index trouble called the right thing -----------------------------------------------------------

PIP_TAIL = (
    "Could not fetch URL http://127.0.0.1:1/simple/vllm/: HTTPConnectionPool(host='127.0.0.1', port=1): Max retries "
    "exceeded with url: /simple/vllm/ (Caused by ResponseError('too many 500 error responses')) - skipping\n"
    "ERROR: No matching distribution found for vllm==0.28.0"
)


def test_an_index_that_cannot_answer_is_exit_3_and_pip_reads_no_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen failing first: a mirror answering 500 was exit 1 ("No matching distribution"), and
    site-wide pip configuration reached a command documented as isolated."""
    from pipeline import cmd
    from pipeline.errors import InfraError
    from pipeline.releases import pins

    seen: dict[str, object] = {}

    def failing(argv: list[str], **kw: object) -> object:
        seen.update(argv=argv, env=kw.get("env"))
        raise cmd.CommandFailed(argv, 1, PIP_TAIL)

    monkeypatch.setattr(pins.cmd, "run", failing)
    with pytest.raises(InfraError, match=r"could not answer for vllm==0\.28\.0: .*500 error responses"):
        pins.fetch_metadata("vllm", "0.28.0", "linux/amd64", find_links=Path("/srv/wheels"))
    assert seen["env"] == {"PIP_CONFIG_FILE": os.devnull}
    argv = seen["argv"]
    assert isinstance(argv, list) and "--no-index" in argv and "--index-url" not in argv and "/srv/wheels" in argv

    def no_such(argv: list[str], **kw: object) -> object:
        raise cmd.CommandFailed(argv, 1, "ERROR: No matching distribution found for vllm==9.9.9")

    monkeypatch.setattr(pins.cmd, "run", no_such)
    with pytest.raises(cmd.CommandFailed):  # the index answered: no such version is not exit 3
        pins.fetch_metadata("vllm", "9.9.9", "linux/amd64")


def test_a_local_pypi_mirror_is_read_not_the_public_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.matrix.read import load_matrix
    from stackproof.auditjob import release_lookup

    (tmp_path / "m.yaml").write_text(VALID_MATRIX)
    (tmp_path / "wheels").mkdir()
    monkeypatch.setenv("STACKPROOF_MIRRORS", f"pypi={tmp_path / 'wheels'}")
    lookup = release_lookup(load_matrix(tmp_path / "m.yaml", images_dir=REPO / "images"))
    assert lookup.fetch.keywords["find_links"] == tmp_path / "wheels"  # type: ignore[attr-defined]
    assert "pypi.org" not in lookup.fetch.keywords["index_url"]  # type: ignore[attr-defined]


def test_a_registry_answer_under_the_rate_floor_is_given_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen failing first: one byte a second was read until the 300 s total; now given up at the
    floor (1 KiB/s, averaged after 20 s of body). A fake clock: one chunk a second."""
    from pipeline.errors import InfraError
    from pipeline.guard import httppolicy

    clock = iter(range(10_000))
    monkeypatch.setattr(httppolicy.time, "monotonic", lambda: float(next(clock)))
    with pytest.raises(InfraError, match=r"bytes/s for 21s"):
        httppolicy.read_capped((b"{" for _ in range(400)), policy=httppolicy.DEFAULT, what="registry", started=0.0)
    clock = iter(range(10_000))
    body = httppolicy.read_capped((b"x" * 65536 for _ in range(60)), policy=httppolicy.DEFAULT, what="r", started=0.0)
    assert len(body) == 60 * 65536
