"""`stackproof matrix audit` on small fake wheels (built here with zipfile): no network.

Every check both ways: a rule that quotes printable text passes with file:line, one that cannot
match is an ERROR; a variable the package reads passes, a misspelt one is an ERROR with a
did-you-mean; a kernel class that exists passes, a missing one is an ERROR; a kernel whose support
check names another capability family is a WARN on that arch and silent on its own.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from verify.audit import index as index_module
from verify.audit.checks import (
    Status,
    capability_findings,
    check_kernel,
    check_pattern,
    check_variable,
    kernel_literals,
)
from verify.audit.facts import FileFacts
from verify.audit.index import INDEX_VERSION, PackageIndex, index_wheel, load_or_build
from verify.audit.wheels import Target, Unavailable, fetch_wheel

VLLM_INIT = """
import logging
import os
logger = logging.getLogger(__name__)

class NvFp4LinearKernel:
    pass

class FP8ScaledMMLinearKernel:
    pass

class CutlassNvFp4LinearKernel(NvFp4LinearKernel):
    @classmethod
    def is_supported(cls):
        return True, None

class FlashInferCuteDslNvFp4LinearKernel(NvFp4LinearKernel):
    @classmethod
    def is_supported(cls):
        if not current_platform.is_device_capability_family(100):
            return False, "FlashInfer cutedsl requires sm_10x"
        return True, None

class CutlassFP8ScaledMMLinearKernel(FP8ScaledMMLinearKernel):
    pass

_POSSIBLE_FP8_KERNELS = {"cuda": [CutlassFP8ScaledMMLinearKernel]}
_POSSIBLE_NVFP4_KERNELS = {"cuda": [CutlassNvFp4LinearKernel, FlashInferCuteDslNvFp4LinearKernel]}

def init_fp8(module_name):
    kernel_type = choose(_POSSIBLE_FP8_KERNELS)
    logger.info_once("Selected %s for %s", kernel_type.__name__, module_name, scope="global")

def init_nvfp4():
    for kernel_cls in _POSSIBLE_NVFP4_KERNELS["cuda"]:
        logger.info_once("Using %s for NVFP4 GEMM", kernel_cls.__name__)

def fail(n):
    raise ValueError(f"Failed to find a kernel: {n:d} tried")

def skip(ops):
    logger.info("Skipping FlashInfer autotuning for ops %s", ops)
    if os.getenv("VLLM_TEST_SOMETHING"):
        print("done", n)
"""
VLLM_ENVS = """
import os
environment_variables = {
    "VLLM_DISABLED_KERNELS": lambda: os.environ["VLLM_DISABLED_KERNELS"].split(","),
    "VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS": lambda: os.getenv("VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS"),
}
"""
CONFIG = """
class VllmConfig:
    def __str__(self):
        return f"model={self.model!r}, device_config={self.device_config.device}, seed={self.seed}"
