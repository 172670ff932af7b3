"""`stackproof fleet run --scheduler slurm` against a real Slurm (tests/integration/slurmcluster.py:
munged, slurmctld and two slurmd with fake GPUs of two types, on 127.0.0.1).

Proven for real: cpu-tiny-host verified inside a Slurm job (PASS, its fleet receipt naming job and
node); GPU cells placed by arch onto the node with their GPU type (sm90 -> vm, sm120 -> vm2), where
the cell's own preflight finds no NVIDIA driver (ERROR, exit 3: the fake GPUs are files); a cell no
node serves refused before anything is submitted, by the site file and by Slurm itself (exit 2); a
pending job cancelled and the run interrupted (CANCELLED receipts, exit 130, every job cancelled);
a node's slurmd killed mid-job (NODE_FAIL). After each: no job in the queue, no job process left.
"""

from __future__ import annotations

import calendar
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import JOB, REPO, python_as, runner_dir, stackproof
from tests.integration.slurmcluster import Cluster, missing_tools, slurm_cluster
from tests.launch import launched

pytestmark = pytest.mark.integration

HOST_CELL = "cpu-tiny-host"
SM90_CELL = "h200-vllm-0.26.0-tiny"  # runtime host, arch sm90
SM120_CELL = "sm120-vllm-0.28.0-release"  # runtime docker, arch sm120
SM121_CELL = "sm121-vllm-0.28.0-fi-0.6.18.post1-cu130"
GPU_ARCH = {"sm90": {"gres": "gpu:h100", "constraint": "sm90"}, "sm120": {"gres": "gpu:rtx5090"}}


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    missing = missing_tools()
    if missing:
        pytest.fail(f"Slurm is not installed ({', '.join(missing)} missing): .ci/setup installs it")
    with slurm_cluster() as running:
        yield running
    assert running.job_processes() == [], "a job's process outlived the cluster"


def write_site(folder: Path, arch: dict[str, object], **extra: object) -> Path:
    site = folder / "fleet.yaml"
    site.write_text(
        json.dumps({"schema_version": 1, "scheduler": "slurm", "shared_dir": str(folder), "arch": arch, **extra})
    )
    return site


def fleet(cluster: Cluster, site: Path, cells: list[str], user: str | None = None) -> tuple[int, str, list[dict]]:
    done = stackproof(
        ["fleet", "run", *cells, "--scheduler", "slurm", "--site", str(site), "--poll", "0.5", "--json"],
        env={"SLURM_CONF": str(cluster.conf)},
        user=user,
        timeout=900,
    )
    rows = json.loads(done.stdout).get("cells", []) if done.stdout.strip().startswith("{") else []
    return done.returncode, done.stderr, rows


def by_cell(rows: list[dict]) -> dict[str, dict]:
    return {row["cell"]: row for row in rows}


def record(case: str, rows: dict[str, dict]) -> None:
    """Each cell's fleet receipt in the log (docs/fleet.md's measured table is read from these lines)."""
    for cell, row in rows.items():
        s = row["scheduler"]
        sys.stderr.write(
            f"\nfleet: {case}: {cell}: status {row['status']}, state {s['state']}, reason {s['reason']}, "
            f"node {s['node']}, job exit {s['job_exit_code']}, dispatch {row['times']['dispatch_s']}s\n"
        )


def server_start_s(row: dict) -> float | None:
    """Submit to server start: the job's verification began (its receipt's started_at, whole seconds)
    plus the stages before `startup`, the stage that launches the server; minus the submit time."""
    receipt = json.loads(Path(row["receipt"]).read_text())
    before = 0.0
    for stage in receipt["stages"]:
        if stage["stage"] == "startup":
            started = calendar.timegm(time.strptime(receipt["started_at"], "%Y-%m-%dT%H:%M:%SZ"))
            return round(started + before - row["times"]["submitted_at"], 1)
        before += stage["seconds"] or 0.0
    return None


def test_cpu_tiny_host_verified_inside_a_slurm_job(cluster: Cluster, runner_user: str | None) -> None:
    shared = runner_dir(runner_user, "fleet-shared")
    try:
        built = stackproof(["build", HOST_CELL, "--out", str(shared / "build")], user=runner_user, timeout=1200)
        assert built.returncode == 0, built.stderr[-3000:]
        site = write_site(shared, {"none": {}})
        code, err, rows = fleet(cluster, site, [HOST_CELL], user=runner_user)
        assert code == 0, err[-4000:]
        row = by_cell(rows)[HOST_CELL]
        assert row["status"] == "PASS" and row["scheduler"]["state"] == "COMPLETED"
        assert row["scheduler"]["node"] in ("vm", "vm2") and row["scheduler"]["job_id"].isdigit()
        assert f"job {row['scheduler']['job_id']} RUNNING on {row['scheduler']['node']}" in err
        receipt = json.loads(Path(row["receipt"]).read_text())
        assert receipt["status"] == "PASS" and receipt["cell"] == HOST_CELL
        assert row["times"]["dispatch_s"] is not None and row["times"]["dispatch_s"] < 30
        sys.stderr.write(
            f"\nfleet: {HOST_CELL} dispatch {row['times']['dispatch_s']}s (submit to running), "
            f"{server_start_s(row)}s submit to server start\n"
        )
        record("verified", {HOST_CELL: row})
        folder = Path(row["receipt"]).parents[4]
        assert (folder / "site" / "index.html").is_file()
        assert json.loads((folder / HOST_CELL / "fleet-receipt.json").read_text())["status"] == "PASS"
        assert cluster.queue() == [] and cluster.settled() == []
    finally:
        subprocess.run(["rm", "-rf", str(shared)], check=False)


