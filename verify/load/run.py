"""A load run against one running server: questions, the watchdog, determinism, and the summary.

`run_load` is the whole of it: find the model, run determinism phase A alone, take a /metrics
baseline, then run the questions (closed loop, or open loop with gamma arrivals) with the watchdog
scraping beside them and phase B of determinism mixed in, and end with a final scrape for the
counter deltas. It writes requests.jsonl and scrapes.jsonl as it goes and returns a `LoadOutcome`;
turning that into checks is `judge_load`'s job. The run ends on its bounds (question count,
duration), on a watchdog verdict, on too many errors, or on Ctrl-C, and every request in flight is
cancelled and recorded when it does.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

from pipeline.console import console
from pipeline.errors import CheckFailed, InfraError
from pipeline.matrix.model import LoadSpec
from verify.load.compare import GREEDY_FILE, write_greedy
from verify.load.death import engine_death
from verify.load.determinism import Sample, request_sample
from verify.load.outcome import Live, LoadOutcome, LoadTarget
from verify.load.progress import Probe, Progress, StallVerdict, Tracker
from verify.load.stats import clean_run_luck
from verify.load.summary import judge_load, summarise
from verify.load.watchdog import Watchdog, scrape
from verify.load.workload import Question, arrival_gaps, builtin_pool, cycle, read_questions
from verify.serving import MetricNames
from verify.serving.openai import ErrorClass, ModelNotNamed, RequestRecord, ServerAPI, Timeouts

# LoadTarget, judge_load and summarise live in outcome.py and summary.py; named here for the commands that
# import them from the run.
__all__ = ["LoadTarget", "grace_s", "judge_load", "run_load", "summarise", "time_budget"]

# Failures that say the server, not the request, is in trouble: the watchdog probes at once.
_SERVER_CLASSES = (ErrorClass.CONNECT, ErrorClass.HTTP_5XX, ErrorClass.ENGINE_DEAD, ErrorClass.STREAM_TRUNCATED)


def _questions(spec: LoadSpec) -> tuple[Question, ...]:
    if spec.questions_file:
        return read_questions(Path(spec.questions_file))
    return builtin_pool(spec.seed, spec.questions)


class _LoadRun:
    """One load run, as named steps over explicit state: greedy phase A alone, the baseline scrape,
    the workers (closed loop, or open loop at a rate) beside greedy phase B and the watchdog, then the
    conclusion. The state the steps share is the attributes set here; `Live` is what the watchdog
    and the progress line read while the run goes on."""

    def __init__(self, target: LoadTarget, spec: LoadSpec, out_dir: Path, *, soak: bool) -> None:
        self.target, self.spec, self.out_dir, self.soak = target, spec, out_dir, soak
        self.origin = time.monotonic()
        self.pool = _questions(spec)
        self.live = Live()
        self.stop = asyncio.Event()
        self.timeouts = Timeouts(ttft=spec.ttft_timeout_s, chunk=spec.chunk_timeout_s)
        self.records: list[RequestRecord] = []
        self.questions: dict[str, bool | None] = {}  # id -> clean (True), faulted (False), incomplete (None)
        # Greedy determinism: every prompt, `determinism_repeats` times, per phase.
        self.prompts = [p for _ in range(spec.determinism_repeats) for p in range(spec.determinism_prompts)]
        self.phase_b: list[Sample] = []
        self.b_tokens = (0, 0)  # (prompt, completion) tokens of phase B
        self.load_tasks: list[asyncio.Task[None]] = []
        self.past_grace = False  # --duration and its grace are over: what is still in flight is an overrun
        self.source: Iterator[Question] = cycle(self.pool) if soak else iter(self.pool)
        self.requests_path, self.scrapes_path = out_dir / "requests.jsonl", out_dir / "scrapes.jsonl"
        self.names = target.driver.metric_names(target.engine_version)

    def clock(self) -> float:
        return time.monotonic() - self.origin

    async def run(self) -> LoadOutcome:
        spec, target = self.spec, self.target
        self.out_dir.mkdir(parents=True, exist_ok=True)
        # The client's own read timeout is a backstop only: the per-chunk waits are bounded in stream_chat.
        backstop = max(self.timeouts.ttft, self.timeouts.chunk) + 5
        async with (
            ServerAPI(
                target.base_url, target.driver, timeout=backstop, max_connections=spec.concurrency + 4
            ) as self.load_api,
            ServerAPI(target.base_url, target.driver, timeout=10) as self.probe_api,
        ):
            try:
                self.model = await self.probe_api.model_id()
            except ModelNotNamed as exc:
                raise CheckFailed(str(exc)) from exc
            with self.requests_path.open("w") as self.requests_log, self.scrapes_path.open("w") as scrapes_log:
                phase_a = [(await self.greedy(prompt, "A"))[0] for prompt in self.prompts]  # alone, before any load
                before, _ = await scrape(self.probe_api, self.names)
                self.load_started = self.clock()
                self.deadline = self.load_started + spec.duration_s
                self.tracker = Tracker(
                    stall_seconds=spec.stall_seconds, started_at=self.load_started, warmup_s=spec.warmup_s
                )
                self.watchdog = self._watchdog(scrapes_log)
                results = await self._load()
                crashed = await self._conclude(results)
                dead = await self._death()
                fatal = self.watchdog.fatal
                after = None
                if fatal is None:
                    after = await _settled_scrape(self.probe_api, self.names, before, self.records, self.b_tokens[1])
                seconds = self.clock() - self.load_started
        if dead:  # the failed requests' class changed after they were written: the file says so too
            _rewrite(self.requests_path, self.records)
        console().say(f"{target.label}: load ended after {seconds:.1f}s: {self.live.stop_reason}")
        # The greedy answers alone, per prompt, for `stackproof compare` across cells and arms.
        greedy_path = write_greedy(
            self.out_dir / GREEDY_FILE, model=self.model, max_tokens=spec.determinism_max_tokens, label=target.label,
            samples=phase_a,
        )  # fmt: skip
        return LoadOutcome(
            config=_config(spec, self.soak),
            model=self.model,
            records=self.records,
            questions=self.questions,
            events=self.watchdog.events,
            determinism_a=phase_a,
            determinism_b=self.phase_b,
            before=before,
            after=after,
            seconds=seconds,
            stop_reason=self.live.stop_reason or "",
            determinism_tokens=self.b_tokens,
            scrapes=len(self.watchdog.scrapes),
            files={"requests": str(self.requests_path), "scrapes": str(self.scrapes_path), "greedy": str(greedy_path)},
            crashed=crashed,
            counters=(self.names.generated, self.names.prompt),
            invariance_env=target.driver.batch_invariant_env,
        )

    def _watchdog(self, series: TextIO) -> Watchdog:
        target = self.target
        return Watchdog(
            api=self.probe_api,
            names=self.names,
            tracker=self.tracker,
            clock=self.clock,
            in_flight=lambda: self.live.in_flight,
            stop=self.stop,
            interval_s=self.spec.scrape_interval_s,
            series=series,
            server_alive=target.server_alive,
            last_log_lines=target.last_log_lines,
            check_gpu=target.gpu,
            on_stall=target.on_stall,
        )

    # -- the load and what runs beside it ----------------------------------------------------------

    async def _load(self) -> list[BaseException | None]:
        """Run the workers, greedy phase B, the watchdog and the progress line until the workers end
        or something stops the run; what each worker ended with (an exception, or None)."""
        spec = self.spec
        # At most one worker per question: 10**6 workers for 5 questions cost a gigabyte (issue 16).
        workers_wanted = spec.concurrency if self.soak else min(spec.concurrency, len(self.pool))
        self.load_tasks = (
            [asyncio.create_task(self.open_loop())]
            if spec.rate
            else [asyncio.create_task(self.closed_loop_worker()) for _ in range(workers_wanted)]
        )
        workers = [*self.load_tasks, asyncio.create_task(self.determinism_under_load())]
        watch = asyncio.create_task(self.watchdog.run())
        reporter = asyncio.create_task(
            _report_progress(self.target, self.live, self.tracker, self.clock, spec, self.stop)
        )
        stopper = asyncio.create_task(self.stop.wait())
        try:
            pending: set[asyncio.Task[Any]] = set(workers)
            while pending:
                left = self.deadline + grace_s(spec) - self.clock()
                if left <= 0:
                    self._past_grace()
                    break
                done, pending = await asyncio.wait(
                    pending | {stopper}, timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
                pending.discard(stopper)
                if stopper in done:
                    break
        finally:
            for task in workers:
                task.cancel()
            results = await asyncio.gather(*workers, return_exceptions=True)
            self.stop.set()
            for helper in (watch, reporter, stopper):
                helper.cancel()
            await asyncio.gather(watch, reporter, stopper, return_exceptions=True)
        return results

    def _past_grace(self) -> None:
        """--duration and its grace are over with requests still in flight: they are cancelled (ABORTED),
        their questions incomplete, and the stop reason says so (a server whose streams do not end)."""
        live = self.live
        live.stop_reason = (
            f"--duration {self.spec.duration_s:g}s and its grace of {grace_s(self.spec):g}s passed with "
            f"{live.in_flight} requests still streaming: cancelled (a server whose answers do not end)"
        )
        self.past_grace = True
        self.stop.set()

    async def _conclude(self, results: list[BaseException | None]) -> str | None:
        """Why the run stopped (`live.stop_reason`), and the worker crash that makes it prove nothing."""
        live, watchdog = self.live, self.watchdog
        # A worker that raised did not finish its questions: say so, never "all questions answered".
        errors = [r for r in results if isinstance(r, Exception) and not isinstance(r, asyncio.CancelledError)]
        crashed = f"load worker failed: {type(errors[0]).__name__}: {str(errors[0])[:300]}" if errors else None
        if crashed:
            live.stop_reason = crashed
        if live.requests_failed and watchdog.fatal is None:
            await watchdog.final_check()
        fatal = watchdog.fatal
        if fatal is not None:
            live.stop_reason = f"{fatal.type}: {fatal.reason}"
            # The questions in flight when the server failed are what a user would have seen fail.
            self.questions.update({qid: False for qid, clean in self.questions.items() if clean is None})
        elif live.stop_reason is None:
            live.stop_reason = "duration reached" if self.clock() >= self.deadline else "all questions answered"
        return crashed

    async def _death(self) -> bool:
        """Whether the watchdog's ENGINE_DEAD verdict is the engine's death as the server showed it
        (a server error, then /health 503 or refused, or the server gone: verify/load/death.py); its
        event then carries how, the bodies and the log's cause, and the failed requests are its."""
        fatal = self.watchdog.fatal
        if fatal is None or fatal.type is not StallVerdict.ENGINE_DEAD:
            return False
        target = self.target
        gone = await asyncio.to_thread(target.server_alive) if target.server_alive is not None else None
        death = engine_death(
            self.records,
            Probe(**fatal.api),
            gone=gone,
            log_lines=[*fatal.last_log_lines, *target.last_log_lines()],
            driver=target.driver,
            version=target.engine_version,
        )
        if death is None:
            return False
        cause = f"; the log's cause: {death.cause}" if death.cause else "; the log names no cause"
        reason = f"{fatal.reason}; the engine died ({death.shown_by}){cause}"
        index = self.watchdog.events.index(fatal)
        self.watchdog.events[index] = dataclasses.replace(fatal, reason=reason, death=death.to_json())
        self.live.stop_reason = f"{fatal.type}: {reason}"
        return True

    async def greedy(self, prompt: int, phase: str) -> tuple[Sample, int, int]:
        return await request_sample(
            self.load_api,
            model=self.model,
            prompt=prompt,
            phase=phase,
            max_tokens=self.spec.determinism_max_tokens,
            timeout=self.spec.ttft_timeout_s,
        )

    def keep(self, record: RequestRecord) -> None:
        live, spec = self.live, self.spec
        self.records.append(record)
        self.requests_log.write(json.dumps(record.to_json()) + "\n")
        if record.ok:
            live.output_tokens += record.output_tokens
        elif record.error_class is not ErrorClass.ABORTED:
            live.requests_failed += 1
            if record.error_class in _SERVER_CLASSES:
                self.watchdog.probe_requested = True
            if live.requests_failed >= spec.max_errors and not self.stop.is_set():
                live.stop_reason = f"{live.requests_failed} failed requests (max_errors {spec.max_errors})"
                self.stop.set()

    async def ask(self, question: Question) -> None:
        live = self.live
        self.questions[question.id] = None
        messages: list[dict[str, str]] = []
        for turn, text in enumerate(question.turns):
            messages.append({"role": "user", "content": text})
            record = RequestRecord(question_id=question.id, turn=turn)
            live.in_flight += 1
            try:
                await self.load_api.stream_chat(
                    model=self.model,
                    messages=messages,
                    max_tokens=self.spec.max_tokens,
                    ignore_eos=self.spec.ignore_eos,
                    timeouts=self.timeouts,
                    record=record,
                    clock=self.clock,
                    on_chunk=lambda: self.tracker.chunk(self.clock()),
                )
            except asyncio.CancelledError:
                if self.past_grace:  # the stream outlived --duration and its grace: the server's fault
                    record.error_class = ErrorClass.OVERRUN
                    record.error = f"still streaming {grace_s(self.spec):g}s past --duration: cancelled"
                    self.questions[question.id] = False
                    live.questions_done += 1
                raise
            finally:
                live.in_flight -= 1
                self.keep(record)
            if not record.ok:
                self.questions[question.id] = False
                live.questions_done += 1
                return
            messages.append({"role": "assistant", "content": record.text})
        self.questions[question.id] = True
        live.questions_done += 1
        live.questions_clean += 1

    def next_question(self) -> Question | None:
        if self.stop.is_set() or self.clock() >= self.deadline:
            return None
        return next(self.source, None)

    async def closed_loop_worker(self) -> None:
        while (question := self.next_question()) is not None:
            await self.ask(question)

    def gaps(self) -> Iterator[float]:
        """The open loop's arrival gaps; a soak outlasts one pass: each pass draws its own."""
        spec = self.spec
        for pass_no in itertools.count():
            yield from arrival_gaps(
                len(self.pool), rate=spec.rate or 1.0, burstiness=spec.burstiness, seed=spec.seed + pass_no
            )
            if not self.soak:
                return

    async def open_loop(self) -> None:
        slots = asyncio.Semaphore(self.spec.concurrency)
        running: set[asyncio.Task[None]] = set()

        async def one(question: Question) -> None:
            try:
                await self.ask(question)
            finally:
                slots.release()

        try:
            for gap in self.gaps():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), gap)
                question = self.next_question()
                if question is None:
                    break
                await slots.acquire()
                task = asyncio.create_task(one(question))
                running.add(task)
                task.add_done_callback(running.discard)
            await asyncio.gather(*running)
        finally:
            for task in running:
                task.cancel()

    async def determinism_under_load(self) -> None:
        live, stop = self.live, self.stop
        # Wait until the load has filled its slots, so these requests share batches with it.
        while live.in_flight < min(self.spec.concurrency, 2) and not stop.is_set():
            if all(task.done() for task in self.load_tasks):
                break  # the load ended first: the samples run alone, still compared
            await asyncio.sleep(0.05)
        for prompt in self.prompts:
            if stop.is_set():
                return
            live.in_flight += 1
            try:
                sample, p_tokens, c_tokens = await self.greedy(prompt, "B")
            finally:
                live.in_flight -= 1
            self.tracker.chunk(self.clock())
            self.phase_b.append(sample)
            self.b_tokens = (self.b_tokens[0] + p_tokens, self.b_tokens[1] + c_tokens)