"""
TOPK_CU = """
void run() {
  TVM_FFI_ICHECK(status == cudaSuccess) << "TopKRaggedTransform failed with error code "
                                         << cudaGetErrorString(status);
}
"""


def fake_wheel(tmp_path: Path, files: dict[str, str], name: str = "vllm-0.28.0-py3-none-any.whl") -> Path:
    path = tmp_path / name
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
    return path


@pytest.fixture
def vllm(tmp_path: Path) -> PackageIndex:
    wheel = fake_wheel(
        tmp_path,
        {
            "vllm/kernels.py": VLLM_INIT,
            "vllm/envs.py": VLLM_ENVS,
            "vllm/config.py": CONFIG,
            "vllm/data/csrc/topk.cu": TOPK_CU,
            "vllm/data/cutlass/include/x.h": 'TORCH_CHECK(false, "vendored text");',
            "vllm/data/cccl/examples/select.py": 'print(f"Selected {n} items")',
        },
    )
    return index_wheel(wheel, name="vllm", version="0.28.0", sha256="0" * 64)


# -- rules -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "line"),
    [
        (r"Using CutlassNvFp4LinearKernel for NVFP4 GEMM", 36),
        (r"Using FlashInfer\w*NvFp4LinearKernel for NVFP4 GEMM", 36),
        (r"Selected CutlassFP8ScaledMMLinearKernel for \w+", 32),
        (r"Selected (?P<kernel>\w+) for (?P<method>\w+)", 32),
        (r"Skipping FlashInfer autotuning for ops .*fp8_gemm", 42),
        (r"Failed to find a kernel: \d+ tried", 39),
    ],
)
def test_a_rule_on_printable_text_matches_with_file_and_line(vllm: PackageIndex, pattern: str, line: int) -> None:
    evidence = check_pattern(pattern, [vllm])
    assert evidence is not None
    assert (evidence.file, evidence.line) == ("vllm/kernels.py", line)
    assert str(evidence).startswith("vllm==0.28.0 vllm/kernels.py:")


@pytest.mark.parametrize(
    "pattern",
    [
        # the sm121 arm's old mistake: NVFP4 kernels never go through "Selected %s for %s"
        r"Selected CutlassNvFp4LinearKernel for \w+",
        r"Using CutlassFP8ScaledMMLinearKernel for NVFP4 GEMM",
        r"Failed to find a kernel: abc tried",  # a number's hole holds no letters
        r"Skipping cuDNN in bmm_fp8",
        r"Selected 4 items",  # vendored example code is not indexed
        r"vendored text",
    ],
)
def test_a_rule_no_package_can_print_is_not_matched(vllm: PackageIndex, pattern: str) -> None:
    assert check_pattern(pattern, [vllm]) is None


def test_str_of_a_config_and_cxx_check_macros_are_printable_text(vllm: PackageIndex) -> None:
    config = check_pattern("device_config=cpu", [vllm])
    assert config is not None and config.file == "vllm/config.py"
    topk = check_pattern(r"TopKRaggedTransform failed with error code (?P<error>.+)", [vllm])
    assert topk is not None and (topk.file, topk.line) == ("vllm/data/csrc/topk.cu", 3)


def test_a_hole_absorbs_several_words_only_between_literals(tmp_path: Path) -> None:
    source = (
        'def f(path, m):\n    msg = f"[A]: Cache file {path} was created in a different environment ({m}). Ignoring."\n'
    )
    index = index_wheel(fake_wheel(tmp_path, {"fi/a.py": source}), name="fi", version="1", sha256="1" * 64)
    pattern = (
        r"Cache file (?P<path>\S+) was created in a different environment "
        r"\((?P<k>[^:]+): saved=(?P<s>.*?) vs current=(?P<c>[^)]*)\)"
    )
    assert check_pattern(pattern, [index]) is not None
    assert check_pattern(r"Cache file \S+ was moved", [index]) is None


def test_both_texts_of_a_conditional_inside_an_f_string_are_printable(tmp_path: Path) -> None:
    """SGLang's sizing line prints `available_cpu_mem=` or `available_gpu_mem=` (scheduler.py:1098 @0.5.18)."""
    source = (
        "import logging\nlogger = logging.getLogger()\n"
        "def f(self, n, free):\n"
        "    logger.info(\n"
        '        f"max_total_num_tokens={n}, "\n'
        "        f\"{'available_cpu_mem' if self.device == 'cpu' else 'available_gpu_mem'}=\"\n"
        '        f"{free:.2f} GB"\n'
        "    )\n"
    )
    index = index_wheel(fake_wheel(tmp_path, {"sg/a.py": source}), name="sg", version="1", sha256="2" * 64)
    assert check_pattern(r"available_cpu_mem=", [index]) is not None
    assert check_pattern(r"max_total_num_tokens=\d+, available_gpu_mem=[\d.]+ GB", [index]) is not None
    assert check_pattern(r"available_tpu_mem=", [index]) is None, "only the two texts the branches hold"


