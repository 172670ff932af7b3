"""Issue 16 proofs on the real daemon: concurrent verifies kept apart, containers of dead runs
collected, and planted secrets found nowhere (layers, history, config, argv, logs, reports).

Cheap on purpose: `--stages imports` starts no server, and the secrets build is one small layer on
cpu-tiny's image from an index served on 127.0.0.1.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import os
import re
import socket
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.docker.client import Docker
from pipeline.docker.gc import owner_start_time
from tests.integration.conftest import JOB, REPO, containers, docker_cmd, stackproof, write_matrix
from tests.integration.test_build import _marked_wheel

pytestmark = pytest.mark.integration

TOKEN = "plantedIdxTok3n9f8e7d6c5b4a"
ENV_TOKEN = "hf_plantedEnvironmentToken12345"
REPORTER_TOKENS = ("sk-plantedReporterKey1234567890", "hf_plantedReporterHubToken123")


# -- concurrency -----------------------------------------------------------------------------------


def test_four_verifies_of_one_cell_at_once_keep_every_receipt_and_log_apart(
    docker: Docker, cpu_tiny: str, tmp_path: Path
) -> None:
    argv = [sys.executable, "-m", "pipeline", "verify", "cpu-tiny", "--stages", "imports", "--json"]
    env = {**os.environ, "STACKPROOF_JOB": JOB}
    procs = [
        subprocess.Popen(
            [*argv, "--out", str(tmp_path)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    results = [p.communicate(timeout=600) for p in procs]
    for proc, (stdout, stderr) in zip(procs, results, strict=True):
        assert proc.returncode == 0, stderr[-3000:]
        assert json.loads(stdout)["outcome"]["passed"] is True
    runs = sorted((tmp_path / "cpu-tiny").glob("run-*"))
    assert len(runs) == 4, f"4 verifies, {len(runs)} run directories: {runs}"
    for run in runs:  # each run wrote its own full set, none was lost or overwritten by another
        receipt = json.loads((run / "receipt.json").read_text())
        assert [(s["stage"], s["status"]) for s in receipt["stages"]] == [("imports", "PASS")]
        files = {p.name for p in run.iterdir()}
        assert {"imports-probe.json", "junit.xml", "summary.md"} <= files and "report.json" not in files
    # each process names a different receipt: run directories are not shared
    named = [re.search(r"receipt \w+: (\S+)", err) for _, err in results]
    assert sorted(m.group(1) for m in named if m) == sorted(str(run / "receipt.json") for run in runs)
    assert containers("io.stackproof.role=probe") == []


# -- containers of dead runs ------------------------------------------------------------------------


def test_gc_removes_containers_of_dead_runs_only(docker: Docker, cpu_tiny: str) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that no longer runs: the owner of a run killed with SIGKILL
    host = socket.gethostname()
    me = os.getpid()
    names = {"dead": f"stackproof-gc-dead-{me}", "alive": f"stackproof-gc-alive-{me}"}
    owners = {"dead": (gone.pid, "12345"), "alive": (me, owner_start_time(me) or "")}
    try:
        for kind, name in names.items():
            pid, start = owners[kind]
            docker_cmd(
                "create", "--name", name, "--entrypoint", "/bin/true",
                "--label", "io.stackproof.role=server", "--label", f"io.stackproof.job={JOB}",
                "--label", f"io.stackproof.owner-host={host}", "--label", f"io.stackproof.owner-pid={pid}",
                "--label", f"io.stackproof.owner-start={start}", cpu_tiny,
            )  # fmt: skip
        result = stackproof(["gc", "--json"])
        assert result.returncode == 0, result.stderr[-2000:]
        assert names["dead"] in result.json()["removed"]
        left = docker_cmd("ps", "--all", "--format", "{{.Names}}", "--filter", f"label=io.stackproof.job={JOB}").split()
        assert names["dead"] not in left and names["alive"] in left
    finally:
        for name in names.values():
            docker_cmd("rm", "--force", name, check=False)


# -- secrets ----------------------------------------------------------------------------------------


class _AuthIndex(http.server.BaseHTTPRequestHandler):
    """A PEP 503 index on 127.0.0.1 that serves only with the planted credentials."""

    wheel: Path
    authorized: list[str]

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        expected = "Basic " + base64.b64encode(f"ci:{TOKEN}".encode()).decode()
        if self.headers.get("Authorization") != expected:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="planted"')
            self.end_headers()
            return
        self.authorized.append(self.path)
        wheel = type(self).wheel
        if self.path.rstrip("/") == "/simple/planted-pkg":
            digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
            body = f'<a href="/files/{wheel.name}#sha256={digest}">{wheel.name}</a>'.encode()
            self._send(body, "text/html")
        elif self.path == f"/files/{wheel.name}":
            self._send(wheel.read_bytes(), "application/octet-stream")
        else:
            self.send_response(404)
            self.end_headers()

    def _send(self, body: bytes, kind: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def auth_index(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    handler = type(
        "Handler",
        (_AuthIndex,),
        {"wheel": _marked_wheel(wheels, "planted_pkg", "1.0", marker="planted"), "authorized": []},
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", handler.authorized
    finally:
        server.shutdown()
        server.server_close()


class _ArgvSampler(threading.Thread):
    """Reads every process's argv (/proc/*/cmdline, as `ps` does) every 20 ms while it runs."""

    def __init__(self, needles: tuple[str, ...]) -> None:
        super().__init__(daemon=True)
        self.needles = tuple(n.encode() for n in needles)
        self.samples = 0
        self.pip_seen = 0
        self.hits: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for entry in os.scandir("/proc"):
                if not entry.name.isdigit():
                    continue
                try:
                    with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                        cmdline = f.read()
                except OSError:
                    continue
                if b"pip\x00install" in cmdline:
                    self.pip_seen += 1
                self.hits += [
                    cmdline.replace(b"\x00", b" ").decode(errors="replace") for n in self.needles if n in cmdline
                ]
            self.samples += 1
            time.sleep(0.02)


