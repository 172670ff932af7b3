"""The audit of whole cells on fake wheels served from a local directory (no network), and the
CLI's exit codes: 0 clean, 1 on an ERROR, 2 for bad input, 3 when the index serving vLLM is down.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pipeline.matrix.read import load_matrix
from pipeline.releases.pins import ReleaseLookup
from verify.audit import Sources, audit_matrix
from verify.audit.checks import Status

REPO = Path(__file__).resolve().parents[2]
MATRIX = """\
schema_version: 1
indexes:
  pypi: {url: "http://127.0.0.1:9/simple"}
  flashinfer: {url: "http://127.0.0.1:9/whl"}
  flashinfer-cu130: {url: "http://127.0.0.1:9/whl/cu130"}
bases:
  vllm-openai-0.28.0: {image: "vllm/vllm-openai:v0.28.0", python: python3}
cells:
  - id: gb10
    base: vllm-openai-0.28.0
    platform: linux/arm64
    arch: sm121
    runner: [self-hosted, gpu]
    serve:
      model: {source: "hf:org/model", revision: "0123456789abcdef0123456789abcdef01234567"}
      readiness_timeout: 900
      shm_size: 8g
      gpus: all
    arms:
      cutlass:
        description: the sm121 arm's old mistake, and its right rule
        env: {VLLM_DISABLED_KERNELS: FlashInferCuteDslNvFp4LinearKernel, VLLM_NOT_A_VARIABLE: "1"}
        log_rules:
          - {id: nvfp4, expect: 'Using CutlassNvFp4LinearKernel for NVFP4 GEMM'}
          - {id: startup, expect: 'Application startup complete\\.', package: uvicorn}
          - {id: xid, forbid: 'an illegal memory access was encountered', source: external}
          - {id: wrong-package, expect: 'Using CutlassNvFp4LinearKernel', package: flashinfer}
"""
KERNELS = """
import logging
logger = logging.getLogger(__name__)
class NvFp4LinearKernel: ...
class CutlassNvFp4LinearKernel(NvFp4LinearKernel): ...
class FlashInferCuteDslNvFp4LinearKernel(NvFp4LinearKernel):
    @classmethod
    def is_supported(cls):
        if not current_platform.is_device_capability_family(100):
            return False, "FlashInfer cutedsl requires sm_10x"
        return True, None
_POSSIBLE = [CutlassNvFp4LinearKernel, FlashInferCuteDslNvFp4LinearKernel]
def init():
    for kernel_cls in _POSSIBLE:
        logger.info_once("Using %s for NVFP4 GEMM", kernel_cls.__name__)