# -- variables, kernels, capability --------------------------------------------------------------------


def test_variables_read_by_the_package_pass_and_a_misspelt_one_is_an_error(vllm: PackageIndex) -> None:
    ok = check_variable("VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS", "arm a env", [vllm])
    assert ok.status is Status.OK and ok.evidence[0].file == "vllm/envs.py"
    assert check_variable("VLLM_TEST_SOMETHING", "cell env", [vllm]).status is Status.OK  # os.getenv
    bad = check_variable("VLLM_FLASHINFER_AUTOTUNE_SKIP_OP", "arm a env", [vllm])
    assert bad.status is Status.ERROR
    assert "did you mean VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS?" in bad.message


def test_kernels_that_exist_pass_and_a_missing_one_is_an_error(vllm: PackageIndex) -> None:
    ok = check_kernel("CutlassNvFp4LinearKernel", "arm a", [vllm])
    assert ok.status is Status.OK and ok.evidence[0].line == 12
    bad = check_kernel("CutlassNvFp4LinearKernell", "arm a", [vllm])
    assert bad.status is Status.ERROR and "did you mean CutlassNvFp4LinearKernel?" in bad.message


def test_kernel_literals_are_whole_class_names_only() -> None:
    assert kernel_literals(r"Using CutlassNvFp4LinearKernel for NVFP4 GEMM") == ["CutlassNvFp4LinearKernel"]
    assert kernel_literals(r"Using FlashInfer\w*NvFp4LinearKernel for NVFP4 GEMM") == []
    assert kernel_literals(r"Selected (?P<k>\w+) for") == []


def test_a_kernel_gated_to_another_family_warns_on_sm121_and_not_on_its_own(vllm: PackageIndex) -> None:
    warned = capability_findings("FlashInferCuteDslNvFp4LinearKernel", "sm121", "disables", "arm a env", [vllm])
    assert [f.status for f in warned] == [Status.WARN]
    assert "is_device_capability_family(100)" in warned[0].message and warned[0].evidence[0].line == 20
    assert capability_findings("FlashInferCuteDslNvFp4LinearKernel", "sm100", "disables", "arm a", [vllm]) == []
    assert capability_findings("CutlassNvFp4LinearKernel", "sm121", "expects", "arm a", [vllm]) == []


# -- the index cache and the wheel cache ---------------------------------------------------------------


def test_the_index_is_built_once_and_read_back_from_disk(tmp_path: Path) -> None:
    wheel = fake_wheel(tmp_path, {"vllm/kernels.py": VLLM_INIT})
    said: list[str] = []
    first = load_or_build(wheel, name="vllm", version="0.28.0", sha256="a" * 64, progress=said.append)
    second = load_or_build(wheel, name="vllm", version="0.28.0", sha256="a" * 64, progress=said.append)
    assert len(said) == 1 and (tmp_path / f"index-{'a' * 16}.json").is_file()
    assert second.messages == first.messages and second.classes == first.classes
    assert second is first  # a wheel several cells pin is decoded once per command


def test_the_stored_index_reads_back_the_same_facts_in_a_new_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheel = fake_wheel(tmp_path, {"vllm/kernels.py": VLLM_INIT, "vllm/b.py": 'import os\nos.getenv("VLLM_B")'})
    built = load_or_build(wheel, name="vllm", version="0.28.0", sha256="c" * 64)
    monkeypatch.setattr(index_module, "_LOADED", {})  # what a later command starts with
    said: list[str] = []
    read = load_or_build(wheel, name="vllm", version="0.28.0", sha256="c" * 64, progress=said.append)
    assert said == [] and read is not built
    assert read == built == index_wheel(wheel, name="vllm", version="0.28.0", sha256="c" * 64)


