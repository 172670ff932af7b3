"""Stall forensics and GPU cost, pure parts and orchestration with fakes (no docker, no GPU).

The spin rule both ways (a spinning GPU, a computing one, an idle one, too few readings), the cost
arithmetic against hand-computed numbers, every CPU-cell field saying why it is empty, and
`StallForensics.collect` with a fake side: files written, paths relative to the run, a failing
step reported beside the others. NVML is faked by a stand-in module with nvidia-ml-py's names.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.errors import InfraError
from pipeline.findings import LoadSection
from pipeline.matrix.read import load_matrix
from tests.unit.fake_docker import RecordingDocker
from verify.forensics.costreceipt import cost_and_forensics
from verify.forensics.gpucost import (
    COST_FIELDS,
    DeviceSample,
    GpuSample,
    GpuSampler,
    NvmlReader,
    cost_section,
    empty_cost_section,
)
from verify.forensics.pyspy import find_py_spy
from verify.forensics.spin import DeviceWindow, GpuStallVerdict, SpinRule, judge_spin
from verify.forensics.stall import StallForensics, coredump_env, gpu_windows, parse_stacks

RECEIPT = Path(__file__).resolve().parents[2] / "docs" / "receipt-cpu-tiny.json"  # a real cpu-tiny receipt


def _load(cost: dict[str, Any], events: list[dict[str, Any]]) -> LoadSection:
    """A real run's load section with the given cost and watchdog events."""
    section = LoadSection.parse(json.loads(RECEIPT.read_text())["load"])
    return dataclasses.replace(section, cost=cost, summary=dataclasses.replace(section.summary, events=tuple(events)))


REPO = Path(__file__).resolve().parents[2]


# -- the spin rule ---------------------------------------------------------------------------------


def _window(loaded: float, util: float, power: float, n: int = 6) -> DeviceWindow:
    return DeviceWindow(loaded_power_w=[loaded] * n, window_util_percent=[util] * n, window_power_w=[power] * n)


def test_high_utilisation_at_idle_power_is_a_spin() -> None:
    """The vllm#61007 shape (readings like spark-vllm-docker#260: ~96% util, 22 W against ~45 W loaded)."""
    judged = judge_spin({0: _window(loaded=45.0, util=96.0, power=22.0)})
    assert judged.verdict is GpuStallVerdict.GPU_SPIN
    assert judged.devices[0]["power_ratio"] == pytest.approx(22 / 45, abs=1e-3)


def test_high_utilisation_at_loaded_power_is_busy_not_a_spin() -> None:
    judged = judge_spin({0: _window(loaded=450.0, util=99.0, power=430.0)})
    assert judged.verdict is GpuStallVerdict.GPU_BUSY


def test_the_power_ratio_boundary() -> None:
    rule = SpinRule(power_ratio_max=0.5)
    assert judge_spin({0: _window(400.0, 95.0, 200.0)}, rule).verdict is GpuStallVerdict.GPU_SPIN  # exactly half
    assert judge_spin({0: _window(400.0, 95.0, 201.0)}, rule).verdict is GpuStallVerdict.GPU_BUSY


def test_low_utilisation_is_idle() -> None:
    assert judge_spin({0: _window(450.0, util=0.0, power=75.0)}).verdict is GpuStallVerdict.GPU_IDLE


def test_one_spinning_gpu_of_two_names_the_stall() -> None:
    judged = judge_spin({0: _window(450.0, 99.0, 440.0), 1: _window(450.0, 97.0, 90.0)})
    assert judged.verdict is GpuStallVerdict.GPU_SPIN and "GPU 1" in judged.reason


def test_too_few_readings_or_no_gpu_is_not_measured() -> None:
    short = DeviceWindow(loaded_power_w=[400.0] * 5, window_util_percent=[99.0, 99.0], window_power_w=[50.0, 50.0])
    assert judge_spin({0: short}).verdict is GpuStallVerdict.NOT_MEASURED
    no_baseline = DeviceWindow(loaded_power_w=[], window_util_percent=[99.0] * 5, window_power_w=[50.0] * 5)
    assert judge_spin({0: no_baseline}).verdict is GpuStallVerdict.NOT_MEASURED
    assert judge_spin({}).verdict is GpuStallVerdict.NOT_MEASURED