def test_gpu_cells_land_on_their_gpu_type_and_preflight_says_error(cluster: Cluster, tmp_path: Path) -> None:
    site = write_site(tmp_path, GPU_ARCH)
    code, err, rows = fleet(cluster, site, [SM90_CELL, SM120_CELL])
    assert code == 3, err[-3000:]
    cells = by_cell(rows)
    assert cells[SM90_CELL]["scheduler"]["node"] == "vm"  # gpu:h100, sm90
    assert cells[SM120_CELL]["scheduler"]["node"] == "vm2"  # gpu:rtx5090
    for row in cells.values():
        assert row["status"] == "ERROR" and row["exit_code"] == 3, row
        assert row["scheduler"]["state"] == "FAILED" and row["scheduler"]["job_exit_code"] == 3
        assert "preflight" in Path(row["output"]).read_text() or "NVIDIA" in Path(row["output"]).read_text()
    assert cells[SM90_CELL]["scheduler"]["request"] == "gres=gpu:h100:1, constraint=sm90"
    record("gpu cell, no driver", cells)
    assert cluster.queue() == [] and cluster.settled() == []


def test_a_cell_no_node_serves_is_refused_before_anything_is_submitted(cluster: Cluster, tmp_path: Path) -> None:
    site = write_site(tmp_path, {"none": {}, **GPU_ARCH})
    code, err, _ = fleet(cluster, site, [HOST_CELL, SM121_CELL])
    assert code == 2, err
    assert SM121_CELL in err and "sm121" in err and "offers" in err
    # The site maps the arch, the cluster has no such feature: Slurm's own refusal, before any submit.
    bad = write_site(tmp_path, {"none": {}, "sm90": {"gres": "gpu:h100", "constraint": "sm100"}})
    code, err, _ = fleet(cluster, bad, [HOST_CELL, SM90_CELL])
    assert code == 2, err
    assert SM90_CELL in err and "Invalid feature specification" in err
    assert cluster.run("squeue", "-h", "-a", "-t", "all", "-o", "%i") == ""  # not one job, ever
    assert list(tmp_path.glob("fleet-*")) == []


class Tool:
    """`stackproof fleet run` in the background, its stderr lines collected as they come."""

    def __init__(self, cluster: Cluster, site: Path, cells: list[str]) -> None:
        argv, env = python_as(None, ["-m", "pipeline", "fleet", "run", *cells, "--scheduler", "slurm",
                                     "--site", str(site), "--poll", "0.5"], {**os.environ})  # fmt: skip
        env.update(SLURM_CONF=str(cluster.conf), STACKPROOF_JOB=JOB)
        self.proc = subprocess.Popen(
            launched(argv), cwd=REPO, env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    def wait_for(self, ready: Callable[[str], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready("".join(self.lines)):
                return
            if self.proc.poll() is not None:
                time.sleep(0.2)
                pytest.fail(f"the tool exited ({self.proc.returncode}) before {what}: {''.join(self.lines)[-3000:]}")
            time.sleep(0.2)
        self.proc.kill()
        pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}: {''.join(self.lines)[-3000:]}")

    def finish(self, timeout: float = 90) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            sys.stderr.write("".join(self.lines)[-6000:])


def summary(tmp_path: Path) -> dict[str, dict]:
    return by_cell(json.loads(next(tmp_path.glob("fleet-*/fleet.json")).read_text()))


def test_a_cancelled_pending_job_then_an_interrupted_run(cluster: Cluster, tmp_path: Path) -> None:
    """Three CPU cells on two one-CPU nodes: two run (the site's setup line sleeps), one waits. The
    waiting one is cancelled from outside: CANCELLED. Then SIGINT: the run cancels the other two,
    records them, exits 130."""
    site = write_site(tmp_path, {"none": {}}, setup=["sleep 300"])
    cells = [HOST_CELL, "cpu-tiny", "sglang-cpu-tiny"]
    tool = Tool(cluster, site, cells)
    tool.wait_for(lambda text: text.count("RUNNING on") == 2 and "PENDING" in text, 60, "two running, one pending")
    pending = next(line.split()[0] for line in cluster.queue() if "PENDING" in line)
    cluster.run("scancel", pending)
    tool.wait_for(lambda text: "done: CANCELLED" in text, 30, "the cancelled job recorded")
    os.kill(tool.proc.pid, signal.SIGINT)
    assert tool.finish() == 130
    rows = summary(tmp_path)
    record("cancelled / interrupted", rows)
    assert {row["status"] for row in rows.values()} == {"CANCELLED"}
    assert {row["scheduler"]["state"] for row in rows.values()} == {"CANCELLED"}
    assert next(r for r in rows.values() if r["scheduler"]["job_id"] == pending)["scheduler"]["node"] is None
    assert cluster.queue() == []
    assert cluster.settled() == []


def test_a_node_lost_mid_job_gives_node_fail(cluster: Cluster, tmp_path: Path) -> None:
    site = write_site(tmp_path, GPU_ARCH, setup=["sleep 300"])
    tool = Tool(cluster, site, [SM120_CELL])
    tool.wait_for(lambda text: "RUNNING on vm2" in text, 30, "the job running on vm2")
    cluster.kill_slurmd("vm2")
    assert tool.finish(timeout=120) == 3
    row = summary(tmp_path)[SM120_CELL]
    record("node lost", {SM120_CELL: row})
    assert row["status"] == "NODE_FAIL" and row["scheduler"]["node"] == "vm2", row
    sys.stderr.write(f"\nfleet: node lost: {json.dumps(row['scheduler'])}\n")
    assert cluster.queue() == []