def test_an_index_of_another_version_or_wheel_is_rebuilt_not_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheel = fake_wheel(tmp_path, {"vllm/kernels.py": VLLM_INIT})
    store = tmp_path / f"index-{'d' * 16}.json"
    for stale in ({"index_version": INDEX_VERSION - 1, "sha256": "d" * 64}, {"index_version": INDEX_VERSION}):
        store.write_text(json.dumps({**stale, "files": [], "holes": [], "messages": [], "env": [], "classes": []}))
        monkeypatch.setattr(index_module, "_LOADED", {})
        said: list[str] = []
        index = load_or_build(wheel, name="vllm", version="0.28.0", sha256="d" * 64, progress=said.append)
        assert len(said) == 1 and "NvFp4LinearKernel" in index.classes


def test_a_file_two_wheels_share_is_parsed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # vLLM's x86_64 and aarch64 wheels: the same Python files, read from the first one's index
    for platform in ("x86", "arm"):
        (tmp_path / "wheels" / "vllm" / platform).mkdir(parents=True)
    first = fake_wheel(tmp_path / "wheels" / "vllm" / "x86", {"vllm/kernels.py": VLLM_INIT})
    second = fake_wheel(tmp_path / "wheels" / "vllm" / "arm", {"vllm/kernels.py": VLLM_INIT})
    load_or_build(first, name="vllm", version="0.28.0", sha256="e" * 64)
    parsed: list[str] = []
    real = index_module.index_source

    def counted(path: str, text: str) -> FileFacts:
        parsed.append(path)
        return real(path, text)

    monkeypatch.setattr(index_module, "index_source", counted)
    reused = load_or_build(second, name="vllm", version="0.28.0", sha256="f" * 64)
    assert parsed == [] and "CutlassNvFp4LinearKernel" in reused.classes


def test_an_index_built_in_this_process_is_not_read_back_for_the_next_wheel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a cold audit builds its wheels one after another: each earlier index is read once, not once
    # per later wheel (the whole matrix's 20 wheels read 190 documents)
    monkeypatch.setattr(index_module, "_DONORS", {})
    for n in range(4):
        (tmp_path / "wheels" / "vllm" / str(n)).mkdir(parents=True)
    wheels = [fake_wheel(tmp_path / "wheels" / "vllm" / str(n), {f"vllm/m{n}.py": VLLM_INIT}) for n in range(4)]
    donors: list[Path] = []  # documents read for their files (any wheel's: no sha256 asked)
    real = index_module.read_document

    def counted(store: Path, sha256: str | None) -> dict[str, object] | None:
        if sha256 is None:
            donors.append(store)
        return real(store, sha256)

    monkeypatch.setattr(index_module, "read_document", counted)
    built = [load_or_build(w, name="vllm", version="0.28.0", sha256=f"{n}" * 64) for n, w in enumerate(wheels[:3])]
    assert donors == [] and all("CutlassNvFp4LinearKernel" in b.classes for b in built)
    monkeypatch.setattr(index_module, "_DONORS", {})  # a later command: the three read once each
    load_or_build(wheels[3], name="vllm", version="0.28.0", sha256="3" * 64)
    assert sorted(d.parent.name for d in donors) == ["0", "1", "2"]


def test_the_workers_read_a_wheel_as_this_process_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the pool takes batches biggest file first; the facts come back in the wheel's file order
    files = {f"vllm/m{n}.py": VLLM_INIT + f'\nlogger.info("module {n}")\n' * n for n in range(12)}
    wheel = fake_wheel(tmp_path, {**files, "csrc/a.cu": 'TORCH_CHECK(x, "bad x");'})
    alone = index_module.index_files(wheel, {})
    monkeypatch.setattr(index_module, "_POOLED_BYTES", 0)
    monkeypatch.setattr(index_module, "_WORKERS", 2)
    monkeypatch.setattr(index_module, "_POOL", None)
    try:
        pooled = index_module.index_files(wheel, {})
        assert index_module._POOL is not None
    finally:
        if index_module._POOL is not None:
            index_module._POOL.shutdown()
    assert pooled == alone and len(alone) == 13


