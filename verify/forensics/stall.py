"""Stall forensics and GPU cost for one load run: the evidence taken before anything is killed.

When the watchdog concludes ENGINE_STALL_API_ALIVE the server is still there, wedged. Before the
run ends and the container is removed, `StallForensics.collect` takes, each step on its own (one
failing never stops the others, and none ever changes the verdict):

1. a `py-spy dump --json` of every engine process (the titles the serving driver names: its
   engine core and workers), where the runtime can ptrace them (`Runtime.dump_stacks`: on docker a
   sidecar that shares the server's PID namespace, py-spy mounted read-only; on the host py-spy
   itself, limited to the server's PIDs);
2. the GPU over the stall window against the load before it, judged by the spin rule
   (verify/forensics/spin.py), from the cost sampler's NVML samples;
3. for GPU cells that opt in (`serve.forensics.cuda_coredump`), a CUDA user-triggered core dump:
   the server runs with CUDA_ENABLE_USER_TRIGGERED_COREDUMP=1 and CUDA_COREDUMP_PIPE in an
   anonymous volume; writing to the pipe makes the driver dump the GPU state to CUDA_COREDUMP_FILE
   (CUDA driver API, CU_COREDUMP_ENABLE_USER_TRIGGER: "a coredump can be created by writing to
   the system pipe specified by CU_COREDUMP_PIPE"), which is copied out with `Runtime.copy_out`.

Everything lands under `<run>/load/forensics/`; the evidence names each file relative to the run
directory, and says why a piece is missing where one is.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pipeline.docker.client import Docker
from pipeline.matrix.model import Cell
from verify.forensics.cpucost import CpuSampler, cpu_cost_fields, empty_cpu_fields
from verify.forensics.gpucost import GpuSample, GpuSampler, cost_section, empty_cost_section, open_reader
from verify.forensics.pyspy import PySpy, find_py_spy
from verify.forensics.spin import DeviceWindow, GpuStallVerdict, SpinJudgement, judge_spin
from verify.runtime import Runtime, as_runtime
from verify.serving import driver_for

if TYPE_CHECKING:  # the load run's outcome, only as a type: the load run calls back into these instruments
    from pipeline.findings import LoadSummary
    from verify.load.outcome import LoadOutcome

__all__ = [
    "COREDUMP_DIR",
    "LoadInstruments",
    "ProcessStack",
    "RuntimeSide",
    "StallForensics",
    "coredump_env",
    "gpu_windows",
    "parse_stacks",
]

COREDUMP_DIR = "/stackproof-coredump"  # an anonymous volume of the server container
PER_PROCESS_TIMEOUT_S = 20
COREDUMP_WAIT_S = 180.0

# Runs in the sidecar (the server's own image, so its python3) or on the host: every engine process
# of the shared PID namespace (on the host: of the PIDs given as a fourth argument), dumped one at a
# time; a process stopped by a signal is reported, not attached to (ptrace on a stopped process
# would wait for it).
_DUMP_SCRIPT = """
import json, os, subprocess, sys
spy, prefixes, limit = sys.argv[1], tuple(sys.argv[2].split(",")), float(sys.argv[3])
only = set(sys.argv[4].split(",")) if len(sys.argv) > 4 else None
found = []
for entry in sorted((e for e in os.listdir("/proc") if e.isdigit()), key=int):
    if only is not None and entry not in only:
        continue
    try:
        with open(f"/proc/{entry}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\\0", b" ").decode(errors="replace").strip()
        with open(f"/proc/{entry}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        continue
    if not cmdline.startswith(prefixes):
        continue
    item = {"pid": int(entry), "cmdline": cmdline[:200], "state": state}
    if state in ("T", "t"):
        item["error"] = "stopped by a signal (state " + state + "): not attached"
    else:
        try:
            argv = [spy, "dump", "--json", "--pid", entry]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=limit)
            item.update(returncode=done.returncode, stdout=done.stdout, stderr=done.stderr[-2000:])
        except subprocess.TimeoutExpired:
            item["error"] = f"py-spy did not answer within {limit:g}s"
    found.append(item)