# -- cost arithmetic ---------------------------------------------------------------------------------


def _sample(
    at: float, *, util: float, power: float, energy: int | None, memory: int, pids: tuple[int, ...] = (7,)
) -> GpuSample:
    return GpuSample(
        at=at,
        devices=(
            DeviceSample(
                index=0,
                util_percent=util,
                power_w=power,
                energy_mj=energy,
                server_memory_bytes=memory,
                server_pids=pids,
            ),
            # A second GPU the server never used: left out of every figure.
            DeviceSample(index=1, util_percent=0.0, power_w=70.0, energy_mj=5_000_000, server_memory_bytes=0),
        ),
    )


def test_cost_of_a_load_from_its_samples() -> None:
    samples = [
        _sample(0.0, util=90.0, power=400.0, energy=1_000_000, memory=10 << 30),
        _sample(1.0, util=95.0, power=420.0, energy=1_400_000, memory=12 << 30),
        _sample(2.0, util=99.0, power=440.0, energy=1_900_000, memory=11 << 30),
    ]
    cost = cost_section(samples, source="nvml", output_tokens=3000, seconds=10.0)
    assert cost["gpus"] == [0]
    assert cost["peak_memory_bytes"] == {"value": 12 << 30, "unit": "bytes"}
    assert cost["energy_j"]["value"] == pytest.approx(900.0)  # (1_900_000 - 1_000_000) mJ
    assert cost["energy_per_output_token_j"]["value"] == pytest.approx(0.3)
    assert cost["output_tok_s_per_gpu"]["value"] == pytest.approx(300.0)
    assert cost["gpu_seconds"]["value"] == pytest.approx(10.0)
    assert cost["util_median_percent"]["value"] == 95.0 and cost["power_median_w"]["value"] == 420.0


def test_energy_needs_the_counter_and_says_so() -> None:
    samples = [_sample(float(t), util=90.0, power=400.0, energy=None, memory=1 << 30) for t in range(3)]
    cost = cost_section(samples, source="nvidia-smi", output_tokens=100, seconds=3.0)
    assert cost["energy_j"]["value"] is None and "not supported" in cost["energy_j"]["reason"]
    assert cost["energy_per_output_token_j"]["reason"] == cost["energy_j"]["reason"]
    assert cost["peak_memory_bytes"]["value"] == 1 << 30  # the rest still measured


def test_a_counter_going_backwards_is_not_negative_energy() -> None:
    samples = [
        _sample(0.0, util=90, power=1, energy=9_000, memory=1),
        _sample(1.0, util=90, power=1, energy=10, memory=1),
    ]
    assert "backwards" in cost_section(samples, source="nvml", output_tokens=1, seconds=1.0)["energy_j"]["reason"]


def test_a_cpu_cell_has_every_cost_field_with_its_reason() -> None:
    section = empty_cost_section("CPU cell (arch none): no GPU is assigned to the server")
    for name in COST_FIELDS:
        assert section[name]["value"] is None and section[name]["reason"].startswith("CPU cell"), name
    receipt = cost_and_forensics(_load(section, []), seconds=120.0)
    assert receipt["cost"]["gpu_seconds_verifying"]["value"] is None
    assert receipt["cost"]["gpu_seconds_verifying"]["reason"].startswith("CPU cell")
    assert receipt["forensics"] == []


def test_gpu_seconds_verifying_is_wall_clock_times_gpus() -> None:
    samples = [_sample(float(t), util=90.0, power=400.0, energy=1000 * t, memory=1) for t in range(3)]
    load = _load(cost_section(samples, source="nvml", output_tokens=10, seconds=2.0), [])
    assert cost_and_forensics(load, seconds=300.0)["cost"]["gpu_seconds_verifying"]["value"] == 300.0
    assert cost_and_forensics(None, seconds=5.0)["cost"]["peak_memory_bytes"]["reason"].startswith("no load stage")


