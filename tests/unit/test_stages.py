"""The stage runner, the startup stage and soak, with stand-ins: stage functions that return what
they are told (the runner), and for startup and soak a stand-in server container (ReplayDocker:
no docker; the log is the real vLLM 0.28.0 CPU server log) answering HTTP through the fake vLLM
server (tests/unit/fake_openai.py). The real thing runs in tests/integration."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from pipeline.matrix.model import STAGES, Arm, LoadSpec, Matrix
from pipeline.result import CheckResult, StageResult, Status
from stackproof.soak import soak
from tests.unit.fake_docker import ReplayDocker
from tests.unit.fake_openai import FakeVllm
from verify.serving import DRIVERS
from verify.stages import server as server_module
from verify.stages.probe import ProbeReport
from verify.stages.runner import StageContext, verify_image
from verify.stages.server import Server, SharedServer
from verify.stages.startup import run_startup

REPO = Path(__file__).resolve().parents[2]
CPU_LOG = (REPO / "tests/fixtures/logs/vllm-0.28.0-cpu-startup.log").read_text()
PROBE = REPO / "tests/fixtures/probe/cpu-fi-0.6.13-matched.json"


def _check(status: Status, name: str = "check") -> CheckResult:
    return CheckResult(name=name, status=status, message=f"{name} said {status}")


class Stages:
    """Stand-in stage functions: each returns the status it was given and records what it saw."""

    def __init__(self, **statuses: Status) -> None:
        self.statuses = statuses
        self.seen: dict[str, StageContext] = {}

    def runners(self) -> dict[str, Any]:
        return {stage: partial(self._run, stage) for stage in STAGES}

    def _run(self, stage: str, ctx: StageContext) -> StageResult:
        self.seen[stage] = ctx
        status = self.statuses.get(stage, Status.PASS)
        found = ProbeReport.parse(json.loads(PROBE.read_text())) if stage == "imports" else None
        return StageResult.of(stage, [_check(status, stage)], 0.1, probe_report=found)


def _verify(real_matrix: Matrix, tmp_path: Path, stages: Stages, **kw: Any) -> Any:
    return verify_image(
        ReplayDocker(""),
        real_matrix.cell("cpu-tiny"),
        image="img",
        image_id="sha256:" + "0" * 64,
        python="python3",
        stages=STAGES,
        arm=None,
        out_dir=tmp_path,
        **({"runners": stages.runners()} | kw),
    )


def test_the_runner_runs_every_stage_in_order_and_hands_the_report_back(real_matrix: Matrix, tmp_path: Path) -> None:
    stages = Stages()
    report = _verify(real_matrix, tmp_path, stages)
    assert [s.stage for s in report.stages] == list(STAGES) and report.outcome.passed
    # the report is handed back in memory: the receipt made from it is the run's one document
    assert not (tmp_path / "report.json").exists()
    # the imports stage's probe feeds the facts of the stages after it (the log rule sets use them)
    assert stages.seen["imports"].facts.engine_version is None
    assert stages.seen["startup"].facts.engine_version is not None and stages.seen["startup"].facts.engine == "vllm"


def test_a_stage_names_only_the_files_its_run_kept(real_matrix: Matrix, tmp_path: Path) -> None:
    """A receipt names no file its run did not write (a server that never started leaves no log):
    publish wants each file a receipt names beside it."""
    (tmp_path / "probe.json").write_text("{}")
    (tmp_path / "autotune-store").mkdir()
    named = {"probe": str(tmp_path / "probe.json"), "server_log": str(tmp_path / "server.log"),
             "store": str(tmp_path / "autotune-store")}  # fmt: skip

    def startup(ctx: StageContext) -> StageResult:
        return StageResult.of("startup", [_check(Status.FAIL, "readiness")], 0.1, **named)

    report = _verify(real_matrix, tmp_path, Stages(), runners={**Stages().runners(), "startup": startup})
    assert report.stages[1].artifacts == {"probe": named["probe"], "store": named["store"]}


def test_the_runner_stops_at_the_first_failure(real_matrix: Matrix, tmp_path: Path) -> None:
    stages = Stages(startup=Status.FAIL)
    report = _verify(real_matrix, tmp_path, stages)
    assert [s.stage for s in report.stages] == ["imports", "startup"], "nothing runs after a FAIL"
    assert set(stages.seen) == {"imports", "startup"} and not report.outcome.passed


def test_extra_checks_count_toward_their_stage(real_matrix: Matrix, tmp_path: Path) -> None:
    report = _verify(real_matrix, tmp_path, Stages(), extra_checks={"imports": [_check(Status.WARN, "host")]})
    assert report.stages[0].status is Status.WARN and [c.name for c in report.stages[0].checks] == ["imports", "host"]
    failing = _verify(real_matrix, tmp_path / "b", Stages(), extra_checks={"imports": [_check(Status.FAIL, "host")]})
    assert [s.stage for s in failing.stages] == ["imports"] and not failing.outcome.passed


def test_a_kept_server_is_removed_when_a_later_stage_raises(real_matrix: Matrix, tmp_path: Path) -> None:
    removed: list[str] = []

    class Kept:
        name = "kept-server"

        def remove(self) -> None:
            removed.append(self.name)

    def startup(ctx: StageContext) -> StageResult:
        ctx.share.keep(Kept())  # type: ignore[arg-type]
        return StageResult.of("startup", [_check(Status.PASS)], 0.1)

    def autotune(ctx: StageContext) -> StageResult:
        raise KeyboardInterrupt

    stages = Stages()
    runners = {**stages.runners(), "startup": startup, "autotune": autotune}
    with pytest.raises(KeyboardInterrupt):
        verify_image(
            ReplayDocker(""), real_matrix.cell("cpu-tiny"), image="img", image_id="sha256:" + "0" * 64,
            python="python3", stages=STAGES, arm=None, out_dir=tmp_path, runners=runners,
        )  # fmt: skip
    assert removed == ["kept-server"]


# -- the startup stage over a stand-in server container ------------------------------------------------


def _server_on(fake: FakeVllm, log: str) -> Any:
    """Server, but on the fake's port, over an engine that replays `log`."""
    port = int(fake.url.rsplit(":", 1)[1])

    def make(docker: Any, cell: Any, image: str, **kw: Any) -> Server:
        return Server(ReplayDocker(log), cell, image, port=port, **kw)

    return make