def _image_bytes_contain(tag: str, needles: tuple[bytes, ...]) -> list[str]:
    """Stream `docker save` (every layer, the config, the manifest) and look for the needles."""
    found: list[str] = []
    proc = subprocess.Popen([docker_cli(), "save", tag], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    with tarfile.open(fileobj=proc.stdout, mode="r|") as outer:
        for member in outer:
            f = outer.extractfile(member)
            if f is None:
                continue
            tail = b""
            while chunk := f.read(1 << 20):
                window = tail + chunk
                found += [f"{member.name}: {n.decode()}" for n in needles if n in window]
                tail = window[-256:]
    proc.wait(timeout=600)
    return found


def docker_cli() -> str:
    from tests.integration.conftest import engine_cli

    return engine_cli()


REPORT = """\
- GPU: NVIDIA RTX PRO 6000 Blackwell Workstation Edition (96 GB)
- vLLM: 0.28.0
- FlashInfer: 0.6.18.post1
- Model: mistralai/Ministral-3-14B-Instruct-2512
- VLLM_API_KEY={sk}

```
docker run --gpus all -e HF_TOKEN={hf} -e VLLM_API_KEY={sk} vllm/vllm-openai:v0.28.0 \\
  mistralai/Ministral-3-14B-Instruct-2512 --hf-token {hf} --api-key {sk} --max-num-batched-tokens 8192
```
"""


def test_planted_secrets_are_found_nowhere(
    docker: Docker, cpu_tiny: str, tmp_path: Path, auth_index: tuple[str, list[str]]
) -> None:
    address, authorized = auth_index
    cell = {
        "id": "secret-probe",
        "base": "cpu-tiny-image",
        "arch": "none",
        "overrides": {"planted-pkg": {"version": "1.0", "index": "private"}},
        "serve": None,
    }
    matrix = write_matrix(tmp_path / "matrix.yaml", extra_cells=[cell])
    text = matrix.read_text().replace("indexes:\n", 'indexes:\n  private: {url: "https://private.example/simple"}\n', 1)
    matrix.write_text(text)
    out = tmp_path / "out"
    env = {
        "STACKPROOF_MIRRORS": f"pytorch-cpu=/opt/wheels,private=http://ci:{TOKEN}@{address}/simple",
        "HF_TOKEN": ENV_TOKEN,
        "VLLM_API_KEY": ENV_TOKEN,
    }
    needles = (TOKEN, ENV_TOKEN, *REPORTER_TOKENS)

    # A reporter's text: repro drops every secret, says so, and writes none.
    report = tmp_path / "report.md"
    report.write_text(REPORT.format(sk=REPORTER_TOKENS[0], hf=REPORTER_TOKENS[1]))
    repro = stackproof(
        ["repro", str(report), "--matrix", str(matrix), "--images", str(REPO / "images"), "--offline", "--json"],
        env=env,
    )
    repro_text = repro.stdout + repro.stderr
    assert "a secret; never copied into the cell" in repro_text, repro_text[-3000:]
    assert not [n for n in needles if n in repro_text]

    # A build from an index whose URL carries a token, with secrets in the environment.
    sampler = _ArgvSampler(needles)
    sampler.start()
    try:
        build = stackproof(
            ["build", "secret-probe", "--matrix", str(matrix), "--images", str(REPO / "images"),
             "--out", str(out), "--json", "--no-cache"],  # BuildKit's cache ignores secrets: pip must run
            env=env,
            timeout=900,
        )  # fmt: skip
    finally:
        sampler.done.set()
        sampler.join()
    assert build.returncode == 0, build.stderr[-4000:]
    tag = str(build.json()["tag"])
    try:
        assert any(p.startswith("/files/planted_pkg") for p in authorized), "pip never used the credentials"
        assert sampler.samples > 20 and sampler.pip_seen > 0, "the sampler saw no pip process"
        assert sampler.hits == [], "a secret was in a process's argv"
        shown = build.stdout + build.stderr
        logs = "".join(p.read_text() for p in out.rglob("*") if p.is_file() and not p.is_symlink())
        config = docker_cmd("image", "inspect", tag)
        history = docker_cmd("image", "history", "--no-trunc", "--format", "{{.CreatedBy}}", tag)
        for where, content in {"output": shown, "logs+reports": logs, "config": config, "history": history}.items():
            assert not [n for n in needles if n in content], f"a planted secret is in the {where}"
        assert _image_bytes_contain(tag, tuple(n.encode() for n in needles)) == []
    finally:
        docker_cmd("image", "rm", "--force", tag, check=False)
