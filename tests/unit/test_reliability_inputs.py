"""Issue 27, classes 3, 4 and 6 on the signature surface: the key files, the trusted root and the
registry password are inputs like any other, read through the one bounded reader
(pipeline/guard/boundedio.py). Before: `pull --key /dev/zero` read until memory ran out (exit 3,
"out of memory"), `pull --key FIFO` waited for ever for a writer, and `--password-stdin < /dev/zero`
read stdin whole. Each case runs in a child process under an address-space cap and a timeout, so a
regression costs that child, not the test run."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MEMORY_CAP = 1 * 2**30


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def _child(argv: list[str], *, stdin: Path | None = None, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STACKPROOF_")}
    env |= {"PYTHONPATH": str(REPO), "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    with open(stdin or os.devnull, "rb") as source:
        return subprocess.run(
            [sys.executable, *argv],
            cwd=REPO,
            env=env,
            stdin=source,
            preexec_fn=_capped,
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def _cli(*args: str, stdin: Path | None = None) -> subprocess.CompletedProcess[str]:
    matrix = ["--matrix", str(REPO / "matrix.yaml"), "--images", str(REPO / "images")]
    return _child(["-m", "pipeline", *args, *matrix], stdin=stdin)


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)  # nobody ever writes to it
    return path


@pytest.mark.parametrize("kind", ["device", "fifo"])
def test_a_key_file_that_never_ends_is_exit_2_naming_it(kind: str, fifo: Path) -> None:
    key = Path("/dev/zero") if kind == "device" else fifo
    proc = _cli("pull", "cpu-tiny", "--registry", "127.0.0.1:9/stackproof", "--key", str(key))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"--key {key}" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("loader", ["load_private_key", "load_public_key"])
@pytest.mark.parametrize("kind", ["device", "fifo", "huge"])
def test_the_key_loaders_read_through_the_bounded_reader(loader: str, kind: str, fifo: Path, tmp_path: Path) -> None:
    path = {"device": Path("/dev/zero"), "fifo": fifo, "huge": tmp_path / "huge.pem"}[kind]
    if kind == "huge":
        with path.open("wb") as f:
            f.truncate(2**30)  # sparse: a GiB that costs no disk
    code = (
        "from pathlib import Path\nfrom pipeline.errors import InputError\nfrom pipeline.registry import attest\n"
        f"try:\n    attest.{loader}(Path({str(path)!r}))\nexcept InputError as exc:\n    print('InputError:', exc)\n"
    )
    proc = _child(["-c", code])
    assert proc.returncode == 0 and proc.stdout.startswith("InputError:"), (proc.stdout + proc.stderr)[-2000:]
    assert str(path) in proc.stdout


@pytest.mark.parametrize("kind", ["device", "fifo"])
def test_a_trusted_root_that_never_ends_is_bad_input(kind: str, fifo: Path) -> None:
    pytest.importorskip("sigstore", reason="the keyless extra (sigstore-python) is not installed")
    path = Path("/dev/zero") if kind == "device" else fifo
    bundle = REPO / "tests/fixtures/sigstore/a.dsse.staging-rekor-v2.txt.sigstore.json"
    code = (
        "from pathlib import Path\nfrom pipeline.errors import InputError\nfrom pipeline.registry import attest\n"
        "try:\n"
        f"    attest.verify_sigstore_bundle(Path({str(bundle)!r}).read_bytes(), "
        "identity=attest.Identity(issuer='https://i', subject='s'), "
        f"digest='sha256:' + '0' * 64, trusted_root=Path({str(path)!r}))\n"
        "except InputError as exc:\n    print('InputError:', exc)\n"
    )
    proc = _child(["-c", code])
    assert proc.returncode == 0 and proc.stdout.startswith("InputError: --trusted-root"), (proc.stdout + proc.stderr)[
        -2000:
    ]


def test_a_password_on_stdin_without_end_is_exit_2() -> None:
    proc = _cli("pull", "cpu-tiny", "--registry", "127.0.0.1:9/stackproof", "--password-stdin", stdin=Path("/dev/zero"))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "--password-stdin" in proc.stderr and "Traceback" not in proc.stderr


# -- what leaves the process is bounded too: an error quoting a 10 MB line ---------------------------------


@pytest.mark.parametrize("as_json", [False, True])
def test_an_error_quoting_a_ten_megabyte_line_prints_a_bounded_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], as_json: bool
) -> None:
    """Before: `repro` of a 10 MB one-line file whose line begins `vLLM: ` printed the whole line
    in its error (10,000,040 characters on stderr, and again in the --json document)."""
    import json

    from stackproof.cli import main

    source = tmp_path / "src.txt"
    source.write_bytes(b"vLLM: " * (10_000_000 // 6))
    matrix = ["--matrix", str(REPO / "matrix.yaml"), "--images", str(REPO / "images")]
    assert main(["repro", str(source), *matrix, "--offline", *(["--json"] if as_json else [])]) == 2
    captured = capsys.readouterr()
    assert f"{source.name}:1: vllm: no version in 'vLLM: vLLM: " in captured.err
    assert len(captured.err) < 20_000 and "characters not shown" in captured.err
    if as_json:
        document = json.loads(captured.out)
        assert document["error"]["exit_code"] == 2 and len(captured.out) < 40_000