def test_nvml_reader_attributes_memory_to_the_server_pids_only() -> None:
    nvml = _FakeNvml(processes=[(101, 3 << 30), (202, 5 << 30), (303, None)])
    devices = NvmlReader(nvml).read({101, 303})
    assert devices[0].server_memory_bytes == 3 << 30 and devices[0].server_pids == (101, 303)
    assert devices[0].energy_mj == 123_456 and devices[0].power_w == 250.0 and devices[0].util_percent == 97.0


def test_nvml_reader_turns_unsupported_readings_into_none() -> None:
    nvml = _FakeNvml(processes=[], energy_error=True)
    assert NvmlReader(nvml).read(set())[0].energy_mj is None


def test_the_sampler_keeps_going_past_a_failed_read() -> None:
    class Flaky:
        source = "nvml"
        calls = 0

        def read(self, pids: set[int]) -> tuple[DeviceSample, ...]:
            self.calls += 1
            if self.calls == 1:
                raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
            return (DeviceSample(index=0, util_percent=1.0, power_w=1.0, energy_mj=1, server_memory_bytes=0),)

        def close(self) -> None:
            pass

    sampler = GpuSampler(reader=Flaky(), pids=lambda: [1])
    sampler.sample_once({1})
    sampler.sample_once({1})
    assert len(sampler.samples) == 1 and "GPU_IS_LOST" in sampler.errors[0]


class _FakeNvml:
    """A stand-in for nvidia-ml-py's module (the names it exports), one GPU."""

    def __init__(self, processes: list[tuple[int, int | None]], energy_error: bool = False) -> None:
        self.processes = processes
        self.energy_error = energy_error

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=97, memory=40)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return 250_000  # mW

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        if self.energy_error:
            raise RuntimeError("Not Supported")
        return 123_456

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in self.processes]

    def nvmlShutdown(self) -> None:
        pass


# -- stacks and windows (pure) ---------------------------------------------------------------------


def _sidecar_json(*, stopped: bool = False) -> str:
    threads = [
        {
            "thread_name": "MainThread",
            "active": True,
            "frames": [
                {"name": "_stackproof_test_stall", "short_filename": "stackproof_test_stall.py", "line": 31},
                {"name": "_process_engine_step", "short_filename": "vllm/v1/engine/core.py", "line": 1436},
                {"name": "run_busy_loop", "short_filename": "vllm/v1/engine/core.py", "line": 1390},
            ],
        }
    ]
    docker = {"pid": 80, "cmdline": "VLLM::EngineCore", "state": "T" if stopped else "S"}
    if stopped:
        docker["error"] = "stopped by a signal (state T): not attached"
    else:
        docker.update(returncode=0, stdout=json.dumps(threads), stderr="")
    worker = {
        "pid": 95,
        "cmdline": "VLLM::Worker",
        "state": "S",
        "returncode": 1,
        "stdout": "",
        "stderr": "Permission denied",
    }
    return json.dumps([docker, worker])


def test_parse_stacks_reads_frames_and_errors() -> None:
    docker, worker = parse_stacks(_sidecar_json())
    assert docker.frames()[0] == "_stackproof_test_stall (stackproof_test_stall.py:31)"
    assert docker.summary()["threads"][0]["top"][1].startswith("_process_engine_step")
    assert worker.error is not None and "Permission denied" in worker.error
    stopped, _ = parse_stacks(_sidecar_json(stopped=True))
    assert stopped.threads == [] and "state T" in (stopped.error or "")


def test_gpu_windows_split_the_samples_at_the_stall() -> None:
    samples = [
        _sample(float(t), util=99.0 if t >= 10 else 90.0, power=30.0 if t >= 10 else 400.0, energy=t, memory=1)
        for t in range(16)
    ]
    windows = gpu_windows(samples, window_start=10.0, load_start=2.0)
    assert set(windows) == {0}  # only the GPU the server used
    assert windows[0].loaded_power_w == [400.0] * 8 and windows[0].window_power_w == [30.0] * 6
    assert judge_spin(windows).verdict is GpuStallVerdict.GPU_SPIN


# -- orchestration with a fake side ----------------------------------------------------------------