async def _settled_scrape(
    api: ServerAPI, names: MetricNames, before: Progress | None, records: list[RequestRecord], extra_tokens: int
) -> Progress | None:
    """The final /metrics, once the counters have caught up with the last answers (a few tries)."""
    expected = sum(r.output_tokens for r in records if r.ok) + extra_tokens
    after: Progress | None = None
    for _ in range(6):
        after, _ = await scrape(api, names)
        if after is None or before is None or after.generated - before.generated >= expected:
            return after
        await asyncio.sleep(0.5)
    return after


async def _report_progress(
    target: LoadTarget, live: Live, tracker: Tracker, clock: Callable[[], float], spec: LoadSpec, stop: asyncio.Event
) -> None:
    """The load's phase line, renewed every 2 s (pipeline.console rewrites it on a terminal and
    prints it every EVERY_S elsewhere): questions done and clean, in flight, progress age, tok/s, luck."""
    last_tokens, last_at = 0, clock()
    phase = console().phase("load", target.label)

    def counts() -> tuple[int, int, str]:
        done, clean = live.questions_done + target.prior[0], live.questions_clean + target.prior[1]
        # Closed form, no scipy: an import inside the event loop stalls every stream (clean_run_luck).
        luck = f"{clean_run_luck(spec.baseline_rate, done):.0%}" if done and done == clean else "-"
        return done, clean, luck

    try:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 2.0)
            now = clock()
            rate = (live.output_tokens - last_tokens) / max(now - last_at, 1e-6)
            last_tokens, last_at = live.output_tokens, now
            done, clean, luck = counts()
            phase.update(
                f"questions {done} done, {clean} clean  in flight {live.in_flight}  "
                f"progress {tracker.progress_age(now):4.1f}s ago  {rate:6.0f} tok/s  luck {luck}"
            )
    finally:  # the run cancels this task when it ends: the verdict is the stage's, not the line's
        done, clean, luck = counts()
        phase.done(f"questions {done} done, {clean} clean, {live.output_tokens} output tokens, luck {luck}")


