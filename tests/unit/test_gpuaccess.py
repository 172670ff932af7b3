"""GPU access as a site fact (pipeline/docker/gpuaccess.py): detection from `docker info`, the spec
files, the site setting, and the `docker run` flags each way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.docker.client import Container, run_argv
from pipeline.docker.gpuaccess import (
    GpuAccess,
    GpuAccessSetting,
    GpuAccessSettingError,
    cdi_spec_kinds,
    choose_gpu_access,
    gpu_access_setting,
    gpu_flags,
    missing_gpu_access_hint,
)
from pipeline.errors import InfraError, InputError
from tests.unit.fake_docker import RecordingDocker

FIXTURES = Path(__file__).parents[1] / "fixtures" / "gpuaccess"
# Recorded from the Docker 20.10 daemon of this CI host (no CDI: CDISpecDirs null).
INFO_20 = json.loads((FIXTURES / "info-20.10.json").read_text())
# Stand-in shapes: a Docker 26 daemon with `features.cdi` on (CDISpecDirs, as tests/integration reads
# from a real one), and one whose daemon.json registers the NVIDIA runtime (not installable here).
INFO_CDI = {**INFO_20, "ServerVersion": "26.1.5", "CDISpecDirs": ["/etc/cdi", "/var/run/cdi"]}
INFO_NVIDIA = {**INFO_20, "Runtimes": {**INFO_20["Runtimes"], "nvidia": {"path": "nvidia-container-runtime"}}}

SPEC = """cdiVersion: "0.6.0"
kind: KIND
devices:
  - name: all
    containerEdits:
      env: [STACKPROOF_FAKE_GPU=1]
