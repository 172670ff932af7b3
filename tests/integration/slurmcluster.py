"""A real Slurm cluster for a test: munged, slurmctld and two slurmd on this host (127.0.0.1), from
Debian's slurm-wlm 22.05 packages (.ci/setup installs them), as the test's own daemons.

Two nodes with fake GPUs of two types (gres.conf over plain files, AutoDetect off: no driver): `vm`
(2 x gpu:h100, features sm90,h100) and `vm2` (1 x gpu:rtx5090, features sm120,rtx5090), one CPU each,
so a third CPU job queues. Everything lives in one temporary folder (its own munge key and socket,
ports picked free); every daemon is stopped by its pid, and so is every process a job left (found by
the cluster's SLURM_CONF in its environment), even when the test failed.
Recipe and what was seen: shared/reference/fleet-engines.md.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "squeue")
NODES = {
    "vm": {"gres": "gpu:h100:2", "features": "sm90,h100", "files": "nvidia[0-1]", "type": "h100"},
    "vm2": {"gres": "gpu:rtx5090:1", "features": "sm120,rtx5090", "files": "nvidia2", "type": "rtx5090"},
}
SLURMD_TIMEOUT_S = 6  # a killed slurmd's node is DOWN (its job NODE_FAIL) within about this


def missing_tools() -> list[str]:
    found = {tool: shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin") for tool in DAEMONS}
    return [tool for tool, path in found.items() if path is None]


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass
class Cluster:
    folder: Path
    conf: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str) -> str:
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30, check=True)
        return done.stdout

    def queue(self) -> list[str]:
        """Every job the controller still runs or holds (squeue: pending, running, completing)."""
        return self.run("squeue", "-h", "-o", "%i %T %N").split("\n")[:-1]

    def job(self, job_id: str) -> dict[str, str]:
        line = self.run("scontrol", "show", "job", "-o", job_id).strip()
        return dict(part.split("=", 1) for part in line.split() if "=" in part)

    def node_state(self, node: str) -> str:
        return self.run("sinfo", "-h", "-n", node, "-o", "%T").strip()

    def kill_slurmd(self, node: str) -> None:
        proc = self.procs[f"slurmd-{node}"]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def settled(self, timeout: float = 15) -> list[str]:
        """Wait for every job process to end (a step daemon outlives its job by a moment); the
        command lines of those left after `timeout`."""
        deadline = time.monotonic() + timeout
        while self.job_processes() and time.monotonic() < deadline:
            time.sleep(0.3)
        left = []
        for pid in self.job_processes():
            with suppress(OSError):
                left.append(f"{pid}: " + (Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()))
        return left

    def job_processes(self) -> list[int]:
        """Processes carrying this cluster's SLURM_CONF that are not its daemons (nor the controller's
        own helper, slurmscriptd): jobs and their step daemons."""
        mark = f"SLURM_CONF={self.conf}".encode()
        daemons = {p.pid for p in self.procs.values()}
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in daemons or int(entry.name) == os.getpid():
                continue
            with suppress(OSError):
                status = (entry / "status").read_text()
                parent = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
                if parent in daemons and "slurmscriptd" in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    continue
                if mark in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
        return found


def _write_conf(folder: Path, ports: list[int]) -> Path:
    host = socket.gethostname()
    lines = [
        "ClusterName=stackproof-test",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ports[0]}",
        "SlurmUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={folder}/munge.socket",
        f"StateSaveLocation={folder}/ctld",
        f"SlurmdSpoolDir={folder}/spool-%n",
        f"SlurmctldPidFile={folder}/slurmctld.pid",
        f"SlurmdPidFile={folder}/slurmd-%n.pid",
        f"SlurmctldLogFile={folder}/slurmctld.log",
        f"SlurmdLogFile={folder}/slurmd-%n.log",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "GresTypes=gpu",
        # Process tracking by parentage, no cgroups: isolation of devices is shown in the reference,
        # not needed to place and follow jobs; nothing is left in the cgroup tree to clean up.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "MpiDefault=none",
        "JobRequeue=0",
        "ReturnToService=2",
        f"SlurmdTimeout={SLURMD_TIMEOUT_S}",
        "MinJobAge=3600",
        "SchedulerType=sched/builtin",
        "KillWait=5",
        "InactiveLimit=0",
    ]
    for i, (name, node) in enumerate(NODES.items()):
        lines.append(
            f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={ports[1 + i]} CPUs=1 "
            f"Gres={node['gres']} Features={node['features']} State=UNKNOWN"
        )
    lines.append(f"PartitionName=main Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP")
    conf = folder / "slurm.conf"
    conf.write_text("\n".join(lines) + "\n")
    gres = ["AutoDetect=off"]
    for name, node in NODES.items():
        gres.append(f"NodeName={name} Name=gpu Type={node['type']} File={folder}/{node['files']}")
    (folder / "gres.conf").write_text("\n".join(gres) + "\n")
    for n in range(3):
        (folder / f"nvidia{n}").touch()  # fake GPUs: slurmd needs the files, nothing opens them
    return conf


def _start_munged(folder: Path) -> subprocess.Popen[bytes]:
    munge = pwd.getpwnam("munge")
    key = folder / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    for path in (folder, key):
        os.chown(path, munge.pw_uid, munge.pw_gid)
    argv = [
        "runuser", "-u", "munge", "--", shutil.which("munged") or "/usr/sbin/munged", "--foreground",
        f"--socket={folder}/munge.socket", f"--key-file={key}", f"--pid-file={folder}/munged.pid",
        f"--seed-file={folder}/munged.seed", f"--log-file={folder}/munged.log",
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait(lambda: (folder / "munge.socket").exists(), 10, "munged's socket", proc)
    return proc


def _wait(ready: object, timeout: float, what: str, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(ready) and ready():
            return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: the daemon exited ({proc.returncode})")
        time.sleep(0.2)
    raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")


@contextmanager
def slurm_cluster() -> Iterator[Cluster]:
    """Start the cluster; stop everything it started, by pid, whatever happened."""
    folder = Path(tempfile.mkdtemp(prefix="stackproof-slurm-"))
    folder.chmod(0o755)
    cluster = Cluster(folder=folder, conf=_write_conf(folder, _free_ports(1 + len(NODES))))
    (folder / "ctld").mkdir()
    try:
        cluster.procs["munged"] = _start_munged(folder)
        os.chown(folder, 0, 0)  # munged checked its key's folder; the daemons below write here as root
        cluster.procs["slurmctld"] = _daemon(cluster, ["slurmctld", "-D", "-i", "-f", str(cluster.conf)], "slurmctld")
        for node in NODES:
            cluster.procs[f"slurmd-{node}"] = _daemon(
                cluster, ["slurmd", "-D", "-N", node, "-f", str(cluster.conf)], node
            )

        def idle() -> bool:
            states = cluster.run("sinfo", "-h", "-N", "-o", "%N %T").split()
            return all(s in ("idle", "IDLE") for s in states[1::2]) and len(states) == 2 * len(NODES)

        _wait(idle, 30, "both nodes idle (sinfo)")
        yield cluster
    finally:
        _stop(cluster)


def _daemon(cluster: Cluster, argv: list[str], name: str) -> subprocess.Popen[bytes]:
    log = (cluster.folder / f"{name}.stdout").open("wb")
    path = shutil.which(argv[0], path="/usr/sbin:/usr/bin:/sbin:/bin") or argv[0]
    return subprocess.Popen([path, *argv[1:]], env=cluster.env, stdout=log, stderr=subprocess.STDOUT)


def _stop(cluster: Cluster) -> None:
    """Jobs' processes, then the node daemons, the controller and munged: each by its pid."""
    for pid in cluster.job_processes():
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for name in reversed(list(cluster.procs)):
        proc = cluster.procs[name]
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
    for pid in cluster.job_processes():  # a step that was starting while its slurmd stopped
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(cluster.folder, ignore_errors=True)
