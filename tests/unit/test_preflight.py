"""Preflight of GPU cells: the pure judge over recorded and edited facts, both ways for every item,
and the exit code 3 through the CLI. No test runs nvidia-smi or docker: facts are injected."""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.errors import InfraError
from pipeline.host import facts as hostfacts
from pipeline.host import preflight
from pipeline.host.facts import DiskFact, GpuFact, PreflightFacts
from pipeline.host.preflight import (
    PreflightFailed,
    enforce,
    judge_host_preflight,
    judge_preflight,
    parse_require_cuda,
)
from pipeline.matrix.model import Cell, Matrix
from pipeline.matrix.read import load_matrix
from pipeline.result import CheckResult, Status
from stackproof.cli import main

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "preflight"
FIXED = "sm120-vllm-0.28.0-fi-0.6.18.post1-cu130"
SPARK = "sm121-vllm-0.28.0-fi-0.6.18.post1-cu130"
SM90 = "sm90-vllm-0.28.0"
GIB = 1024**3
NO_DOCKER = "no docker CLI on PATH: install docker buildx, or Debian's docker.io (20.10)"


def recorded_document() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / "doctor-sm120-json.stdout").read_text())
    return data


def h200() -> PreflightFacts:
    """What the H200 (no docker) gave, as recorded by `doctor --cell ... --json` there."""
    return PreflightFacts.parse(recorded_document()["doctor"]["preflight"]["facts"])


def with_docker(facts: PreflightFacts, *runtimes: str) -> PreflightFacts:
    """The H200's facts on a host whose daemon answers, with these runtimes and room for everything."""
    disks = (
        DiskFact(purpose="images", path="/var/lib/docker", free=500 * GIB, needed=30 * GIB, device=1),
        DiskFact(purpose="models", path="/models", free=500 * GIB, needed=20 * GIB, device=2),
    )
    return dataclasses.replace(facts, docker_error=None, runtimes=runtimes, disks=disks)


@pytest.fixture(scope="module")
def real() -> Matrix:
    return load_matrix(REPO / "matrix.yaml", images_dir=REPO / "images")


@pytest.fixture(scope="module")
def sm90() -> Cell:
    return load_matrix(FIXTURES / "sm90-matrix.yaml", images_dir=REPO / "images").cell(SM90)


def item(items: list[CheckResult], name: str) -> CheckResult:
    found = [i for i in items if i.name == name]
    assert len(found) == 1, f"no single item {name!r} in {[i.name for i in items]}"
    return found[0]


def failing(items: list[CheckResult]) -> list[str]:
    return [i.name for i in items if i.status is Status.FAIL]


# -- the recorded H200 ----------------------------------------------------------------------------


def test_the_h200_refuses_an_sm120_cell_naming_capability_9_0(real: Matrix) -> None:
    items = judge_preflight(real.cell(FIXED), h200(), docker_required=False)
    cc = item(items, "compute-capability")
    assert cc.status is Status.FAIL
    assert "NVIDIA H200 has compute capability 9.0" in cc.message
    assert "sm120 (compute capability 12.0)" in cc.message
    assert failing(items) == ["compute-capability"]  # doctor: docker absence is a WARN
    runtime = item(items, "nvidia-runtime")
    assert runtime.status is Status.WARN and runtime.message.startswith("docker not available: no docker CLI on PATH")


def test_the_recorded_verdicts_are_what_the_judge_says_of_the_recorded_facts(real: Matrix) -> None:
    recorded = recorded_document()["doctor"]["preflight"]
    items = judge_preflight(real.cell(FIXED), h200(), docker_required=False)
    assert [(i["name"], i["status"]) for i in recorded["items"]] == [(i.name, str(i.status)) for i in items]
    assert recorded["passed"] is False