def _startup(
    real_matrix: Matrix, tmp_path: Path, fake: FakeVllm, log: str, *, readiness_s: float | None = None, **kw: Any
) -> StageResult:
    from verify.stages.runner import stage_facts

    cell = real_matrix.cell("cpu-tiny")
    if readiness_s is not None and cell.serve is not None:
        cell = dataclasses.replace(cell, serve=dataclasses.replace(cell.serve, readiness_timeout_s=readiness_s))
    return run_startup(
        ReplayDocker(log), cell, "img", arm=None, out_dir=tmp_path, facts=stage_facts(cell, None),
        new_server=_server_on(fake, log), **kw,
    )  # fmt: skip


def test_startup_passes_on_a_real_cpu_server_log_and_an_answering_server(real_matrix: Matrix, tmp_path: Path) -> None:
    with FakeVllm() as fake:
        result = _startup(real_matrix, tmp_path, fake, CPU_LOG)
    checks = {c.name: c for c in result.checks}
    assert result.status in (Status.PASS, Status.WARN), [(c.name, c.status, c.message) for c in result.checks]
    assert checks["readiness"].status is Status.PASS and checks["completion"].status is Status.PASS
    assert fake.completion_requests, "the stage asked for one completion"


def test_startup_fails_on_a_dead_engine_and_on_a_fatal_log_line(real_matrix: Matrix, tmp_path: Path) -> None:
    with FakeVllm(dead=True) as fake:
        dead = _startup(real_matrix, tmp_path / "dead", fake, CPU_LOG, readiness_s=1.0)
    assert dead.status is Status.FAIL
    assert next(c for c in dead.checks if c.name == "readiness").message.startswith("not ready after 1s")
    fatal = CPU_LOG + "\ntorch.AcceleratorError: CUDA error: an illegal memory access was encountered\n"
    with FakeVllm() as fake:
        failed = _startup(real_matrix, tmp_path / "fatal", fake, fatal)
    assert failed.status is Status.FAIL
    assert any("illegal memory access" in (c.message + json.dumps(c.evidence)) for c in failed.checks)


def test_startup_keeps_a_passing_server_for_the_next_stage(real_matrix: Matrix, tmp_path: Path) -> None:
    share = SharedServer()
    with FakeVllm() as fake:
        _startup(real_matrix, tmp_path, fake, CPU_LOG, share=share, keep=True)
        kept = share.peek()
        assert kept is not None and kept.base_url == fake.url
        share.close()
    assert share.peek() is None


class _LaggingLog(ReplayDocker):
    """A server whose log follower is `lag_s` behind from the engine's ready line on, as a
    `docker logs -f` or a polled file tail on a busy host is: /health already answers."""

    def __init__(self, log: str, lag_s: float) -> None:
        super().__init__(log)
        self.lag_s = lag_s

    def follow_logs(self, name: str, on_line: Any, *, timeout: float) -> None:
        for line in self.log.splitlines():
            if re.search(DRIVERS["vllm"].ready_line, line):
                time.sleep(self.lag_s)
            on_line(line)


