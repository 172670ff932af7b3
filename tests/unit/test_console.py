"""The terminal a person reads (pipeline.console): pure formatting, then the one writer on a fake
terminal and a fake CI log, with a clock the test moves."""

from __future__ import annotations

import io
import threading
from pathlib import Path

import pytest

from pipeline.build.image import BuildSteps
from pipeline.console import Console, clip, done_line, elapsed, failure_lines, phase_line, tool_line


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(("seconds", "text"), [(0, "0s"), (9.7, "9s"), (65, "1m05s"), (3725, "1h02m"), (-3, "0s")])
def test_elapsed_is_short(seconds: float, text: str) -> None:
    assert elapsed(seconds) == text


def test_clip_makes_one_printable_line_of_a_tool_s_output() -> None:
    assert clip("\x1b[32mOK\x1b[0m  done\tnow", 40) == "OK done now"
    assert clip("10%\r50%\r100% Completed | 1/1\r", 40) == "100% Completed | 1/1", "a \\r progress bar: its last state"
    assert clip("x" * 50, 10) == "x" * 9 + "…" and len(clip("y" * 500, 80)) == 80
    assert "\x07" not in clip("bell\x07here", 40)


def test_the_phase_line_has_name_elapsed_counts_and_the_tool_line_sits_under_it() -> None:
    assert phase_line("build", "cpu-tiny", 65, "step 3/7") == "build cpu-tiny  1m05s  step 3/7"
    assert tool_line("#9 12.3 Collecting vllm") == "  > #9 12.3 Collecting vllm"
    assert done_line("load", "cpu-tiny", 9, "80 clean") == "load cpu-tiny: done in 9s: 80 clean"
    assert done_line("build", "c", 3, "exit 1", ok=False) == "build c: FAILED in 3s: exit 1"


def test_a_failure_shows_the_tool_s_last_lines_and_the_file_with_the_rest() -> None:
    lines = failure_lines("build", "c", [f"line {i}" for i in range(30)], Path("out/build-1.log"))
    assert lines[0] == "build c: the last 30 lines of its output:" and lines[1] == "  | line 0"
    assert lines[-1] == "build c: the whole output is in out/build-1.log" and len(lines) == 32
    assert failure_lines("x", "c", [], None) == ["x c: its tool printed nothing"]


def test_not_a_terminal_a_phase_prints_at_most_every_so_often_and_tool_lines_only_go_to_files() -> None:
    out, clock = io.StringIO(), Clock()
    writer = Console(out, tty=False, every_s=20, clock=clock)
    with writer.phase("build", "cpu-tiny", log=Path("b.log")) as phase:
        for second in range(100):
            clock.now = second
            phase.tool(f"#9 {second}.0 output line {second}")
            phase.update(f"step {1 + second // 20}/7")
    lines = out.getvalue().splitlines()
    assert len(lines) == 4 + 1, lines  # at 20, 40, 60 and 80 s, and the line it ends with
    assert lines[0] == "build cpu-tiny  20s  step 1/7  | #9 20.0 output line 20"
    assert lines[-1] == "build cpu-tiny: done in 1m39s"
    assert not any("output line 3 " in line for line in lines)


def test_on_a_terminal_the_live_block_is_rewritten_in_place_and_other_lines_go_above_it() -> None:
    out, clock = io.StringIO(), Clock()
    writer = Console(out, tty=True, clock=clock, width=80)
    phase = writer.phase("load", "cpu-tiny")
    clock.now = 1
    phase.update("questions 4 done, 4 clean")
    writer.say("cpu-tiny: stage imports: PASS")
    clock.now = 2
    phase.update("questions 9 done, 9 clean")
    phase.done("questions 9 done")
    text = out.getvalue()
    assert "\x1b[J" in text, "the block is cleared before it is drawn again"
    # What the screen shows in the end: the say() line above, then the phase's last line.
    screen = _render(text)
    assert screen == ["cpu-tiny: stage imports: PASS", "load cpu-tiny: done in 2s: questions 9 done"]