def test_the_recorded_runs_exited_3_and_the_sm90_check_0() -> None:
    codes = (FIXTURES / "exit-codes.txt").read_text()
    assert "docker: not on PATH" in codes
    assert f"doctor --cell {FIXED}: 3" in codes
    assert f"doctor --cell {FIXED} --json: 3" in codes
    assert f"run {FIXED}: 3" in codes
    assert "doctor --cell sm90-vllm-0.28.0 --matrix tests/fixtures/preflight/sm90-matrix.yaml --no-imports: 0" in codes
    assert "Traceback" not in (FIXTURES / "doctor-sm120.stderr").read_text()
    assert "Traceback" not in (FIXTURES / "run-sm120.txt").read_text()
    assert "CUDA Version: 13.0" in (FIXTURES / "nvidia-smi.txt").read_text()
    assert "NVIDIA H200, 9.0, 143771 MiB, 580.159.04" in (FIXTURES / "nvidia-smi.txt").read_text()


def test_the_h200_passes_an_sm90_cell_on_every_host_item(sm90: Cell) -> None:
    items = judge_preflight(sm90, h200(), docker_required=False)
    for name in ("gpu", "compute-capability", "driver-cuda", "host-platform", "base-platform"):
        assert item(items, name).status is Status.PASS, item(items, name)
    assert failing(items) == []
    assert "compute capability 9.0 = sm90" in item(items, "compute-capability").message


def test_the_h200_with_docker_and_the_nvidia_runtime_passes_everything(sm90: Cell) -> None:
    items = judge_preflight(sm90, with_docker(h200(), "nvidia", "runc"))
    assert {i.status for i in items} == {Status.PASS}
    enforce(sm90, items)  # raises nothing


def test_facts_round_trip_through_json() -> None:
    facts = with_docker(h200(), "runc")
    assert PreflightFacts.parse(json.loads(json.dumps(facts.to_json()))) == facts


# -- each item both ways ----------------------------------------------------------------------------


def test_gpu_absent_fails_and_says_why(sm90: Cell) -> None:
    facts = dataclasses.replace(h200(), gpus=(), gpu_error="nvidia-smi: not found on PATH")
    items = judge_preflight(sm90, facts)
    gpu = item(items, "gpu")
    assert gpu.status is Status.FAIL and "nvidia-smi: not found on PATH" in gpu.message
    assert "install the NVIDIA driver" in gpu.message
    assert item(items, "compute-capability").status is Status.SKIP
    assert item(items, "driver-cuda").status is Status.SKIP


def test_unknown_capability_is_a_warn_never_a_pass(sm90: Cell) -> None:
    facts = dataclasses.replace(h200(), gpus=(GpuFact(index=0, name="NVIDIA H200", capability=None),))
    cc = item(judge_preflight(sm90, facts), "compute-capability")
    assert cc.status is Status.WARN and cc.message.startswith("unknown:")


def test_one_wrong_gpu_among_several_fails(sm90: Cell) -> None:
    gpus = (GpuFact(index=0, name="NVIDIA H200", capability="9.0"), GpuFact(index=1, name="RTX", capability="12.0"))
    cc = item(judge_preflight(sm90, dataclasses.replace(h200(), gpus=gpus)), "compute-capability")
    assert cc.status is Status.FAIL and "GPU 1 RTX has compute capability 12.0" in cc.message


def test_an_sm120_gpu_passes_an_sm120_cell(real: Matrix) -> None:
    gpus = (GpuFact(index=0, name="NVIDIA RTX PRO 6000 Blackwell Workstation Edition", capability="12.0"),)
    cc = item(judge_preflight(real.cell(FIXED), dataclasses.replace(h200(), gpus=gpus)), "compute-capability")
    assert cc.status is Status.PASS


def test_capability_of_arch() -> None:
    assert preflight.capability_of_arch("sm120") == "12.0"
    assert preflight.capability_of_arch("sm121") == "12.1"
    assert preflight.capability_of_arch("sm90") == "9.0"
    assert preflight.capability_of_arch("sm103") == "10.3"
    assert preflight.capability_of_arch("none") is None


def test_a_cuda_12_8_driver_fails_an_image_that_needs_cuda_13(sm90: Cell) -> None:
    facts = dataclasses.replace(h200(), driver="570.124.06", cuda_driver="12.8")
    cuda = item(judge_preflight(sm90, facts), "driver-cuda")
    assert cuda.status is Status.FAIL
    assert "supports CUDA 12.8; the image needs cuda>=13.0: upgrade the driver to a CUDA 13 one" in cuda.message


