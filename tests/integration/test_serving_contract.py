"""One contract every serving-engine driver passes against a real server of its engine.

Start, ready (the health path, and the driver's ready line in the log), the model list, a streamed
chat with usage, the usage equal to the driver's counters' deltas, greedy completions with logprobs
that repeat exactly, the status probes, the driver's engine processes inside the container, stop,
and nothing left running. The servers are real: vLLM 0.28.0 CPU in the cpu-tiny image built by the
pipeline; SGLang 0.5.18 on CPU in the sglang-cpu-tiny image (its kernel package stood in: the
contract is the driver's, not the kernels'). `SERVERS` below says which.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.docker.client import Docker
from pipeline.matrix.model import Cell
from tests.integration.conftest import containers, serving_cell
from verify.load.progress import parse_metrics
from verify.serving import ServingDriver, driver_for
from verify.serving.openai import RequestRecord, ServerAPI, Timeouts
from verify.stages.server import RUN_LABEL, Server

pytestmark = pytest.mark.integration

# Which real server each engine's contract runs against: the cell and the session fixture that builds it.
SERVERS = {"vllm": ("cpu-tiny", "cpu_tiny"), "sglang": ("sglang-cpu-tiny", "sglang_cpu_tiny")}

_FIND_TITLES = r"""
import os, sys
prefixes = tuple(sys.argv[1].split(","))
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        if cmdline.startswith(prefixes):
            print(pid, cmdline[:80])
"""


@pytest.fixture(params=sorted(SERVERS), scope="module")
def served(
    request: pytest.FixtureRequest, docker: Docker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Server, Cell]]:
    cell_id, image_fixture = SERVERS[request.param]
    image = request.getfixturevalue(image_fixture)
    cell = serving_cell(cell_id)
    server = Server(docker, cell, image, out_dir=tmp_path_factory.mktemp(f"contract-{request.param}"))
    with server:
        server.wait_ready()
        yield server, cell
    assert containers(f"{RUN_LABEL}={server.run_id}") == [], "the server container is gone after stop"


def _chat_and_counters(server: Server, driver: ServingDriver) -> tuple[RequestRecord, float, float, float, float]:
    names = driver.metric_names(None)

    async def main() -> tuple[RequestRecord, float, float, float, float]:
        async with ServerAPI(server.base_url, driver, timeout=60) as api:
            model = await api.model_id()
            before, _ = await api.metrics_text()
            record = RequestRecord(question_id="contract", turn=0)
            await api.stream_chat(
                model=model,
                messages=[{"role": "user", "content": "Say something about the sea."}],
                max_tokens=12,
                ignore_eos=True,
                timeouts=Timeouts(ttft=60, chunk=30),
                record=record,
                clock=time.monotonic,
                on_chunk=lambda: None,
            )
            after = None
            for _ in range(10):  # the counters catch up with the answer a moment later
                after, _ = await api.metrics_text()
                if after and parse_metrics(after, names).generated - parse_metrics(before or "", names).generated >= 12:
                    break
                await asyncio.sleep(0.5)
            assert before is not None and after is not None, "the metrics path answers"
            b, a = parse_metrics(before, names), parse_metrics(after, names)
            return record, b.generated, a.generated, b.prompt, a.prompt

    return asyncio.run(main())


def test_ready_means_the_health_path_and_the_drivers_ready_line(served: tuple[Server, Cell]) -> None:
    server, _ = served
    assert re.search(server.driver.ready_line, server.log_path.read_text()), "the driver's ready line is in the log"


def test_a_streamed_chat_is_counted_by_the_drivers_counters(served: tuple[Server, Cell]) -> None:
    server, _ = served
    record, gen_before, gen_after, prompt_before, prompt_after = _chat_and_counters(server, server.driver)
    assert record.ok, record.error
    assert record.output_tokens == 12 and record.finish_reason == "length" and record.ttft is not None
    assert gen_after - gen_before == record.output_tokens
    assert prompt_after - prompt_before == record.prompt_tokens


def test_greedy_completions_repeat_with_logprobs(served: tuple[Server, Cell]) -> None:
    from verify.load.determinism import request_sample

    server, _ = served

    async def main() -> list[tuple[str, ...]]:
        async with ServerAPI(server.base_url, server.driver, timeout=60) as api:
            model = await api.model_id()
            samples = [
                (await request_sample(api, model=model, prompt=0, phase="A", max_tokens=8, timeout=60))[0]
                for _ in range(2)
            ]
        assert all(s.error is None for s in samples), [s.error for s in samples]
        assert all(len(s.top2_gaps) == 8 and all(g is not None for g in s.top2_gaps) for s in samples)
        return [s.tokens for s in samples]

    first, second = asyncio.run(main())
    assert len(first) == 8 and first == second


def test_the_status_probe_and_the_engine_processes(served: tuple[Server, Cell]) -> None:
    server, _ = served
    driver = server.driver

    async def main() -> tuple[int | None, int | None, int | None]:
        async with ServerAPI(server.base_url, driver) as api:
            status = await api.probe()
        return status.health, status.models, status.metrics

    assert asyncio.run(main()) == (200, 200, 200)
    found = server.runtime.exec(server.name, ["python3", "-c", _FIND_TITLES, ",".join(driver.process_titles)])
    assert found.returncode == 0, found.stderr
    titles = [line.split(" ", 1)[1] for line in found.stdout.splitlines()]
    assert any(t.startswith(driver.engine_process) for t in titles), titles


def test_the_contract_runs_on_the_cells_own_driver(served: tuple[Server, Cell]) -> None:
    server, cell = served
    assert server.driver is driver_for(cell.serve)
    assert Path(server.log_path).is_file()