"""
ENVS = 'import os\nenvironment_variables = {"VLLM_DISABLED_KERNELS": lambda: os.environ["VLLM_DISABLED_KERNELS"]}\n'


def wheel(directory: Path, name: str, version: str, files: dict[str, str]) -> None:
    dist = f"{name.replace('-', '_')}-{version}"
    with zipfile.ZipFile(directory / f"{dist}-py3-none-any.whl", "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
        archive.writestr(f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        archive.writestr(f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{dist}.dist-info/RECORD", "")


@pytest.fixture
def matrix_file(tmp_path: Path) -> Path:
    path = tmp_path / "matrix.yaml"
    path.write_text(MATRIX)
    return path


def test_a_cell_audit_lists_versions_and_finds_both_ways(matrix_file: Path, tmp_path: Path) -> None:
    links = tmp_path / "links"
    links.mkdir()
    wheel(links, "vllm", "0.28.0", {"vllm/kernels.py": KERNELS, "vllm/envs.py": ENVS})
    wheel(links, "flashinfer-python", "0.6.16.post3", {"flashinfer/__init__.py": "print('hello')\n"})
    wheel(links, "uvicorn", "0.54.0", {"uvicorn/on.py": 'logger.info("Application startup complete.")\n'})
    empty = tmp_path / "empty"
    empty.mkdir()
    matrix = load_matrix(matrix_file, images_dir=REPO / "images")
    sources = Sources(root=tmp_path / "cache", index_url=lambda n: ("local", links if n == "pypi" else empty))
    report = audit_matrix(
        matrix,
        matrix.cells,
        sources=sources,
        lookup=ReleaseLookup(online=False),
        rulesets=lambda facts: [],
        signatures=[],
        progress=lambda line: None,
    )
    cell = report.cells[0]
    packages = {p.name: (p.version, p.status) for p in cell.packages}
    assert packages["vllm"] == ("0.28.0", "checked")
    assert packages["flashinfer-python"] == ("0.6.16.post3", "checked")  # the release pin
    assert packages["flashinfer-jit-cache"] == ("0.6.16.post3+cu130", "not-checkable")
    assert packages["uvicorn"] == ("0.54.0", "checked")  # unpinned in the image: the newest there is
    assert packages["torch"] == ("2.13.0", "listed")
    found = {(f.kind, f.subject.split(":")[0]): f for f in cell.findings}
    assert found[("rule", "expect nvfp4")].status is Status.OK
    assert str(found[("rule", "expect nvfp4")].evidence[0]) == "vllm==0.28.0 vllm/kernels.py:15"
    assert found[("rule", "expect startup")].evidence[0].package == "uvicorn"
    assert found[("rule", "forbid xid")].status is Status.EXTERNAL
    assert found[("rule", "expect wrong-package")].status is Status.ERROR  # flashinfer prints no such line
    assert found[("variable", "VLLM_DISABLED_KERNELS")].status is Status.OK
    assert found[("variable", "VLLM_NOT_A_VARIABLE")].status is Status.ERROR
    assert found[("kernel", "FlashInferCuteDslNvFp4LinearKernel")].status is Status.OK
    warn = found[("capability", "FlashInferCuteDslNvFp4LinearKernel")]
    assert warn.status is Status.WARN and "is_device_capability_family(100)" in warn.message
    assert found[("package", "flashinfer-jit-cache")].status is Status.NOT_CHECKABLE
    own = [f for f in cell.findings if f.status is Status.ERROR and f.kind != "assumption"]
    assert len(own) == 2
    # This vllm wheel prints none of the lines the project's stages rely on: each is an ERROR.
    missing = {f.subject for f in cell.findings if f.kind == "assumption" and f.status is Status.ERROR}
    assert "metric vllm:generation_tokens_total" in missing
    assert "dead-engine marker: EngineDeadError" in missing


def stackproof(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"STACKPROOF_CACHE_DIR": str(cache), "PATH": "/usr/bin:/bin", "HOME": str(cache)},
    )


def test_an_unknown_cell_is_bad_input_exit_2(matrix_file: Path, tmp_path: Path) -> None:
    done = stackproof(
        "matrix", "audit", "--matrix", str(matrix_file), "--images", str(REPO / "images"), "gb1O", cache=tmp_path
    )
    assert done.returncode == 2 and "did you mean 'gb10'" in done.stderr and "Traceback" not in done.stderr


def test_a_bad_source_key_is_located_exit_2(matrix_file: Path, tmp_path: Path) -> None:
    matrix_file.write_text(MATRIX.replace("source: external", "source: cuda"))
    done = stackproof("matrix", "audit", "--matrix", str(matrix_file), "--images", str(REPO / "images"), cache=tmp_path)
    assert done.returncode == 2
    assert f"{matrix_file}:" in done.stderr and "must be package or external, got 'cuda'" in done.stderr


def test_the_index_serving_vllm_unreachable_is_exit_3_saying_what_to_fix(matrix_file: Path, tmp_path: Path) -> None:
    done = stackproof("matrix", "audit", "--matrix", str(matrix_file), "--images", str(REPO / "images"), cache=tmp_path)
    assert done.returncode == 3, done.stderr[-2000:]
    assert "cannot reach index 'pypi'" in done.stderr and "STACKPROOF_CA_BUNDLE" in done.stderr
    assert "Traceback" not in done.stderr


def test_signatures_both_ways_and_the_ones_listed_not_checked(matrix_file: Path, tmp_path: Path) -> None:
    from verify.logs.catalog import Signature

    def sig(id_: str, match: str, **extra: object) -> Signature:
        base: dict = dict(title=id_, severity="fail", source="server", first=None, then=None, within=20)  # type: ignore[type-arg]
        return Signature(id=id_, match=match, what="", workaround="", refs=(), **(base | extra))  # type: ignore[arg-type]

    links = tmp_path / "links"
    links.mkdir()
    wheel(links, "vllm", "0.28.0", {"vllm/kernels.py": KERNELS, "vllm/envs.py": ENVS})
    wheel(
        links,
        "flashinfer-python",
        "0.6.16.post3",
        {"flashinfer/a.py": 'raise RuntimeError("SM 12.x requires CUDA >= 12.9")\n'},
    )
    wheel(links, "uvicorn", "0.54.0", {"uvicorn/on.py": 'logger.info("Application startup complete.")\n'})
    matrix = load_matrix(matrix_file, images_dir=REPO / "images")
    sources = Sources(root=tmp_path / "cache", index_url=lambda n: ("local", links))
    signatures = [
        sig("printable", r"SM 12\.x requires CUDA >= 12\.9", package="flashinfer-python"),
        sig("unprintable", r"no package says this"),
        sig("cuda", r"an illegal memory access was encountered", origin="external"),
        sig("xid", r"NVRM: Xid", source="kernel"),
        sig("sglang", r"Parameter \S+ not found", package="sglang"),
        sig("later", r"PLE offload", applies_to=(("vllm", ">0.28.0"),)),
    ]
    report = audit_matrix(
        matrix,
        matrix.cells,
        sources=sources,
        lookup=ReleaseLookup(online=False),
        rulesets=lambda facts: [],
        signatures=signatures,
        progress=lambda line: None,
    )
    status = {f.subject.split(":")[0]: f.status for f in report.cells[0].findings if f.kind == "signature"}
    assert status == {
        "signature printable": Status.OK,
        "signature unprintable": Status.ERROR,
        "signature cuda": Status.EXTERNAL,
        "signature xid": Status.EXTERNAL,
        "signature sglang": Status.NOT_APPLICABLE,
        "signature later": Status.NOT_APPLICABLE,
    }