def test_a_cuda_13_driver_passes_cuda_13(sm90: Cell) -> None:
    cuda = item(judge_preflight(sm90, h200()), "driver-cuda")
    assert cuda.status is Status.PASS and "CUDA 13.0" in cuda.message


def test_nvidia_require_cuda_is_parsed_into_alternatives() -> None:
    alternatives = parse_require_cuda("cuda>=13.0 brand=tesla,driver>=535,driver<536 brand=unknown,driver>=570")
    assert [a.text for a in alternatives] == [
        "cuda>=13.0",
        "brand=tesla,driver>=535,driver<536",
        "brand=unknown,driver>=570",
    ]
    assert alternatives[0].constraints == (("cuda", ">=", "13.0"),)
    assert alternatives[1].constraints == (("brand", "=", "tesla"), ("driver", ">=", "535"), ("driver", "<", "536"))


def test_a_brand_clause_that_may_hold_is_a_warn_and_one_that_cannot_is_a_fail(sm90: Cell) -> None:
    require = "cuda>=13.0 brand=tesla,driver>=535,driver<536"
    old = dataclasses.replace(h200(), require_cuda=require, driver="535.104.05", cuda_driver="12.2")
    cuda = item(judge_preflight(sm90, old), "driver-cuda")
    assert cuda.status is Status.WARN and "brand=tesla,driver>=535,driver<536" in cuda.message
    newer = dataclasses.replace(old, driver="550.54.15", cuda_driver="12.4")
    cuda = item(judge_preflight(sm90, newer), "driver-cuda")
    assert cuda.status is Status.FAIL and "upgrade the driver to a CUDA 13 one" in cuda.message


def test_an_unknown_requirement_is_a_warn_saying_what_to_declare(sm90: Cell) -> None:
    facts = dataclasses.replace(h200(), require_cuda=None, require_cuda_source="unknown: image x is not local")
    cuda = item(judge_preflight(sm90, facts), "driver-cuda")
    assert cuda.status is Status.WARN and "unknown: image x is not local" in cuda.message
    assert "require_cuda" in cuda.message


def test_an_image_without_nvidia_require_cuda_passes(sm90: Cell) -> None:
    facts = dataclasses.replace(h200(), require_cuda="", require_cuda_source="image x (local) config")
    assert item(judge_preflight(sm90, facts), "driver-cuda").status is Status.PASS


def test_runtimes_without_nvidia_and_no_cdi_fail_with_the_toolkit_fix(sm90: Cell) -> None:
    runtime = item(judge_preflight(sm90, with_docker(h200(), "io.containerd.runc.v2", "runc")), "nvidia-runtime")
    assert runtime.status is Status.FAIL
    assert "install the NVIDIA Container Toolkit and run `nvidia-ctk runtime configure --runtime=docker`" in (
        runtime.message
    )


def test_the_nvidia_runtime_a_cdi_spec_or_the_hook_pass(sm90: Cell) -> None:
    base = with_docker(h200(), "runc")
    assert item(judge_preflight(sm90, with_docker(h200(), "nvidia", "runc")), "nvidia-runtime").status is Status.PASS
    cdi = dataclasses.replace(base, cdi_specs=("/etc/cdi/nvidia.yaml",))
    runtime = item(judge_preflight(sm90, cdi), "nvidia-runtime")
    assert runtime.status is Status.PASS and "/etc/cdi/nvidia.yaml" in runtime.message
    hook = dataclasses.replace(base, nvidia_hook="/usr/bin/nvidia-container-runtime-hook")
    assert item(judge_preflight(sm90, hook), "nvidia-runtime").status is Status.PASS


def test_docker_not_available_fails_jobs_and_warns_doctor(sm90: Cell) -> None:
    job = judge_preflight(sm90, h200(), docker_required=True)
    assert failing(job) == ["nvidia-runtime", "disk-images"]
    assert all(item(job, n).message.startswith("docker not available") for n in failing(job))
    doctor = judge_preflight(sm90, h200(), docker_required=False)
    assert failing(doctor) == []
    assert item(doctor, "nvidia-runtime").status is Status.WARN