"""


def _spec_dir(tmp_path: Path, kind: str = "nvidia.com/gpu", name: str = "nvidia.yaml") -> Path:
    d = tmp_path / "cdi"
    d.mkdir(exist_ok=True)
    (d / name).write_text(SPEC.replace("KIND", kind))
    return d


def test_spec_kinds_read_yaml_and_json_and_skip_what_is_no_spec(tmp_path: Path) -> None:
    d = _spec_dir(tmp_path)
    (d / "fake.json").write_text(json.dumps({"cdiVersion": "0.6.0", "kind": "stackproof.test/gpu", "devices": []}))
    (d / "broken.yaml").write_text("kind: [unclosed")
    (d / "notes.txt").write_text("kind: nvidia.com/gpu")
    (d / "nodevices.yaml").write_text("kind: other.com/gpu\n")
    kinds = cdi_spec_kinds([d, tmp_path / "absent"])
    assert kinds == {"nvidia.com/gpu": (str(d / "nvidia.yaml"),), "stackproof.test/gpu": (str(d / "fake.json"),)}


def test_auto_picks_the_nvidia_runtime_first_then_cdi_then_nothing() -> None:
    auto = GpuAccessSetting()
    kinds = {"nvidia.com/gpu": ("/etc/cdi/nvidia.yaml",)}
    assert choose_gpu_access(INFO_NVIDIA, kinds, auto).how == "gpus"  # type: ignore[union-attr]
    cdi = choose_gpu_access(INFO_CDI, kinds, auto)
    assert cdi is not None and cdi.how == "cdi" and "/etc/cdi/nvidia.yaml" in cdi.source
    assert choose_gpu_access(INFO_CDI, {}, auto) is None  # CDI on, no spec for the kind
    assert choose_gpu_access(INFO_CDI, {"other.com/gpu": ("x",)}, auto) is None
    assert choose_gpu_access(INFO_20, kinds, auto) is None  # a spec on disk, but the daemon reads none


def test_the_site_setting_forces_a_way_and_names_a_kind() -> None:
    assert gpu_access_setting({}) == GpuAccessSetting("auto", "nvidia.com/gpu")
    forced = gpu_access_setting({"STACKPROOF_GPU_ACCESS": "cdi", "STACKPROOF_CDI_KIND": "stackproof.test/gpu"})
    chosen = choose_gpu_access(INFO_20, {}, forced)
    assert chosen == GpuAccess("cdi", "stackproof.test/gpu", "STACKPROOF_GPU_ACCESS=cdi")
    assert choose_gpu_access(INFO_CDI, {}, GpuAccessSetting("gpus")).how == "gpus"  # type: ignore[union-attr]
    with pytest.raises(GpuAccessSettingError, match="STACKPROOF_GPU_ACCESS='nvidia'"):
        gpu_access_setting({"STACKPROOF_GPU_ACCESS": "nvidia"})
    with pytest.raises(GpuAccessSettingError, match="VENDOR/CLASS"):
        gpu_access_setting({"STACKPROOF_CDI_KIND": "gpu"})


def test_the_hint_names_what_to_install_for_this_daemon() -> None:
    old = missing_gpu_access_hint(INFO_20, GpuAccessSetting())
    assert "CDI is off" in old and "nvidia-ctk cdi generate" in old and "NVIDIA container toolkit" in old
    on = missing_gpu_access_hint(INFO_CDI, GpuAccessSetting())
    assert "no spec there declares nvidia.com/gpu" in on and "--output=/etc/cdi/nvidia.yaml" in on


@pytest.mark.parametrize(
    ("request_", "flags"),
    [
        ("all", ["--device", "k.io/gpu=all"]),
        ('"device=0,2"', ["--device", "k.io/gpu=0", "--device", "k.io/gpu=2"]),
        ("device=1", ["--device", "k.io/gpu=1"]),
        ("2", ["--device", "k.io/gpu=0", "--device", "k.io/gpu=1"]),  # a count, as --gpus reads it
    ],
)
def test_cdi_flags_per_request(request_: str, flags: list[str]) -> None:
    assert gpu_flags(GpuAccess("cdi", "k.io/gpu", "test"), request_) == flags
    assert gpu_flags(GpuAccess("gpus", "k.io/gpu", "test"), request_) == ["--gpus", request_]
    assert gpu_flags(None, request_) == ["--gpus", request_]


def _server(**kw: object) -> Container:
    return Container(image="img", name="n", role="server", command=("vllm", "serve"), **kw)  # type: ignore[arg-type]


def test_docker_start_fills_the_access_once_from_docker_info(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = _spec_dir(tmp_path)
    docker = RecordingDocker(stdout=json.dumps({**INFO_CDI, "CDISpecDirs": [str(d)]}))
    monkeypatch.delenv("STACKPROOF_GPU_ACCESS", raising=False)
    monkeypatch.delenv("STACKPROOF_CDI_KIND", raising=False)
    docker.start(_server(gpus="all"))
    docker.start(_server(gpus="all"))
    infos = [c for c in docker.calls if c[0] == "info"]
    runs = [c for c in docker.calls if c[0] == "run"]
    assert len(infos) == 1 and all("--device" in r and "nvidia.com/gpu=all" in r and "--gpus" not in r for r in runs)
    assert docker.chosen_gpu_access is not None and docker.chosen_gpu_access.how == "cdi"
    docker.start(_server())  # no GPU asked: no flag at all
    assert "--device" not in docker.calls[-1]


def test_docker_without_any_access_is_exit_3_and_a_bad_setting_exit_2(monkeypatch: pytest.MonkeyPatch) -> None:
    docker = RecordingDocker(stdout=json.dumps(INFO_20))
    monkeypatch.delenv("STACKPROOF_GPU_ACCESS", raising=False)
    with pytest.raises(InfraError, match="no nvidia runtime"):
        docker.start(_server(gpus="all"))
    assert not [c for c in docker.calls if c[0] == "run"]  # nothing started
    monkeypatch.setenv("STACKPROOF_GPU_ACCESS", "both")
    with pytest.raises(InputError, match="STACKPROOF_GPU_ACCESS"):
        RecordingDocker(stdout=json.dumps(INFO_20)).start(_server(gpus="all"))


def test_run_argv_keeps_gpus_when_no_access_was_chosen() -> None:
    argv = run_argv(_server(gpus="all"), detach=True)
    assert argv[argv.index("--gpus") + 1] == "all" and "--device" not in argv