def test_with_verbose_server_lines_stream_above_the_load_line_and_never_replace_it() -> None:
    out, clock = io.StringIO(), Clock()
    writer = Console(out, tty=True, verbose=True, clock=clock, width=80)
    load = writer.phase("load", "cpu-tiny")
    load.update("questions 3 done, 3 clean")
    writer.feed("server", "cpu-tiny", "INFO: 127.0.0.1 - POST /v1/chat/completions 200")  # no server phase live
    screen = _render(out.getvalue())
    assert screen[-2] == "[server cpu-tiny] INFO: 127.0.0.1 - POST /v1/chat/completions 200"
    assert screen[-1].startswith("load cpu-tiny  0s  questions 3 done"), "the load line is redrawn below"


def test_server_lines_feed_the_live_server_phase_and_are_dropped_from_the_terminal_once_it_ended() -> None:
    out = io.StringIO()
    writer = Console(out, tty=False, every_s=0)
    with writer.phase("server", "c", log=Path("server.log")) as phase:
        writer.feed("server", "c", "Application startup complete.")
        assert phase.last == "Application startup complete." and phase.lines == 1
    writer.feed("server", "c", "INFO: GET /metrics 200")  # the load runs: into server.log only
    assert "GET /metrics" not in out.getvalue()


def test_a_failing_phase_prints_the_tail_and_marks_the_error_so_the_cli_does_not_repeat_it() -> None:
    out = io.StringIO()
    writer = Console(out, tty=False)

    class CommandFailedLike(Exception):
        output_tail = "..."

    error = CommandFailedLike("command failed with exit code 1: docker build\nlast line")
    with pytest.raises(CommandFailedLike), writer.phase("build", "c", log=Path("build-1.log")) as phase:
        for i in range(40):
            phase.tool(f"line {i}")
        raise error
    lines = out.getvalue().splitlines()
    assert lines[0] == "build c: FAILED in 0s: command failed with exit code 1: docker build"
    assert lines[2] == "  | line 10" and lines[-2] == "  | line 39", "the last 30 lines"
    assert lines[-1] == "build c: the whole output is in build-1.log"
    assert getattr(error, "tail_shown", False) is True


def test_the_writer_is_safe_from_two_threads() -> None:
    out = io.StringIO()
    writer = Console(out, tty=True, width=60)
    phase = writer.phase("server", "c")
    threads = [threading.Thread(target=lambda: [phase.tool("x" * 30) for _ in range(200)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    phase.done()
    assert phase.lines == 800 and _render(out.getvalue()) == ["server c: done in 0s"]


def test_buildkit_steps_are_counted_for_the_build_line() -> None:
    steps = BuildSteps()
    assert steps.counts() == "preparing"
    assert steps.feed("#1 [internal] load build definition from Dockerfile") is False
    assert steps.feed("#4 [1/7] FROM docker.io/stackproof/base-debian-bookworm:6692") is True
    assert steps.feed("#4 CACHED") is True
    assert steps.feed("#7 [stage-1 3/7] RUN --mount=type=secret,id=index-pypi pip install") is True
    assert steps.feed("#7 12.31 Collecting vllm==0.28.0") is False
    assert steps.counts() == "step 3/7, 1 cached"


def _render(text: str) -> list[str]:
    """The screen a terminal would show for `text`: \\r, cursor-up and clear-to-end applied."""
    screen: list[str] = [""]
    row = 0
    i = 0
    while i < len(text):
        if text.startswith("\x1b[1A", i):
            row = max(0, row - 1)
            i += 4
        elif text.startswith("\x1b[J", i):
            screen[row] = ""
            del screen[row + 1 :]
            i += 3
        elif text[i] == "\r":
            screen[row] = ""
            i += 1
        elif text[i] == "\n":
            row += 1
            if row == len(screen):
                screen.append("")
            i += 1
        else:
            screen[row] += text[i]
            i += 1
    return [line for line in screen if line]