def test_a_wheel_is_fetched_by_pip_once_then_answered_from_the_cache(tmp_path: Path) -> None:
    source = tmp_path / "links"
    source.mkdir()
    info = "uvicorn-0.54.0.dist-info"
    files = {
        "uvicorn/on.py": 'logger.info("Application startup complete.")',
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: uvicorn\nVersion: 0.54.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/RECORD": "",
    }
    fake_wheel(source, files, "uvicorn-0.54.0-py3-none-any.whl")
    target = Target(platform="manylinux_2_28_x86_64", python="3.12")
    root = tmp_path / "cache"
    first = fetch_wheel("uvicorn", "0.54.0", index_url="local", target=target, root=root, find_links=source)
    second = fetch_wheel("uvicorn", "0.54.0", index_url="local", target=target, root=root, find_links=source)
    assert first.downloaded and not second.downloaded
    assert second.path == root / "uvicorn" / "0.54.0" / "uvicorn-0.54.0-py3-none-any.whl"
    assert second.sha256 == first.sha256 and len(first.sha256) == 64


def test_a_wheel_the_index_lacks_is_unavailable_not_a_crash(tmp_path: Path) -> None:
    empty = tmp_path / "links"
    empty.mkdir()
    target = Target(platform="manylinux_2_28_x86_64", python="3.12")
    with pytest.raises(Unavailable) as caught:
        fetch_wheel(
            "flashinfer-jit-cache", "0.6.18.post1+cu130", index_url="x", target=target, root=tmp_path, find_links=empty
        )
    assert not caught.value.network and "No matching distribution" in str(caught.value)


def test_a_pure_python_wheel_serves_every_target_from_one_download(tmp_path: Path) -> None:
    source = tmp_path / "links"
    source.mkdir()
    info = "uvicorn-0.54.0.dist-info"
    files = {
        "uvicorn/on.py": 'logger.info("Application startup complete.")',
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: uvicorn\nVersion: 0.54.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/RECORD": "",
    }
    fake_wheel(source, files, "uvicorn-0.54.0-py3-none-any.whl")
    root = tmp_path / "cache"
    x86 = Target(platform="manylinux_2_28_x86_64", python="3.11")
    arm = Target(platform="manylinux_2_28_aarch64", python="3.12")
    first = fetch_wheel("uvicorn", None, index_url="local", target=x86, root=root, find_links=source)
    again = fetch_wheel("uvicorn", None, index_url="local", target=arm, root=root, find_links=source)
    assert first.downloaded and first.version == "0.54.0"
    assert not again.downloaded and again.path == first.path


def test_a_zip_bomb_member_and_a_too_deep_source_cost_their_facts_not_the_audit(tmp_path: Path) -> None:
    """A member that inflates past the cap is not read further (the bytes read are capped, not the
    size the zip announces); a source nested past the recursion limit gives no facts; the wheel's
    other sources are still indexed."""
    from verify.audit.index import MAX_SOURCE_BYTES, index_wheel

    wheel = tmp_path / "hostile-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("hostile/bomb.py", b" " * (MAX_SOURCE_BYTES + 4096) + b'\nlogger.info("never read")\n')
        archive.writestr("hostile/deep.py", "x = " + "+".join(["1"] * 200_000) + "\n")
        archive.writestr("hostile/good.py", 'logger.warning("Engine ready on %s", host)\n')
    assert wheel.stat().st_size < MAX_SOURCE_BYTES // 100  # the bomb: small on disk, past the cap inflated
    index = index_wheel(wheel, name="hostile", version="1.0", sha256="0" * 64)
    texts = [m.literal for m in index.messages]
    assert index.files == 3 and "Engine ready on " in texts
    assert not any("never read" in t for t in texts)