def test_a_kept_servers_log_is_judged_only_once_it_holds_the_engines_ready_line(
    real_matrix: Matrix, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Seen in CI (host runtime): ready at 45 s, and `expect:startup-complete` FAILed on a log the
    # follower had not yet written the line to. A lag past the grace still fails: the check is real.
    monkeypatch.setattr(server_module, "READY_LINE_GRACE_S", 1.0)
    checks = {lag_s: _kept_startup_checks(real_matrix, tmp_path / str(lag_s), lag_s) for lag_s in (0.5, 2.0)}
    assert checks[0.5]["expect:startup-complete"] is Status.PASS, checks[0.5]
    assert checks[2.0]["expect:startup-complete"] is Status.FAIL, checks[2.0]


def _kept_startup_checks(real_matrix: Matrix, out: Path, lag_s: float) -> dict[str, Status]:
    from verify.stages.runner import stage_facts

    cell = real_matrix.cell("cpu-tiny")
    lagging = _LaggingLog(CPU_LOG, lag_s)
    share = SharedServer()
    with FakeVllm() as fake:
        port = int(fake.url.rsplit(":", 1)[1])
        result = run_startup(
            lagging, cell, "img", arm=None, out_dir=out, facts=stage_facts(cell, None), share=share, keep=True,
            new_server=lambda _, c, image, **kw: Server(lagging, c, image, port=port, **kw),
        )  # fmt: skip
        share.close()
    return {c.name: c.status for c in result.checks}


# -- soak over stand-in servers ---------------------------------------------------------------------


def test_soak_alternates_two_arms_and_compares_them(real_matrix: Matrix, tmp_path: Path) -> None:
    other = Arm(name="other", description="an arm of other env", env=(("VLLM_LOGGING_LEVEL", "DEBUG"),), args=())
    cell = dataclasses.replace(real_matrix.cell("cpu-tiny"), arms=(other,))
    spec = LoadSpec(questions=4, concurrency=2, max_tokens=4, determinism_prompts=1, determinism_repeats=1)
    with FakeVllm() as fake:
        document = soak(
            ReplayDocker(CPU_LOG), cell, "img", arms=["default", "other"], spec=spec, duration_s=0.1, slice_s=1.0,
            out_dir=tmp_path, new_server=_server_on(fake, CPU_LOG),
        )  # fmt: skip
    assert set(document["arms"]) == {"default", "other"} and document["config"]["rounds"] == 1
    for tally in document["arms"].values():
        assert tally["questions"] > 0 and tally["clean"] == tally["questions"] and tally["faults"] == 0
    assert document["comparison"]["a"] == "default" and document["comparison"]["b"] == "other"
    written = json.loads((tmp_path / "soak.json").read_text())
    assert written["comparison"] == json.loads(json.dumps(document["comparison"]))


def test_soak_counts_a_server_that_never_became_ready_as_a_fault(real_matrix: Matrix, tmp_path: Path) -> None:
    cell = real_matrix.cell("cpu-tiny")
    spec = LoadSpec(questions=2, concurrency=1, max_tokens=4, determinism_prompts=1, determinism_repeats=1)
    fatal = CPU_LOG + "\ntorch.AcceleratorError: CUDA error: an illegal memory access was encountered\n"
    with FakeVllm(dead=True) as fake:
        document = soak(
            ReplayDocker(fatal), cell, "img", arms=["default"], spec=spec, duration_s=0.1, slice_s=1.0,
            out_dir=tmp_path, new_server=_server_on(fake, fatal),
        )  # fmt: skip
    tally, rounds = document["arms"]["default"], document["config"]["rounds"]
    assert rounds >= 1 and tally["faults"] == tally["questions"] == rounds, "each failed start counts one fault"
    assert {e["type"] for e in tally["events"]} == {"SERVER_START_FAILED"} and tally["clean"] == 0


# -- what a pass says it is made of --------------------------------------------------------------------


def _stage(name: str, status: Status, message: str = "ok") -> StageResult:
    return StageResult.of(name, [CheckResult(name=name, status=status, message=message)], 1.0)


def test_all_stages_passed_only_when_every_stage_ran_and_none_was_skipped() -> None:
    from pipeline.result import evaluate

    every = [_stage(s, Status.PASS) for s in ("imports", "startup", "autotune", "load")]
    assert evaluate(None, every).summary == "all stages passed"
    skipped = [*every[:2], _stage("autotune", Status.SKIP, "CPU cell: no autotuning"), every[3]]
    summary = evaluate(None, skipped).summary
    assert "all stages passed" not in summary
    assert summary == "passed: imports, startup, load; skipped: autotune (CPU cell: no autotuning)"
    partial = evaluate(None, every[:1]).summary
    assert partial == "passed: imports; not run: startup, autotune, load"