def test_cdi_spec_files_naming_nvidia_gpus_are_found(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "nvidia.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n")
    (tmp_path / "etc" / "other.json").write_text('{"cdiVersion": "0.5.0", "kind": "vendor.com/fpga"}')
    (tmp_path / "etc" / "notes.txt").write_text("kind: nvidia.com/gpu")
    found = hostfacts._cdi_specs([tmp_path / "etc", tmp_path / "absent"])
    assert found == (str(tmp_path / "etc" / "nvidia.yaml"),)
    assert hostfacts._cdi_specs([tmp_path / "absent"]) == ()


def test_a_base_without_the_cells_platform_fails(real: Matrix) -> None:
    spark = real.cell(SPARK)  # linux/arm64
    facts = dataclasses.replace(h200(), base_platforms=("linux/amd64",), base_platforms_source="base x declares them")
    items = judge_preflight(spark, facts)
    base = item(items, "base-platform")
    assert base.status is Status.FAIL and "not the cell's linux/arm64" in base.message
    host = item(items, "host-platform")
    assert host.status is Status.FAIL and "this host is linux/amd64; the cell is linux/arm64" in host.message


def test_a_base_with_the_cells_platform_passes_and_unknown_warns(real: Matrix) -> None:
    spark = real.cell(SPARK)
    arm = dataclasses.replace(h200(), machine="aarch64")
    assert item(judge_preflight(spark, arm), "base-platform").status is Status.PASS
    assert item(judge_preflight(spark, arm), "host-platform").status is Status.PASS
    unknown = dataclasses.replace(arm, base_platforms=None, base_platforms_source="unknown: image x is not local")
    base = item(judge_preflight(spark, unknown), "base-platform")
    assert base.status is Status.WARN and base.message.startswith("unknown:")


def test_too_little_disk_fails_and_enough_passes(sm90: Cell) -> None:
    facts = with_docker(h200(), "nvidia")
    small = dataclasses.replace(
        facts, disks=(DiskFact(purpose="images", path="/var/lib/docker", free=10 * GIB, needed=25 * GIB, device=1),)
    )
    disk = item(judge_preflight(sm90, small), "disk-images")
    assert disk.status is Status.FAIL
    assert "10.0 GiB free at /var/lib/docker; the image needs 25.0 GiB" in disk.message
    assert "free 15.0 GiB there" in disk.message
    assert item(judge_preflight(sm90, facts), "disk-images").status is Status.PASS


def test_two_downloads_on_one_filesystem_add_up(sm90: Cell) -> None:
    disks = (
        DiskFact(purpose="images", path="/var/lib/docker", free=40 * GIB, needed=30 * GIB, device=7),
        DiskFact(purpose="models", path="/models", free=40 * GIB, needed=20 * GIB, device=7),
    )
    items = judge_preflight(sm90, dataclasses.replace(with_docker(h200(), "nvidia"), disks=disks))
    assert failing(items) == ["disk-images", "disk-models"]
    assert "STACKPROOF_MODEL_STORE" in item(items, "disk-models").message


def test_unknown_sizes_warn_with_the_free_space(sm90: Cell) -> None:
    models = item(judge_preflight(sm90, h200()), "disk-models")
    assert models.status is Status.WARN
    assert models.message.startswith("unknown: the size of the model; 64.0 GiB free at")


def test_a_cpu_cell_has_no_preflight(real: Matrix) -> None:
    assert judge_preflight(real.cell("cpu-tiny"), h200()) == []


def test_every_failing_item_is_listed_at_once_with_exit_code_3(real: Matrix) -> None:
    facts = dataclasses.replace(
        h200(),
        driver="570.124.06",
        cuda_driver="12.8",
        base_platforms=("linux/arm64",),
        disks=(DiskFact(purpose="images", path="/var/lib/docker", free=GIB, needed=30 * GIB, device=1),),
        docker_error=None,
        runtimes=("runc",),
    )
    cell = real.cell(FIXED)
    items = judge_preflight(cell, facts)
    assert failing(items) == ["compute-capability", "driver-cuda", "base-platform", "nvidia-runtime", "disk-images"]
    with pytest.raises(PreflightFailed) as raised:
        enforce(cell, items)
    assert isinstance(raised.value, InfraError) and raised.value.exit_code == 3
    text = str(raised.value)
    assert "5 item(s) failed" in text
    for name in failing(items):
        assert f"  {name}: " in text
    assert "--no-preflight" in text