class FakeSide:
    def __init__(self, *, stacks: str | None, samples: list[GpuSample] | str, fail_coredump: bool = False) -> None:
        self.stacks, self.samples, self.fail_coredump = stacks, samples, fail_coredump
        self.coredump_dest: Path | None = None

    def dump_stacks(self) -> tuple[str | None, str]:
        return (self.stacks, "fake py-spy") if self.stacks is not None else (None, "py-spy 0.4.3 unavailable: offline")

    def gpu_samples(self) -> tuple[list[GpuSample], float] | str:
        return self.samples if isinstance(self.samples, str) else (self.samples, 0.0)

    def cuda_coredump(self, dest: Path) -> dict[str, Any]:
        if self.fail_coredump:
            raise InfraError("docker exec timed out")
        self.coredump_dest = dest
        dest.mkdir(parents=True)
        (dest / "core.cuda.80").write_bytes(b"\x7fELF" + b"\0" * 60)
        return {"pipes": ["corepipe.cuda.80"]}


def test_collect_writes_the_evidence_and_names_it_relative_to_the_run(tmp_path: Path) -> None:
    samples = [
        _sample(float(t), util=99.0 if t >= 10 else 90.0, power=30.0 if t >= 10 else 400.0, energy=t, memory=1)
        for t in range(16)
    ]
    side = FakeSide(stacks=_sidecar_json(), samples=samples)
    forensics = StallForensics(side=side, run_dir=tmp_path, coredump=True, clock=lambda: 16.0)
    evidence = forensics.collect(stalled_for_s=6.0)
    assert evidence["dir"] == "load/forensics"
    assert evidence["py_spy"]["available"] is True and evidence["py_spy"]["file"] == "load/forensics/py-spy.json"
    assert "_stackproof_test_stall" in (tmp_path / "load/forensics/py-spy.json").read_text()
    assert evidence["py_spy"]["frames"]["80"][0].startswith("_stackproof_test_stall")
    assert evidence["gpu"]["verdict"] == "GPU_SPIN" and (tmp_path / evidence["gpu"]["file"]).is_file()
    core = evidence["cuda_coredump"]
    assert core["available"] is True and core["files"] == [
        {"file": "load/forensics/cuda-coredump/core.cuda.80", "bytes": 64}
    ]


def test_collect_says_why_each_piece_is_missing_and_keeps_the_rest(tmp_path: Path) -> None:
    side = FakeSide(stacks=None, samples="CPU cell (arch none): no GPU is assigned to the server", fail_coredump=True)
    evidence = StallForensics(side=side, run_dir=tmp_path, coredump=True).collect(stalled_for_s=8.0)
    assert evidence["py_spy"] == {"available": False, "reason": "py-spy 0.4.3 unavailable: offline"}
    assert evidence["gpu"]["verdict"] == "NOT_MEASURED" and evidence["gpu"]["reason"].startswith("CPU cell")
    assert evidence["cuda_coredump"]["available"] is False and "timed out" in evidence["cuda_coredump"]["reason"]
    off = StallForensics(side=FakeSide(stacks=None, samples="x"), run_dir=tmp_path).collect(stalled_for_s=1.0)
    assert "not enabled" in off["cuda_coredump"]["reason"]


def test_receipt_lists_each_documented_stall() -> None:
    event = {
        "type": "ENGINE_STALL_API_ALIVE",
        "at": 31.2,
        "reason": "6 in flight",
        "forensics": {"dir": "load/forensics"},
    }
    load = _load(empty_cost_section("CPU cell"), [event, {"type": "UNKNOWN", "forensics": None}])
    assert cost_and_forensics(load, seconds=1.0)["forensics"] == [
        {"type": "ENGINE_STALL_API_ALIVE", "at": 31.2, "reason": "6 in flight", "dir": "load/forensics"}
    ]


# -- py-spy lookup and the core-dump opt-in ---------------------------------------------------------


def test_py_spy_missing_offline_is_a_reason_not_an_error(tmp_path: Path) -> None:
    env = {"STACKPROOF_MIRRORS": f"pypi={tmp_path / 'empty-wheel-dir'}"}
    (tmp_path / "empty-wheel-dir").mkdir()
    found = find_py_spy(env, cache=tmp_path / "cache")
    assert found.binary is None and "unavailable" in found.origin
    assert find_py_spy({"STACKPROOF_PY_SPY": str(tmp_path / "nope")}).binary is None