print(json.dumps(found))
"""


def coredump_env() -> dict[str, str]:
    """The server's environment for a user-triggered CUDA core dump (cuda-gdb docs, "GPU core dump
    support"): the pipe the driver listens on and the file it writes, per process (%p), in the
    anonymous volume; lightweight (no global, shared, local or constant-bank memory, no
    non-relocated ELF images: a dump of a 141 GB card's memory is not evidence anyone reads)."""
    return {
        "CUDA_ENABLE_USER_TRIGGERED_COREDUMP": "1",
        "CUDA_COREDUMP_PIPE": f"{COREDUMP_DIR}/corepipe.cuda.%p",
        "CUDA_COREDUMP_FILE": f"{COREDUMP_DIR}/core.cuda.%p",
        "CUDA_COREDUMP_SHOW_PROGRESS": "1",
        "CUDA_COREDUMP_GENERATION_FLAGS": (
            "skip_nonrelocated_elf_images,skip_global_memory,skip_shared_memory,skip_local_memory,skip_constbank_memory"
        ),
    }


# -- what a dump says (pure) ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ProcessStack:
    pid: int
    cmdline: str
    state: str
    threads: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    def frames(self, per_thread: int = 25) -> list[str]:
        """Every thread's innermost frames as `function (file:line)`, the main thread's first (the
        busy loop runs there; helper threads only wait)."""
        threads = sorted(self.threads, key=lambda t: t.get("thread_name") != "MainThread")
        return [
            f"{frame.get('name')} ({frame.get('short_filename') or frame.get('filename')}:{frame.get('line')})"
            for thread in threads
            for frame in (thread.get("frames") or [])[:per_thread]
        ]

    def summary(self, depth: int = 6) -> dict[str, Any]:
        threads = [
            {
                "name": t.get("thread_name"),
                "active": t.get("active"),
                "top": [
                    f"{f.get('name')} ({f.get('short_filename') or f.get('filename')}:{f.get('line')})"
                    for f in (t.get("frames") or [])[:depth]
                ],
            }
            for t in self.threads
        ]
        return {"pid": self.pid, "cmdline": self.cmdline, "state": self.state, "error": self.error, "threads": threads}


def parse_stacks(text: str) -> list[ProcessStack]:
    """The sidecar's JSON (one item per process, py-spy's own JSON in `stdout`)."""
    stacks = []
    for item in json.loads(text):
        threads: list[dict[str, Any]] = []
        error = item.get("error")
        if error is None:
            try:
                threads = json.loads(item.get("stdout") or "[]")
            except ValueError:
                error = "py-spy printed no JSON"
            if item.get("returncode"):
                error = f"py-spy exited {item['returncode']}: {(item.get('stderr') or '').strip()[-300:]}"
        stacks.append(
            ProcessStack(
                pid=int(item["pid"]), cmdline=item["cmdline"], state=item["state"], threads=threads, error=error
            )
        )
    return stacks


def gpu_windows(samples: list[GpuSample], *, window_start: float, load_start: float) -> dict[int, DeviceWindow]:
    """Per GPU the server used: power under load (before the window) and readings in the window."""
    used = {d.index for s in samples for d in s.devices if d.server_pids}
    used = used or {d.index for s in samples for d in s.devices}  # the server's PIDs never showed: all
    windows: dict[int, DeviceWindow] = {}
    for index in sorted(used):
        before = [d for s in samples if load_start <= s.at < window_start for d in s.devices if d.index == index]
        during = [d for s in samples if s.at >= window_start for d in s.devices if d.index == index]
        windows[index] = DeviceWindow(
            loaded_power_w=[d.power_w for d in before if d.power_w is not None],
            window_util_percent=[d.util_percent for d in during if d.util_percent is not None],
            window_power_w=[d.power_w for d in during if d.power_w is not None],
        )
    return windows


# -- orchestration ----------------------------------------------------------------------------------


class ForensicsSide(Protocol):
    """The side effects, one method each (a fake in unit tests, `RuntimeSide` for real)."""

    def dump_stacks(self) -> tuple[str | None, str]: ...  # (sidecar JSON or None, origin or why not)

    def gpu_samples(self) -> tuple[list[GpuSample], float] | str: ...  # (samples, load start) or why none

    def cuda_coredump(self, dest: Path) -> dict[str, Any]: ...


@dataclass(kw_only=True)
class StallForensics:
    side: ForensicsSide
    run_dir: Path  # evidence paths are relative to it
    titles: tuple[str, ...] = ()  # the engine's process titles (the serving driver's), for messages
    coredump: bool = False
    clock: Callable[[], float] = time.monotonic
    forensics_dir: Path | None = None  # default: <run>/load/forensics

    @property
    def out_dir(self) -> Path:
        return self.forensics_dir or self.run_dir / "load" / "forensics"

    def collect(self, stalled_for_s: float) -> dict[str, Any]:
        """The evidence of one stall (paths relative to the run directory); never raises."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        window_start = self.clock() - stalled_for_s
        evidence: dict[str, Any] = {"dir": self._rel(self.out_dir)}
        for key, step in (
            ("py_spy", self._stacks),
            ("gpu", lambda: self._gpu(window_start)),
            ("cuda_coredump", self._coredump),
        ):
            try:
                evidence[key] = step()
            except Exception as exc:  # forensics must never replace the verdict they document
                evidence[key] = {"available": False, "reason": f"{type(exc).__name__}: {str(exc)[:300]}"}
        return evidence

    def _stacks(self) -> dict[str, Any]:
        text, origin = self.side.dump_stacks()
        if text is None:
            return {"available": False, "reason": origin}
        path = self.out_dir / "py-spy.json"
        path.write_text(text)
        stacks = parse_stacks(text)
        if not stacks:
            reason = f"no {' or '.join(t + '*' for t in self.titles) or 'engine'} process in the server"
            return {"available": False, "reason": reason, "file": self._rel(path)}
        return {
            "available": True,
            "origin": origin,
            "file": self._rel(path),
            "processes": [s.summary() for s in stacks],
            "frames": {str(s.pid): s.frames()[:100] for s in stacks},
        }

    def _gpu(self, window_start: float) -> dict[str, Any]:
        got = self.side.gpu_samples()
        if isinstance(got, str):
            return SpinJudgement(verdict=GpuStallVerdict.NOT_MEASURED, reason=got).to_json()
        samples, load_start = got
        path = self.out_dir / "gpu-samples.jsonl"
        path.write_text("".join(json.dumps(s.to_json()) + "\n" for s in samples))
        judgement = judge_spin(gpu_windows(samples, window_start=window_start, load_start=load_start))
        return {**judgement.to_json(), "file": self._rel(path), "window_s": round(self.clock() - window_start, 1)}

    def _coredump(self) -> dict[str, Any]:
        if not self.coredump:
            return {"available": False, "reason": "not enabled for this cell (serve.forensics.cuda_coredump)"}
        dest = self.out_dir / "cuda-coredump"
        result = self.side.cuda_coredump(dest)
        files = sorted(p for p in dest.rglob("*") if p.is_file()) if dest.is_dir() else []
        result["files"] = [{"file": self._rel(p), "bytes": p.stat().st_size} for p in files]
        result.setdefault("available", bool(files))
        return result

    def _rel(self, path: Path) -> str:
        return str(path.relative_to(self.run_dir))


@dataclass(kw_only=True)
class RuntimeSide:
    """The real side: py-spy where the runtime can reach the engine, the NVML sampler, the server's
    core-dump pipe."""

    runtime: Runtime
    container: str
    image: str
    py_spy: PySpy
    sampler: GpuSampler | None
    sampler_reason: str
    load_start: float
    titles: tuple[str, ...]  # /proc cmdline prefixes of the engine's processes (the serving driver's)
    poll_s: float = 2.0

    def dump_stacks(self) -> tuple[str | None, str]:
        if self.py_spy.binary is None:
            return None, self.py_spy.origin
        titles = ",".join(self.titles)
        result = self.runtime.dump_stacks(
            self.container,
            image=self.image,
            script=["-c", _DUMP_SCRIPT, "{py_spy}", titles, str(PER_PROCESS_TIMEOUT_S)],
            py_spy=self.py_spy.binary,
            timeout=PER_PROCESS_TIMEOUT_S * 4 + 30,
        )
        if result.returncode != 0:
            return None, f"the py-spy dump exited {result.returncode}: {result.stderr.strip()[-400:]}"
        return result.stdout, self.py_spy.origin

    def gpu_samples(self) -> tuple[list[GpuSample], float] | str:
        if self.sampler is None:
            return self.sampler_reason
        return self.sampler.snapshot(), self.load_start

    def cuda_coredump(self, dest: Path) -> dict[str, Any]:
        trigger = (
            f'for p in {COREDUMP_DIR}/corepipe.cuda.*; do [ -p "$p" ] && (timeout 10 sh -c "printf 1 > $p" &); done; '
            f"ls {COREDUMP_DIR}"
        )
        fired = self.runtime.exec(self.container, ["sh", "-c", trigger], timeout=30)
        pipes = [n for n in fired.stdout.split() if n.startswith("corepipe.cuda.")]
        if not pipes:
            return {"available": False, "reason": f"no CUDA core-dump pipe in {COREDUMP_DIR} (no CUDA context yet?)"}
        sizes = self._wait_for_cores()
        copied = self.runtime.copy_out(self.container, COREDUMP_DIR, dest)
        if not copied:
            return {"available": False, "reason": f"{COREDUMP_DIR} could not be copied out", "pipes": pipes}
        for pipe in dest.glob("corepipe.cuda.*"):  # FIFOs are no evidence
            pipe.unlink(missing_ok=True)
        return {"pipes": pipes, "sizes_in_container": sizes}

    def _wait_for_cores(self) -> dict[str, int]:
        """Until every core file has stopped growing (two equal listings), at most COREDUMP_WAIT_S.

        The dump is destructive: measured on an H200 (benchmarks/cuda_coredump_probe.py), the driver
        writes it and then aborts the process (SIGABRT); so the engine dies, the API server follows,
        and the container may stop. A failed exec ends the wait: `docker cp` still reads a stopped
        container's volume."""
        deadline = time.monotonic() + COREDUMP_WAIT_S
        last: dict[str, int] = {}
        listing_script = f'for f in {COREDUMP_DIR}/core.cuda.*; do [ -f "$f" ] && stat -c "%n %s" "$f"; done; true'
        while time.monotonic() < deadline:
            listing = self.runtime.exec(self.container, ["sh", "-c", listing_script], timeout=30)
            if listing.returncode != 0:  # the container is no longer running
                return last
            now = {name: int(size) for name, _, size in (line.rpartition(" ") for line in listing.stdout.splitlines())}
            if now and now == last:
                return now
            last = now
            time.sleep(self.poll_s)
        return last


@dataclass(kw_only=True)
class LoadInstruments:
    """What the load stage adds around `run_load`: the cost samplers (GPUs on GPU cells, the server
    container's cgroup on CPU cells) and the stall forensics."""

    runtime: Runtime
    run_dir: Path
    gpu: bool
    titles: tuple[str, ...] = ()  # the engine's process titles (the serving driver's)
    coredump: bool = False
    forensics_dir: Path | None = None  # default: <run>/load/forensics (a soak slice has its own)
    sampler: GpuSampler | None = None
    reason: str = ""
    load_start: float = 0.0
    py_spy: PySpy | None = None
    samples: list[GpuSample] | None = None
    cpu_sampler: CpuSampler | None = None
    cpu_reason: str = ""
    cores: float | None = None

    @classmethod
    def for_cell(
        cls, runtime: Runtime | Docker, cell: Cell, *, run_dir: Path, forensics_dir: Path | None = None
    ) -> LoadInstruments:
        """The instruments a cell's load gets: GPU sampling on GPU cells, a core dump where it opts in."""
        coredump = cell.serve is not None and cell.serve.forensics.cuda_coredump
        titles = driver_for(cell.serve).process_titles
        return cls(
            runtime=as_runtime(runtime),
            run_dir=run_dir,
            forensics_dir=forensics_dir,
            gpu=cell.is_gpu,
            coredump=coredump,
            titles=titles,
        )

    def start(self, container: str) -> None:
        """Before the load: find py-spy (a fetch, once per cache, must not delay a stall verdict)
        and start sampling the GPUs."""
        self.py_spy = find_py_spy()
        self.load_start = time.monotonic()
        if not self.gpu:
            self.reason = "CPU cell (arch none): no GPU is assigned to the server"
            cgroup = self.runtime.cpu_reader(container)
            if isinstance(cgroup, str):
                self.cpu_reason = cgroup
                return
            self.cores = cgroup.cores()
            self.cpu_sampler = CpuSampler(reader=cgroup).start()
            return
        reader = open_reader()
        if isinstance(reader, str):
            self.reason = reader
            return
        self.sampler = GpuSampler(reader=reader, pids=lambda: self.runtime.pids(container)).start()

    def on_stall(self, container: str, image: str) -> Callable[[float], dict[str, Any]]:
        def collect(stalled_for_s: float) -> dict[str, Any]:
            side = RuntimeSide(
                runtime=self.runtime,
                container=container,
                image=image,
                py_spy=self.py_spy or find_py_spy(),
                sampler=self.sampler,
                sampler_reason=self.reason,
                load_start=self.load_start,
                titles=self.titles,
            )
            forensics = StallForensics(
                side=side,
                run_dir=self.run_dir,
                titles=self.titles,
                coredump=self.coredump,
                forensics_dir=self.forensics_dir,
            )
            return forensics.collect(stalled_for_s)

        return collect

    def stop(self) -> None:
        if self.sampler is not None and self.samples is None:
            self.samples = self.sampler.stop()
        if self.cpu_sampler is not None:
            self.cpu_sampler.stop()  # its last reading: the load's end

    def cost_of(self, outcome: LoadOutcome, summary: LoadSummary) -> dict[str, Any]:
        """The cost section of a finished load: every output token it counted, greedy phase B's too."""
        return self.finish(output_tokens=summary.output_tokens + outcome.determinism_tokens[1], seconds=outcome.seconds)

    def finish(self, *, output_tokens: int, seconds: float) -> dict[str, Any]:
        """The load's cost section, from the samples taken until `stop`."""
        if self.sampler is None and not self.gpu:
            return {**empty_cost_section(self.reason), **self._cpu_fields(output_tokens, seconds)}
        if self.sampler is None:
            return empty_cost_section(self.reason)
        self.stop()
        samples = self.samples or []
        section = cost_section(samples, source=self.sampler.reader.source, output_tokens=output_tokens, seconds=seconds)
        if self.sampler.errors:
            section["sampler_errors"] = self.sampler.errors[:5]
        return section

    def _cpu_fields(self, output_tokens: int, seconds: float) -> dict[str, Any]:
        if self.cpu_sampler is None:
            return empty_cpu_fields(self.cpu_reason or "no cgroup reading was started")
        self.stop()
        samples = self.cpu_sampler.samples
        fields = cpu_cost_fields(
            samples,
            output_tokens=output_tokens,
            seconds=seconds,
            cores=self.cores,
            source=self.cpu_sampler.reader.source,
        )
        if self.cpu_sampler.errors:
            fields["cpu_sampler_errors"] = self.cpu_sampler.errors[:5]
        return fields