# -- the image's facts, read through a fake engine -------------------------------------------------


class FakeDocker:
    def __init__(self, images: dict[str, dict[str, Any]]) -> None:
        self.images = images
        self.calls: list[tuple[str, ...]] = []

    def image_config(self, ref: str, **_: Any) -> dict[str, Any] | None:
        self.calls.append(("image", "inspect", ref))
        return self.images.get(ref)


def test_a_local_base_images_config_wins_over_the_declaration(real: Matrix) -> None:
    config = {"Config": {"Env": ["PATH=/usr/bin", "NVIDIA_REQUIRE_CUDA=cuda>=13.1 brand=tesla,driver>=580"]}}
    docker = FakeDocker({"vllm/vllm-openai:v0.28.0": {**config, "Os": "linux", "Architecture": "amd64"}})
    require, source, platforms, _ = hostfacts._image_facts(real, real.cell(FIXED), docker)  # type: ignore[arg-type]
    assert require == "cuda>=13.1 brand=tesla,driver>=580" and "(local) config" in source
    assert platforms == ("linux/amd64", "linux/arm64")  # declared: one local platform says yes, not no


def test_without_docker_the_declared_base_facts_are_used(real: Matrix) -> None:
    require, source, platforms, psource = hostfacts._image_facts(real, real.cell(SPARK), None)
    assert require == "cuda>=13.0" and "declares it in matrix.yaml" in source
    assert platforms == ("linux/amd64", "linux/arm64") and "declares them" in psource


def test_an_undeclared_base_not_local_is_unknown(tmp_path: Path) -> None:
    text = (FIXTURES / "sm90-matrix.yaml").read_text()
    text = text.replace('    require_cuda: "cuda>=13.0"\n', "").replace(
        "    platforms: [linux/amd64, linux/arm64]\n", ""
    )
    (tmp_path / "m.yaml").write_text(text)
    matrix = load_matrix(tmp_path / "m.yaml", images_dir=REPO / "images")
    docker = FakeDocker({})
    require, source, platforms, psource = hostfacts._image_facts(matrix, matrix.cell(SM90), docker)  # type: ignore[arg-type]
    assert require is None and source.startswith("unknown: image vllm/vllm-openai:v0.28.0 is not local")
    assert platforms is None and psource.startswith("unknown:")


def test_a_bad_declared_platform_is_a_located_matrix_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (FIXTURES / "sm90-matrix.yaml").read_text().replace("[linux/amd64, linux/arm64]", "[linux/amd46]")
    (tmp_path / "m.yaml").write_text(text)
    assert main(["matrix", "validate", "--matrix", str(tmp_path / "m.yaml"), "--images", str(REPO / "images")]) == 2
    err = capsys.readouterr().err
    assert (
        f"{tmp_path / 'm.yaml'}:11: bases.vllm-openai-0.28.0.platforms[0]: unknown platform 'linux/amd46', "
        "did you mean 'linux/amd64'?"
    ) in err


# -- through the CLI ----------------------------------------------------------------------------------