def test_py_spy_from_an_explicit_binary(tmp_path: Path) -> None:
    binary = tmp_path / "py-spy"
    binary.write_text("#!/bin/sh\n")
    assert find_py_spy({"STACKPROOF_PY_SPY": str(binary)}, cache=tmp_path).binary == binary


def test_coredump_env_puts_pipe_and_file_in_the_scratch_volume() -> None:
    env = coredump_env()
    assert env["CUDA_ENABLE_USER_TRIGGERED_COREDUMP"] == "1"
    assert env["CUDA_COREDUMP_PIPE"].startswith("/stackproof-coredump/") and "%p" in env["CUDA_COREDUMP_PIPE"]
    assert env["CUDA_COREDUMP_FILE"].startswith("/stackproof-coredump/")


def _matrix_with(tmp_path: Path, cell_id: str, forensics: object) -> Path:
    import yaml

    data = yaml.safe_load((REPO / "matrix.yaml").read_text())
    for cell in data["cells"]:
        if cell.get("install"):
            cell["install"]["lock"] = str(REPO / cell["install"]["lock"])
        if cell["id"] == cell_id:
            cell["serve"]["forensics"] = forensics
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_cuda_coredump_opt_in_is_validated_with_file_line_and_field(tmp_path: Path) -> None:
    from pipeline.errors import InputError

    with pytest.raises(InputError) as cpu:
        load_matrix(_matrix_with(tmp_path, "cpu-tiny", {"cuda_coredump": True}), images_dir=REPO / "images")
    assert "serve.forensics.cuda_coredump" in str(cpu.value) and "needs a GPU cell" in str(cpu.value)
    assert "matrix.yaml:" in str(cpu.value)
    with pytest.raises(InputError) as typo:
        load_matrix(_matrix_with(tmp_path, "cpu-tiny", {"cuda_core_dump": True}), images_dir=REPO / "images")
    assert "serve.forensics.cuda_core_dump: unknown key" in str(typo.value)
    with pytest.raises(InputError) as kind:
        load_matrix(_matrix_with(tmp_path, "cpu-tiny", {"cuda_coredump": "yes"}), images_dir=REPO / "images")
    assert "must be true or false" in str(kind.value)


def test_cuda_coredump_opt_in_on_a_gpu_cell_loads(tmp_path: Path) -> None:
    import yaml

    data = yaml.safe_load((REPO / "matrix.yaml").read_text())
    gpu = next(c["id"] for c in data["cells"] if c.get("arch") != "none" and c.get("serve"))
    matrix = load_matrix(_matrix_with(tmp_path, gpu, {"cuda_coredump": True}), images_dir=REPO / "images")
    assert matrix.cell(gpu).serve.forensics.cuda_coredump is True  # type: ignore[union-attr]
    assert matrix.cell("cpu-tiny").serve.forensics.cuda_coredump is False  # type: ignore[union-attr]


# -- the sidecar's docker line and its removal -------------------------------------------------------


class _SidecarDocker(RecordingDocker):
    """The real Docker over a recorder of docker calls (no daemon); `fail` is raised by `docker run`."""

    def __init__(self, fail: BaseException | None = None) -> None:
        super().__init__(stdout="[]")
        self.fail = fail

    def _docker(self, *args: str, **kwargs: Any) -> Any:
        if args[0] == "run" and self.fail is not None:
            self.calls.append(args)
            raise self.fail
        return super()._docker(*args, **kwargs)


def _sidecar(docker: _SidecarDocker) -> Any:
    return docker.pid_sidecar(
        "stackproof-cpu-tiny-abc",
        image="img:1",
        argv=["python3", "-c", "pass"],
        binds={Path("/cache/py-spy"): "/stackproof-tools/py-spy"},
        labels={},
        timeout=30,
    )