def _rewrite(path: Path, records: list[RequestRecord]) -> None:
    """requests.jsonl again from `records`, atomically (a reader never sees half a file)."""
    partial = path.with_name(path.name + ".partial")
    with partial.open("w") as out:
        out.writelines(json.dumps(r.to_json()) + "\n" for r in records)
    os.replace(partial, path)


def _config(spec: LoadSpec, soak: bool) -> dict[str, Any]:
    return {"mode": "soak" if soak else "short", **asdict(spec)}


def run_load(target: LoadTarget, spec: LoadSpec, out_dir: Path, *, soak: bool = False) -> LoadOutcome:
    """Run the load against `target` (blocking); Ctrl-C cancels every request in flight.

    The run has a hard wall-clock budget it cannot exceed, whatever the server does: the duration,
    every determinism request's time-to-first-token bound, and a margin for the final scrapes."""
    budget = time_budget(spec)

    async def bounded() -> LoadOutcome:
        try:
            async with asyncio.timeout(budget):
                return await _LoadRun(target, spec, out_dir, soak=soak).run()
        except TimeoutError:
            raise InfraError(
                f"{target.label}: the load run passed its {budget:.0f}s budget (duration, determinism, "
                "final scrapes) and was stopped; a stream or the watchdog did not end on its own timeout"
            ) from None

    return asyncio.run(bounded())


def grace_s(spec: LoadSpec) -> float:
    """Seconds past `duration_s` the questions in flight may take to end: one chunk timeout (the
    silence a stream is allowed) plus 10 s. A healthy answer that is streaming at the deadline ends
    within max_tokens x TPOT, well inside it; a stream that goes on is cancelled (issue 27)."""
    return spec.chunk_timeout_s + 10.0


def time_budget(spec: LoadSpec) -> float:
    """Seconds a load run may take at most: new questions stop at `duration_s`, the last ones end
    within ttft + chunk timeouts per turn, each determinism sample within its ttft timeout."""
    determinism = 2 * spec.determinism_prompts * spec.determinism_repeats + 2
    return spec.duration_s + determinism * spec.ttft_timeout_s + 3 * (spec.ttft_timeout_s + spec.chunk_timeout_s) + 120