@pytest.fixture
def h200_host(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This host becomes the recorded H200 without docker: facts, connect() and doctor's host probe
    all injected, so nothing here runs nvidia-smi or docker."""
    monkeypatch.delenv("STACKPROOF_MIRRORS", raising=False)
    monkeypatch.delenv("STACKPROOF_MATRIX", raising=False)
    monkeypatch.setenv("STACKPROOF_CA_BUNDLE", "none")
    monkeypatch.setattr(preflight, "connect", lambda: (None, NO_DOCKER))
    monkeypatch.setattr(preflight, "gather_facts", lambda *a, **k: h200())
    document = json.loads((REPO / "tests" / "fixtures" / "doctor" / "h200-host.json").read_text())
    monkeypatch.setattr("stackproof.doctor.doctor_host", lambda *a, **k: document)

    def no_docker() -> None:
        raise AssertionError("docker was asked for after a failing preflight")

    monkeypatch.setattr("pipeline.docker.client.Docker.connect", staticmethod(no_docker))
    handler = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, handler)


def real_args() -> list[str]:
    return ["--matrix", str(REPO / "matrix.yaml")]


def test_cli_doctor_cell_on_a_host_without_docker_exits_3_after_the_report(
    h200_host: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["doctor", "--cell", FIXED, *real_args(), "--json"]) == 3
    out, err = capsys.readouterr()
    document = json.loads(out)
    pre = document["doctor"]["preflight"]
    assert pre["passed"] is False
    statuses = {i["name"]: i["status"] for i in pre["items"]}
    assert statuses["compute-capability"] == "FAIL" and statuses["nvidia-runtime"] == "WARN"
    assert any("docker not available" in n for n in document["doctor"]["notes"])
    assert "compute capability 9.0" in err and "Traceback" not in err


def test_cli_doctor_cell_text_puts_the_host_checks_first(h200_host: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--cell", FIXED, *real_args()]) == 3
    out, _ = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].startswith("preflight PASS  gpu:")
    assert lines[1].startswith("preflight FAIL  compute-capability:") and "9.0" in lines[1]
    assert any(line.startswith("preflight WARN  nvidia-runtime: docker not available") for line in lines)
    assert any(line.startswith("GPU: 1 x NVIDIA H200") for line in lines)  # doctor's own report follows


def test_cli_doctor_sm90_cell_passes_on_the_h200(h200_host: None, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--matrix", str(FIXTURES / "sm90-matrix.yaml"), "--images", str(REPO / "images")]
    assert main(["doctor", "--cell", SM90, *args]) == 0
    assert "preflight PASS  compute-capability: compute capability 9.0 = sm90" in capsys.readouterr().out


@pytest.mark.parametrize("command", [["run", FIXED], ["verify", FIXED], ["build", FIXED]])
def test_cli_jobs_of_a_gpu_cell_stop_with_exit_3_listing_every_failure(
    h200_host: None, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*command, *real_args()]) == 3
    err = capsys.readouterr().err
    assert "preflight of sm120-vllm-0.28.0-fi-0.6.18.post1-cu130: 3 item(s) failed" in err
    for name in ("compute-capability", "nvidia-runtime", "disk-images"):
        assert f"  {name}: " in err
    assert "Traceback" not in err


def test_cli_pull_of_a_gpu_cell_preflights_before_the_registry(
    h200_host: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["pull", FIXED, *real_args(), "--registry", "127.0.0.1:1"]) == 3
    assert "preflight of sm120-vllm-0.28.0-fi-0.6.18.post1-cu130" in capsys.readouterr().err


def test_cli_no_preflight_goes_straight_to_docker(
    h200_host: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_daemon() -> None:
        raise InfraError("no docker daemon answers: start one")

    monkeypatch.setattr("pipeline.docker.client.Docker.connect", staticmethod(no_daemon))
    assert main(["run", FIXED, *real_args(), "--no-preflight"]) == 3
    err = capsys.readouterr().err
    assert "no docker daemon answers" in err and "preflight" not in err


def test_cli_a_cpu_cell_has_no_preflight(
    h200_host: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_daemon() -> None:
        raise InfraError("no docker daemon answers: start one")

    monkeypatch.setattr("pipeline.docker.client.Docker.connect", staticmethod(no_daemon))
    monkeypatch.setattr(preflight, "preflight_job", lambda *a, **k: pytest.fail("preflight ran for a CPU cell"))
    assert main(["build", "cpu-tiny", *real_args()]) == 3
    assert "preflight" not in capsys.readouterr().err


def test_cli_bad_input_is_exit_2_before_any_host_check(h200_host: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", FIXED, *real_args(), "--arm", "nosuch"]) == 2
    assert "preflight" not in capsys.readouterr().err


def test_a_cell_on_another_cells_image_has_that_cells_platform(tmp_path: Path) -> None:
    text = (
        (FIXTURES / "sm90-matrix.yaml")
        .read_text()
        .replace("bases:\n", "bases:\n  sm90-image: {cell: sm90-vllm-0.28.0}\n")
    )
    text += (
        "  - id: sm90-arm\n    base: sm90-image\n    platform: linux/arm64\n    arch: sm90\n"
        "    runner: [self-hosted, linux, arm64, gpu, sm90]\n"
    )
    (tmp_path / "m.yaml").write_text(text)
    matrix = load_matrix(tmp_path / "m.yaml", images_dir=REPO / "images")
    require, _, platforms, psource = hostfacts._image_facts(matrix, matrix.cell("sm90-arm"), None)
    assert platforms == ("linux/amd64",) and psource == "the base is cell sm90-vllm-0.28.0's image"
    assert require == "cuda>=13.0"  # from the root registry base, through the parent cell
    facts = dataclasses.replace(h200(), machine="aarch64", base_platforms=platforms, base_platforms_source=psource)
    assert item(judge_preflight(matrix.cell("sm90-arm"), facts), "base-platform").status is Status.FAIL


# -- the host runtime: the host items only ----------------------------------------------------------

H200_HOST_CELL = "h200-vllm-0.26.0-tiny"


def test_the_recorded_h200_passes_the_host_cell_on_the_host_items(real: Matrix) -> None:
    items = judge_host_preflight(real.cell(H200_HOST_CELL), h200())
    assert [(i.name, i.status) for i in items] == [
        ("gpu", Status.PASS),
        ("compute-capability", Status.PASS),
        ("host-platform", Status.PASS),
    ]  # no docker item: the servers are host processes


def test_a_host_cell_for_another_arch_fails_on_the_recorded_h200(real: Matrix) -> None:
    cell = dataclasses.replace(real.cell(H200_HOST_CELL), arch="sm120")
    assert failing(judge_host_preflight(cell, h200())) == ["compute-capability"]
    assert judge_host_preflight(real.cell("cpu-tiny-host"), h200()) == []  # a CPU cell has none


def test_cli_verify_of_the_host_cell_without_a_gpu_exits_3_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    no_gpu = dataclasses.replace(h200(), gpus=(), gpu_error="nvidia-smi: not found on PATH")
    monkeypatch.setattr(preflight, "gather_facts", lambda *a, **k: no_gpu)
    monkeypatch.setattr("stackproof.runjob.run_on_host", lambda *a, **k: pytest.fail("a server path ran"))
    handler = signal.getsignal(signal.SIGTERM)
    try:
        code = main(["verify", H200_HOST_CELL, *real_args(), "--python", sys.executable])
    finally:
        signal.signal(signal.SIGTERM, handler)
    err = capsys.readouterr().err
    assert code == 3 and "preflight FAIL  gpu: no NVIDIA GPU seen (nvidia-smi: not found on PATH)" in err
    assert "nvidia-runtime" not in err and "Traceback" not in err


def test_the_gpu_access_the_runtime_will_use_decides_and_is_named(sm90: Cell) -> None:
    """Gathered by the docker runtime's own rule (pipeline/docker/gpuaccess.py): the way found is
    said; none found fails naming what to install, even where a spec file lies on a daemon without CDI."""
    from pipeline.host.facts import _gpu_access

    base = with_docker(h200(), "runc")
    found = dataclasses.replace(base, gpu_access="cdi (--device nvidia.com/gpu=...; CDI spec for nvidia.com/gpu: x)")
    runtime = item(judge_preflight(sm90, found), "nvidia-runtime")
    assert runtime.status is Status.PASS and runtime.message.startswith("GPU access: cdi (--device nvidia.com/gpu")
    info_20 = {"Runtimes": {"runc": {}}, "CDISpecDirs": None}
    described, missing = _gpu_access(info_20)
    assert described is None and missing is not None and "CDI is off" in missing
    lost = dataclasses.replace(base, cdi_specs=("/etc/cdi/nvidia.yaml",), gpu_access_missing=missing)
    runtime = item(judge_preflight(sm90, lost), "nvidia-runtime")
    assert runtime.status is Status.FAIL and "nvidia-ctk cdi generate" in runtime.message
    assert PreflightFacts.parse(json.loads(json.dumps(lost.to_json()))) == lost
