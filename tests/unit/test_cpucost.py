"""The CPU half of a load's cost (verify/forensics/cpucost.py): the server container's cgroup read on v1 and
v2 (fake trees, and this test's own real cgroup), the arithmetic both ways, the load's instruments,
the host's CPU in the fingerprint, the receipt's build section and the schema for all of it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from pipeline.host.geometry import HostFingerprint, cpu_model
from pipeline.receipt import SCHEMA_FILE
from verify.forensics.cpucost import CgroupReader, CpuSample, cpu_cost_fields, parse_proc_cgroup, reader_for
from verify.forensics.stall import LoadInstruments
from verify.stages.receipt import build_section

V1 = """12:memory:/docker/abc
11:cpu,cpuacct:/docker/abc
1:name=systemd:/docker/abc
"""
V2 = "0::/system.slice/docker-abc.scope\n"


def _tree(root: Path, version: int, *, cpu: int, rss: int, quota: str | None = None) -> None:
    (root / "proc/42").mkdir(parents=True)
    fs = root / "sys/fs/cgroup"
    if version == 1:
        (root / "proc/42/cgroup").write_text(V1)
        (fs / "cpuacct/docker/abc").mkdir(parents=True)
        (fs / "cpuacct/docker/abc/cpuacct.usage").write_text(f"{cpu * 1000}\n")  # ns
        (fs / "memory/docker/abc").mkdir(parents=True)
        (fs / "memory/docker/abc/memory.stat").write_text(f"cache 999999999\nrss 1\ntotal_cache 5\ntotal_rss {rss}\n")
        (fs / "cpu/docker/abc").mkdir(parents=True)
        (fs / "cpu/docker/abc/cpu.cfs_quota_us").write_text(quota or "-1\n")
        (fs / "cpu/docker/abc/cpu.cfs_period_us").write_text("100000\n")
    else:
        (root / "proc/42/cgroup").write_text(V2)
        group = fs / "system.slice/docker-abc.scope"
        group.mkdir(parents=True)
        (group / "cpu.stat").write_text(f"usage_usec {cpu}\nuser_usec 1\nsystem_usec 2\n")
        (group / "memory.stat").write_text(f"anon {rss}\nfile 999999999\n")
        (group / "cpu.max").write_text(quota or "max 100000\n")


def test_proc_cgroup_names_each_controller_s_path() -> None:
    assert parse_proc_cgroup(V1) == {"memory": "/docker/abc", "cpu": "/docker/abc", "cpuacct": "/docker/abc",
                                     "systemd": "/docker/abc"}  # fmt: skip
    assert parse_proc_cgroup(V2) == {"": "/system.slice/docker-abc.scope"}


@pytest.mark.parametrize("version", [1, 2])
def test_the_container_s_cpu_time_and_rss_come_from_its_cgroup(tmp_path: Path, version: int) -> None:
    _tree(tmp_path, version, cpu=2_500_000, rss=300 << 20, quota="150000 100000\n" if version == 2 else "150000\n")
    reader = CgroupReader(pid=42, root=tmp_path)
    sample = reader.read()
    assert sample.cpu_seconds == pytest.approx(2.5) and sample.rss_bytes == 300 << 20, "RSS is anon, never cache"
    assert reader._quota() == pytest.approx(1.5), "--cpus 1.5 caps the cores"


def test_a_cgroup_that_is_not_there_is_a_reason_not_a_number(tmp_path: Path) -> None:
    (tmp_path / "proc/42").mkdir(parents=True)
    (tmp_path / "proc/42/cgroup").write_text("3:blkio:/x\n")
    why = reader_for(lambda: 42, root=tmp_path)
    assert isinstance(why, str) and "not readable" in why and "neither a cpuacct" in why
    assert "no running process" in str(reader_for(lambda: None, root=tmp_path))


def test_this_process_s_real_cgroup_reads() -> None:
    reader = CgroupReader(pid=os.getpid())
    first = reader.read()
    sum(i * i for i in range(300_000))  # spend some CPU
    second = reader.read()
    assert second.cpu_seconds > first.cpu_seconds > 0
    assert first.rss_bytes is None or first.rss_bytes > 0
    assert 1 <= reader.cores() <= (os.cpu_count() or 1)


def _samples(*pairs: tuple[float, int | None]) -> list[CpuSample]:
    return [CpuSample(at=float(i), cpu_seconds=cpu, rss_bytes=rss) for i, (cpu, rss) in enumerate(pairs)]


def test_cpu_seconds_per_token_peak_rss_and_tok_s_per_core() -> None:
    fields = cpu_cost_fields(
        _samples((100.0, 200 << 20), (110.0, 450 << 20), (112.0, 300 << 20)), output_tokens=6400, seconds=8.0, cores=2
    )
    assert fields["cpu_seconds"] == {"value": 12.0, "unit": "CPU-s"}
    assert fields["cpu_seconds_per_output_token"]["value"] == pytest.approx(12 / 6400)
    assert fields["peak_rss_bytes"] == {"value": 450 << 20, "unit": "bytes"}
    assert fields["output_tok_s_per_core"]["value"] == pytest.approx(400.0)
    assert fields["cores"]["value"] == 2


@pytest.mark.parametrize(
    ("samples", "tokens", "field", "reason"),
    [
        (_samples((1.0, 5)), 10, "cpu_seconds", "two are needed"),
        (_samples((9.0, 5), (1.0, 5)), 10, "cpu_seconds_per_output_token", "went backwards"),
        (_samples((1.0, 5), (2.0, 5)), 0, "cpu_seconds_per_output_token", "no output tokens"),
        (_samples((1.0, None), (2.0, None)), 10, "peak_rss_bytes", "no RSS"),
    ],
)
def test_a_cost_field_without_a_value_says_why(samples: list[CpuSample], tokens: int, field: str, reason: str) -> None:
    value = cpu_cost_fields(samples, output_tokens=tokens, seconds=5.0, cores=2)[field]
    assert value["value"] is None and reason in value["reason"]


class _PidDocker:
    def __init__(self, pid: int | None) -> None:
        self.pid = pid

    def container_pid(self, name: str) -> int | None:
        return self.pid


def _pid_runtime(pid: int | None) -> Any:
    from verify.runtime.docker import DockerRuntime

    return DockerRuntime(_PidDocker(pid))  # type: ignore[arg-type]


def test_a_cpu_cell_s_load_cost_has_cpu_values_and_the_gpu_fields_say_why(tmp_path: Path) -> None:
    instruments = LoadInstruments(runtime=_pid_runtime(os.getpid()), run_dir=tmp_path, gpu=False)
    instruments.start("stackproof-cpu-tiny-x")
    sum(i * i for i in range(300_000))
    instruments.stop()
    cost = instruments.finish(output_tokens=1000, seconds=2.0)
    assert cost["cpu_seconds"]["value"] > 0 and cost["cpu_seconds_per_output_token"]["value"] > 0
    assert cost["output_tok_s_per_core"]["value"] > 0
    assert cost["energy_j"]["value"] is None and "CPU cell" in cost["energy_j"]["reason"]
    gone = LoadInstruments(runtime=_pid_runtime(None), run_dir=tmp_path, gpu=False)
    gone.start("stackproof-cpu-tiny-y")
    empty = gone.finish(output_tokens=1000, seconds=2.0)
    assert empty["cpu_seconds"]["value"] is None and "no running process" in empty["cpu_seconds"]["reason"]


def test_a_gpu_cell_s_cost_is_unchanged_no_cpu_fields(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("verify.forensics.stall.open_reader", lambda: "nvidia-ml-py (pynvml) is not installed")
    instruments = LoadInstruments(runtime=_pid_runtime(os.getpid()), run_dir=tmp_path, gpu=True)
    instruments.start("c")
    cost = instruments.finish(output_tokens=10, seconds=1.0)
    assert "cpu_seconds" not in cost and cost["reason"] == "nvidia-ml-py (pynvml) is not installed"


# -- the host's CPU ---------------------------------------------------------------------------------


def test_the_cpu_model_is_read_from_cpuinfo_on_x86_and_arm() -> None:
    assert cpu_model("processor\t: 0\nmodel name\t: AMD EPYC 9654 96-Core Processor\n") == (
        "AMD EPYC 9654 96-Core Processor"
    )
    assert cpu_model("processor : 0\nCPU part : 0xd4f\nModel : NVIDIA Grace\n") == "NVIDIA Grace"
    assert cpu_model("") != ""  # the platform's answer, never empty


def test_the_fingerprint_carries_the_cpu_and_old_receipts_without_it_still_read() -> None:
    host = HostFingerprint(arch="x86_64", kernel="6", os="Debian", docker="20.10", gpus=(), driver="none",
                           cuda_driver="none", cpu_model="AMD EPYC", cpu_cores=2)  # fmt: skip
    data = host.to_json()
    assert data["cpu_model"] == "AMD EPYC" and data["cpu_cores"] == 2
    assert HostFingerprint.parse(data) == host
    old = {k: v for k, v in data.items() if not k.startswith("cpu_")}
    assert HostFingerprint.parse(old).cpu_cores == 0 and HostFingerprint.parse(old).key == host.key


# -- the receipt's build section and the schema -------------------------------------------------------


def test_the_build_section_has_seconds_and_size_or_says_why() -> None:
    built = build_section(source="built", made_in_s=130.2, image_size=2_400_000_000)
    assert built["build_seconds"] == {"value": 130.2, "unit": "s"}
    assert built["image_size_bytes"] == {"value": 2_400_000_000, "unit": "bytes"}
    pulled = build_section(source="registry", made_in_s=None, image_size=0)
    assert "built elsewhere" in pulled["build_seconds"]["reason"] and pulled["image_size_bytes"]["value"] is None


def _schema_errors(document: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_FILE.read_text()))
    return [e.message for e in validator.iter_errors(document)]


def _example() -> dict[str, Any]:
    document: dict[str, Any] = json.loads((SCHEMA_FILE.parent / "receipt-cpu-tiny.json").read_text())
    document["host"].update(cpu_model="AMD EPYC", cpu_cores=2)
    document.setdefault("cost", {}).update(
        cpu_cost_fields(_samples((1.0, 10), (3.0, 20)), output_tokens=100, seconds=1.0, cores=2)
    )
    document["build"] = build_section(source="built", made_in_s=130.2, image_size=123)
    return document


def test_the_schema_takes_cpu_cost_host_cpu_and_build() -> None:
    assert _schema_errors(_example()) == []


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d["cost"]["cpu_seconds"].pop("unit"),
        lambda d: d["cost"]["peak_rss_bytes"].update(value=None),  # empty without a reason
        lambda d: d["cost"]["cpu_seconds_per_output_token"].update(value=-1.0),
        lambda d: d["host"].update(cpu_cores="two"),
        lambda d: d["build"].update(source="elsewhere"),
        lambda d: d["build"].pop("image_size_bytes"),
    ],
)
def test_the_schema_rejects_broken_cost_host_and_build_fields(edit: Any) -> None:
    document = _example()
    edit(document)
    assert _schema_errors(document) != []