def test_the_sidecar_shares_the_pid_namespace_read_only_and_is_removed() -> None:
    docker = _SidecarDocker()
    _sidecar(docker)
    run, remove = docker.calls
    name = run[run.index("--name") + 1]
    assert name.startswith("stackproof-cpu-tiny-abc-sidecar-")
    assert run[run.index("--pid") + 1] == "container:stackproof-cpu-tiny-abc"
    assert run[run.index("--cap-add") + 1] == "SYS_PTRACE" and run[run.index("--network") + 1] == "none"
    assert "/cache/py-spy:/stackproof-tools/py-spy:ro" in run and "io.stackproof.role=sidecar" in run
    assert remove[:3] == ("rm", "--force", "--volumes") and remove[-1] == name


def test_the_sidecar_is_removed_when_interrupted() -> None:
    docker = _SidecarDocker(fail=KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        _sidecar(docker)
    assert docker.calls[-1][:2] == ("rm", "--force")


def test_the_nvidia_smi_fallback_reads_memory_per_server_process(tmp_path: Path) -> None:
    """A stand-in nvidia-smi printing what the real one prints for these two CSV queries."""
    from verify.forensics.gpucost import SmiReader

    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        "  --query-gpu=*) echo '0, GPU-aaa, 99, 691.79'; echo '1, GPU-bbb, 0, [N/A]';;\n"
        "  --query-compute-apps=*) echo 'GPU-aaa, 471, 1002'; echo 'GPU-aaa, 999, 5000'; echo 'GPU-bbb, 471, 10';;\n"
        "esac\n"
    )
    smi.chmod(0o755)
    first, second = SmiReader(str(smi)).read({471})
    assert (first.util_percent, first.power_w, first.energy_mj) == (99.0, 691.79, None)
    assert first.server_memory_bytes == 1002 * 1024 * 1024 and first.server_pids == (471,)
    assert second.power_w is None and second.server_memory_bytes == 10 * 1024 * 1024


class _CoredumpDocker:
    """exec/copy_out of a server whose engine aborts after its dump (as measured on the H200)."""

    def __init__(self, pipes: str) -> None:
        self.pipes = pipes
        self.execs: list[list[str]] = []
        self.listings = iter(
            [
                SimpleNamespace(returncode=0, stdout="/stackproof-coredump/core.cuda.26 4096\n", stderr=""),
                SimpleNamespace(returncode=1, stdout="", stderr="container is not running"),
            ]
        )

    def exec(self, container: str, argv: list[str], *, timeout: float = 30) -> Any:
        self.execs.append(argv)
        if len(self.execs) == 1:
            return SimpleNamespace(returncode=0, stdout=self.pipes, stderr="")
        return next(self.listings)

    def copy_out(self, container: str, path: str, dest: Path) -> bool:
        dest.mkdir(parents=True)
        (dest / "core.cuda.26").write_bytes(b"\0" * 4096)
        (dest / "corepipe.cuda.26").write_text("")  # stands in for the FIFO, dropped from the evidence
        return True


def _docker_side(docker: Any) -> Any:
    from verify.forensics.pyspy import PySpy
    from verify.forensics.stall import RuntimeSide
    from verify.runtime import as_runtime

    return RuntimeSide(
        runtime=as_runtime(docker),
        container="srv",
        image="img",
        py_spy=PySpy(binary=None, origin="x"),
        sampler=None,
        sampler_reason="CPU cell",
        load_start=0.0,
        titles=("VLLM::",),
        poll_s=0.0,
    )


def test_the_core_dump_is_triggered_waited_for_and_copied_out(tmp_path: Path) -> None:
    docker = _CoredumpDocker("corepipe.cuda.26\n")
    result = _docker_side(docker).cuda_coredump(tmp_path / "cuda-coredump")
    assert "printf 1 >" in docker.execs[0][2] and "/stackproof-coredump/corepipe.cuda.*" in docker.execs[0][2]
    assert result["pipes"] == ["corepipe.cuda.26"]
    assert result["sizes_in_container"] == {
        "/stackproof-coredump/core.cuda.26": 4096
    }  # the wait ended with the container
    assert sorted(p.name for p in (tmp_path / "cuda-coredump").iterdir()) == ["core.cuda.26"]


def test_no_pipe_means_no_cuda_context_and_no_dump(tmp_path: Path) -> None:
    result = _docker_side(_CoredumpDocker("")).cuda_coredump(tmp_path / "cuda-coredump")
    assert result["available"] is False and "no CUDA core-dump pipe" in result["reason"]
