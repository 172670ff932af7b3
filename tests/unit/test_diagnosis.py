# ruff: noqa: E501 (realistic log lines are long; wrapping them would change what is matched)
"""The diagnosis both ways on real logs: the class always, an incident only when its preconditions
are shown, facts, the last exception, startup phases, pastes as people paste them, and input that
is not a plain file (stdin, pipes, FIFOs, procfs)."""

from __future__ import annotations

import io
import json
import os
import re
import threading
from pathlib import Path

import pytest
import yaml

from pipeline.errors import MatrixError
from stackproof.cli import main
from tests.unit.test_logscan import CPU_LOG, SAMPLES
from verify.logs.catalog import load_catalog, load_rulesets
from verify.logs.classes import CLASSES_FILE, load_classes
from verify.logs.diagnosis import Fact, diagnose
from verify.logs.logscan import open_log
from verify.logs.logtext import clean_line, message_of, split_records

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "real"
INDEX = yaml.safe_load((REAL / "index.yaml").read_text())["logs"]
REF = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+#\d+$")
# The wrong attributions issue 14 reported (or equivalent real logs): the class, never the incident.
WRONG_ATTRIBUTIONS = {
    "vllm-8177-illegal-memory-access-nccl-watchdog.log": ("illegal-memory-access", "cuda-illegal-memory-access"),
    "vllm-5901-xid-13-a800-dmesg.log": ("xid-13", "nvrm-xid-13"),
    "trtllm-15610-xid-13-b200-mmu-fault.log": ("xid-13", "nvrm-xid-13"),
    "sglang-28019-triton-shared-memory-fused-moe-gb10.log": (
        "triton-out-of-resources",
        "mla-fp8-kv-decode-shared-memory",
    ),
    "sglang-2384-triton-shared-memory-mi300.log": ("triton-out-of-resources", "mla-fp8-kv-decode-shared-memory"),
}
# vLLM 0.28.0's FP8 kernel selection line (kernels/linear/__init__.py L719-725) and the GPU line
# of vLLM's collect-env, as in the real reports (vllm-project/vllm#55571, #54225).
FP8_SELECTED = "(EngineCore pid=24) INFO 11-30 10:00:00 [__init__.py:722] Selected FlashInferFP8ScaledMMLinearKernel for Fp8LinearMethod\n"
SM120_GPU = "GPU 0: NVIDIA RTX PRO 6000 Blackwell Workstation Edition\n"


def read(name: str) -> bytes:
    return (REAL / name).read_bytes()


# -- the corpus, both ways -------------------------------------------------------------------------


def test_corpus_has_enough_real_logs_each_with_its_source() -> None:
    failing = [e for e in INDEX if e["status"] == "failing"]
    clean = [e for e in INDEX if e["status"] == "clean"]
    assert len(failing) >= 40 and len(clean) >= 10
    assert {e["file"] for e in INDEX} == {p.name for p in REAL.glob("*.log")}
    for e in INDEX:
        assert REF.match(e["source"]) and e["why"].strip(), e["file"]
        assert (e["class"] == "none") == (e["status"] == "clean"), e["file"]


@pytest.mark.parametrize("entry", INDEX, ids=[e["file"] for e in INDEX])
def test_real_log_gets_its_class_and_only_a_shown_incident(entry: dict) -> None:
    d = diagnose(read(entry["file"]))
    if entry["status"] == "clean":
        assert (d.verdict, d.primary, d.incident) == ("clean", None, None), d.summary()
    elif entry["class"] == "startup-incomplete":
        # An excerpt that stops mid-startup names no failure: clean, saying completion is not shown.
        assert d.verdict == "clean" and d.primary is None, d.summary()
        assert d.startup.completed is False and d.startup.last_phase == entry["phase"]
        assert d.startup.note == "startup completion not shown in this excerpt" and d.startup.note in d.summary()
    else:
        assert d.verdict == "failed" and d.primary is not None, d.summary()
        assert d.primary.id == entry["class"], d.summary()
        assert (d.incident.id if d.incident else "none") == entry["incident"], d.summary()
        if "phase" in entry:
            assert d.primary.phase == entry["phase"]


@pytest.mark.parametrize("name", sorted(WRONG_ATTRIBUTIONS))
def test_the_wrong_attributions_of_issue_14_stay_classes(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    cls, incident = WRONG_ATTRIBUTIONS[name]
    assert main(["inspect", "log", str(REAL / name), "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["diagnosis"]["class"]["id"] == cls and document["diagnosis"]["incident"] is None
    assert incident not in {m["id"] for m in document["matches"]}
    for hint in document["diagnosis"]["candidates"]:  # at most a candidate, saying what is not shown
        assert hint["id"] == incident and hint["missing"] and hint["text"].startswith("if this is sm120/sm121")


def test_no_class_matches_a_clean_real_log() -> None:
    for entry in (e for e in INDEX if e["status"] == "clean"):
        d = diagnose(read(entry["file"]))
        assert not d.classes and not d.candidates and d.last_exception is None, entry["file"]


# -- incidents: named when shown, a hint when unknown, nothing when contradicted ------------------


def test_seed_incident_is_named_when_the_log_shows_sm12x_and_the_fp8_kernel() -> None:
    text = SM120_GPU + FP8_SELECTED + SAMPLES["cuda-illegal-memory-access"]
    d = diagnose(text.encode())
    assert d.primary is not None and d.primary.id == "illegal-memory-access"
    assert d.incident is not None and d.incident.id == "cuda-illegal-memory-access"
    assert d.incident.refs == ("vllm-project/vllm#55571",) and dict(d.incident.fixed_in) == {
        "flashinfer": "0.6.18.post1"
    }
    assert any(s.startswith("arch=sm120") for s in d.incident.shown_by)
    assert any(s.startswith("fp8_linear=kernel=FlashInferFP8ScaledMMLinearKernel") for s in d.incident.shown_by)


@pytest.mark.parametrize(
    "context",
    [
        "GPU 0: NVIDIA H100 80GB HBM3\n" + FP8_SELECTED,  # Hopper: another cause
        # the fix is installed and in force: cuDNN below 9.23.1 (fixed_if)
        SM120_GPU + FP8_SELECTED + "flashinfer-python       : 0.6.18.post1\nnvidia-cudnn-cu13==9.20.0.48\n",
    ],
)
def test_seed_incident_is_ruled_out_when_the_log_contradicts_it(context: str) -> None:
    d = diagnose((context + SAMPLES["cuda-illegal-memory-access"]).encode())
    assert d.primary is not None and d.primary.id == "illegal-memory-access"
    assert d.incident is None and not d.candidates


def test_the_fix_installed_rules_nothing_out_where_its_condition_fails_or_is_unknown() -> None:
    fixed = SM120_GPU + FP8_SELECTED + "flashinfer-python       : 0.7.4\n"
    # torch 2.14's cuDNN 9.24: FlashInfer's gate is off (cuDNN >= 9.23.1), the incident is named again
    off = diagnose((fixed + "nvidia-cudnn-cu13==9.24.0.43\n" + SAMPLES["cuda-illegal-memory-access"]).encode())
    assert off.incident is not None and off.incident.id == "cuda-illegal-memory-access"
    # cuDNN not shown: a conditional hint that names the condition
    unknown = diagnose((fixed + SAMPLES["cuda-illegal-memory-access"]).encode())
    assert unknown.incident is None
    assert [c.id for c in unknown.candidates] == ["cuda-illegal-memory-access"]
    assert "cudnn is not <9.23.1" in unknown.candidates[0].text


def test_seed_incident_is_named_from_the_cell_for_a_real_log(capsys: pytest.CaptureFixture[str]) -> None:
    log = str(REAL / "vllm-24815-illegal-memory-access-worker-tp1.log")
    assert main(["inspect", "log", log, "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["diagnosis"]["incident"] is None
    # The release cell serves FP8 on SM120 with FlashInfer 0.6.16.post3: the preconditions hold.
    assert main(["inspect", "log", log, "--json", "--cell", "sm120-vllm-0.28.0-release"]) == 1
    incident = json.loads(capsys.readouterr().out)["diagnosis"]["incident"]
    assert incident["id"] == "cuda-illegal-memory-access"
    assert "arch=sm120 (cell sm120-vllm-0.28.0-release)" in incident["shown_by"]
    # The fixed cell carries FlashInfer 0.6.18.post1: the same text is not that incident there.
    assert main(["inspect", "log", log, "--json", "--cell", "sm120-vllm-0.28.0-fi-0.6.18.post1-cu130"]) == 1
    diagnosis = json.loads(capsys.readouterr().out)["diagnosis"]
    assert diagnosis["incident"] is None and diagnosis["class"]["id"] == "illegal-memory-access"


def test_mla_incident_needs_sm12x_fp8_kv_and_mla_shown() -> None:
    line = SAMPLES["mla-fp8-kv-decode-shared-memory"]
    bare = diagnose(line.encode())
    assert bare.primary is not None and bare.primary.id == "triton-out-of-resources" and bare.incident is None
    # Nothing the incident needs is shown, nothing contradicts it: a candidate with all three to check
    # (issue 44; issue 26 said nothing here, and the seed's own pastes went unmentioned).
    assert [c.id for c in bare.candidates] == ["mla-fp8-kv-decode-shared-memory"] and not bare.candidates[0].shown
    assert len(bare.candidates[0].missing) == 3 and any("--cell" in c for c in bare.candidates[0].checks)
    partly = diagnose(("Compute Capability: 12.0\n" + line).encode())
    assert [h.id for h in partly.candidates] == ["mla-fp8-kv-decode-shared-memory"] and partly.incident is None
    assert set(partly.candidates[0].missing) == {"the KV cache is fp8", "the model uses MLA attention"}
    assert partly.candidates[0].shown == ("arch=sm120 (line 1)",)
    shown = (
        "Compute Capability: 12.0\n"
        "(EngineCore pid=24) INFO 11-30 10:00:00 [cuda.py:300] Using TRITON_MLA attention backend.\n"
        "(EngineCore pid=24) INFO 11-30 10:00:00 [core.py:75] Initializing a V1 LLM engine (v0.28.0) with config: kv_cache_dtype=fp8, \n"
    )
    named = diagnose((shown + line).encode())
    assert named.incident is not None and named.incident.id == "mla-fp8-kv-decode-shared-memory"
    bf16 = diagnose((shown.replace("kv_cache_dtype=fp8", "kv_cache_dtype=auto") + line).encode())
    assert bf16.incident is None and not bf16.candidates  # BF16 KV: ruled out


def test_xid_13_incident_is_named_only_with_the_cells_facts() -> None:
    data = read("vllm-5901-xid-13-a800-dmesg.log")
    assert diagnose(data).incident is None
    facts = (
        Fact(name="arch", value="sm120", source="cell x"),
        Fact(name="fp8_linear", value="quantization=fp8", source="cell x"),
    )
    d = diagnose(data, facts=facts)
    assert (
        d.incident is not None and d.incident.id == "nvrm-xid-13" and d.primary is not None and d.primary.id == "xid-13"
    )


@pytest.mark.parametrize(
    "signature_id", sorted(s.id for s in load_catalog() if s.refs and not s.requires and s.severity == "fail")
)
def test_self_evident_seed_incidents_are_still_named(signature_id: str) -> None:
    d = diagnose(SAMPLES[signature_id].encode())
    assert d.incident is not None and d.incident.id == signature_id and d.verdict == "failed"


# -- facts and the last exception ------------------------------------------------------------------


def test_facts_come_from_the_log_with_their_lines() -> None:
    facts = {(f.name, f.value): f.source for f in diagnose(CPU_LOG.read_bytes()).facts}
    assert facts[("vllm", "0.28.0")] == "line 21" and ("model_architecture", "LlamaForCausalLM") in facts
    assert ("arch", "sm121") in {
        (f.name, f.value) for f in diagnose(read("triton-8539-ptxas-sm121a-dgx-spark.log")).facts
    }
    gpu = diagnose(SM120_GPU.encode()).facts
    assert {(f.name, f.value) for f in gpu} >= {("gpu", "NVIDIA RTX PRO 6000 Blackwell"), ("arch", "sm120")}


def test_an_unclassified_failure_gets_the_last_exception_with_frame_and_process() -> None:
    # The real CPU startup log with an engine traceback of a kind no class knows appended.
    tail = (
        "(EngineCore pid=24) ERROR 11-30 10:00:00 [core.py:1010] Traceback (most recent call last):\n"
        '(EngineCore pid=24) ERROR 11-30 10:00:00 [core.py:1010]   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 1339, in run_engine_core\n'
        '(EngineCore pid=24) ERROR 11-30 10:00:00 [core.py:1010]   File "/usr/local/lib/python3.12/dist-packages/torch/nn/modules/module.py", line 1786, in _call_impl\n'
        "(EngineCore pid=24) ERROR 11-30 10:00:00 [core.py:1010] KeyError: 'model.layers.0.mlp.experts.w13_weight'\n"
    )
    d = diagnose(CPU_LOG.read_bytes() + tail.encode())
    assert d.primary is not None and d.primary.id == "python-exception"
    e = d.last_exception
    assert e is not None and e.type == "KeyError" and e.message == "'model.layers.0.mlp.experts.w13_weight'"
    assert e.process == "EngineCore" and e.frame is not None and e.frame.package == "torch"
    assert e.package_frame is not None and e.package_frame.package == "vllm" and e.package_frame.line == 1339
    assert "KeyError" in d.summary()


def test_the_last_exception_of_a_real_pytest_paste_has_its_frame() -> None:
    e = diagnose(read("flashinfer-3044-cubin-mismatch-pytest.log")).last_exception
    assert e is not None and e.type == "RuntimeError" and e.frame is not None
    assert (e.frame.file, e.frame.line, e.frame.function, e.frame.package) == (
        "/workspace/flashinfer/jit/env.py",
        76,
        "_get_cubin_dir",
        "flashinfer",
    )


# -- startup phases --------------------------------------------------------------------------------


def test_a_log_that_ends_mid_startup_is_a_clean_excerpt_naming_its_phase(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = CPU_LOG.read_bytes().splitlines(keepends=True)
    full = diagnose(CPU_LOG.read_bytes())
    assert full.startup.completed is True and full.startup.note is None
    cut = tmp_path / "cut.log"
    cut.write_bytes(b"".join(lines[:50]))  # stops after "Loading weights took"
    d = diagnose(cut.read_bytes())
    assert d.verdict == "clean" and d.startup.last_phase == "weight-load" and d.startup.completed is False
    # Exit 1 is kept for a named failure: a script can tell this excerpt from a failing log.
    assert main(["inspect", "log", str(cut), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["verdict"] == "clean" and document["failed"] is False
    assert document["diagnosis"]["startup"] == {
        "completed": False,
        "last_phase": "weight-load",
        "line": d.startup.line_no,
        "note": "startup completion not shown in this excerpt",
    }
    assert [c["status"] for c in document["checks"]] == ["PASS"]


@pytest.mark.parametrize("name", [e["file"] for e in INDEX if e["status"] == "clean"][:4])
def test_a_clean_excerpt_without_cell_carries_no_fail_check(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "log", str(REAL / name), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["schema_version"] == 2 and document["verdict"] == "clean" and document["failed"] is False
    assert [(c["name"], c["status"]) for c in document["checks"]] == [("diagnosis", "PASS")]


# -- pastes ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "text", "process"),
    [
        (
            " [36m(RayWorkerVllm pid=5085) [0m [E ProcessGroupNCCL.cpp:475] [Rank 4] Watchdog",
            "[E ProcessGroupNCCL.cpp:475] [Rank 4] Watchdog",
            "RayWorkerVllm",
        ),
        (
            'single-1   | (APIServer pid=1) INFO:     172.18.0.1:49114 - "GET /health HTTP/1.1" 200 OK',
            'INFO:     172.18.0.1:49114 - "GET /health HTTP/1.1" 200 OK',
            "APIServer",
        ),
        (
            "│ ERROR 09-27 06:46:46 engine.py:157] RuntimeError: x                       │",
            "ERROR 09-27 06:46:46 engine.py:157] RuntimeError: x",
            None,
        ),
        ("2026-05-12T07:51:36.069569496Z (APIServer pid=1) INFO:     ok", "INFO:     ok", "APIServer"),
        ("E         RuntimeError: flashinfer-cubin version", "RuntimeError: flashinfer-cubin version", None),
        ("  | [rank0]:[E ProcessGroupNCCL.cpp:563] x", "[rank0]:[E ProcessGroupNCCL.cpp:563] x", None),
        (
            "> [Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13",
            "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13",
            None,
        ),
        (
            "2024-12-19 21:40:35 ERROR 56542 [async_llm_engine.py:64] x^M",
            "2024-12-19 21:40:35 ERROR 56542 [async_llm_engine.py:64] x",
            None,
        ),
        (
            "\x1b[1;36m(EngineCore_DP0 pid=3)\x1b[0;0m ERROR 11-30 10:00:00 [core.py:1010] x\r",
            "ERROR 11-30 10:00:00 [core.py:1010] x",
            "EngineCore_DP0",
        ),
        (
            "(EngineCore_0 pid=675221) (VllmWorker TP1 pid=675229) INFO 08-25 11:01:23 [default_loader.py:267] Loading weights took 1.13 seconds",
            "INFO 08-25 11:01:23 [default_loader.py:267] Loading weights took 1.13 seconds",
            "VllmWorker TP1",
        ),
    ],
)
def test_clean_line_takes_paste_wrappers_off(raw: str, text: str, process: str | None) -> None:
    cleaned = clean_line(raw)
    assert (cleaned.text, cleaned.process) == (text, process)


def test_message_of_strips_logger_headers() -> None:
    assert (
        message_of("ERROR 05-12 01:48:42 [api_router.py:72] vllm.x.EngineDeadError: y") == "vllm.x.EngineDeadError: y"
    )
    assert message_of("[2024-12-07 02:54:42 TP0] Scheduler hit an exception: T") == "Scheduler hit an exception: T"
    assert (
        message_of(
            "ERROR:    (Worker_TP1 pid=3534) ERROR 10-11 22:28:17 [multiproc_executor.py:694] RuntimeError: Could not find nvcc"
        )
        == "RuntimeError: Could not find nvcc"
    )


@pytest.mark.parametrize(
    "name",
    [
        "vllm-24815-illegal-memory-access-worker-tp1.log",
        "vllm-28143-oom-weight-load.log",
        "lmcache-2306-engine-dead.log",
    ],
)
def test_crlf_ansi_and_one_line_pastes_get_the_same_answer(name: str) -> None:
    data = read(name)
    expected = diagnose(data)
    assert expected.primary is not None
    crlf = diagnose(data.replace(b"\n", b"\r\n"))
    flat = diagnose(b" ".join(data.splitlines()))
    # vLLM colours the process prefix when it writes to a terminal
    ansi = diagnose(re.sub(rb"(?m)^(\([^)]* pid=\d+\))", lambda m: b"\x1b[0;36m" + m.group(1) + b"\x1b[0;0m", data))
    for d in (crlf, flat, ansi):
        assert d.primary is not None and d.primary.id == expected.primary.id
        assert (d.incident.id if d.incident else None) == (expected.incident.id if expected.incident else None)
        assert (d.last_exception.type if d.last_exception else None) == (
            expected.last_exception.type if expected.last_exception else None
        )
    for d in (crlf, ansi):
        assert d.primary is not None and d.primary.line_no == expected.primary.line_no
        assert (d.primary.text, d.primary.phase, d.primary.process) == (
            expected.primary.text,
            expected.primary.phase,
            expected.primary.process,
        )


def test_split_records_cuts_a_flattened_paste_at_record_starts() -> None:
    data = read("vllm-24815-illegal-memory-access-worker-tp1.log")
    assert len(split_records(b" ".join(data.splitlines()))) == len(data.splitlines())


# -- input that is not a plain file ----------------------------------------------------------------


def test_stdin_dash_is_read(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(read("vllm-18995-no-kernel-image-rtx5090.log"))))
    assert main(["inspect", "log", "-", "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["file"] == "stdin" and document["diagnosis"]["class"]["id"] == "no-kernel-image"


def _write_later(path: str, data: bytes) -> threading.Thread:
    def write() -> None:
        with open(path, "wb") as f:
            f.write(data)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


def test_a_fifo_with_a_fatal_line_fails(tmp_path: Path) -> None:
    # Regression: a FIFO has size 0, and was judged clean (exit 0) without being read.
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    writer = _write_later(str(fifo), read("vllm-18995-no-kernel-image-rtx5090.log"))
    assert main(["inspect", "log", str(fifo)]) == 1
    writer.join(5)


def test_a_pipe_like_process_substitution_is_read(tmp_path: Path) -> None:
    r, w = os.pipe()
    writer = _write_later(f"/dev/fd/{w}", read("vllm-6732-nccl-unhandled-cuda-error.log"))
    writer.join(5)
    os.close(w)
    with open_log(Path(f"/dev/fd/{r}")) as data:
        assert diagnose(data).primary is not None
    os.close(r)


def test_a_procfs_file_of_size_zero_is_read_not_judged_by_its_size() -> None:
    assert os.stat("/proc/self/status").st_size == 0
    with open_log(Path("/proc/self/status")) as data:
        assert b"Name:" in data


def test_bad_input_is_a_located_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"")))
    assert main(["inspect", "log", "-"]) == 2
    assert "stdin: empty" in capsys.readouterr().err
    binary = tmp_path / "core.gz"
    binary.write_bytes(b"\x1f\x8b\x08\x00" + bytes(64))
    assert main(["inspect", "log", str(binary)]) == 2
    assert f"{binary}: binary data (a NUL byte at offset 3)" in capsys.readouterr().err
    assert main(["inspect", "log", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_non_utf8_input_is_read_with_its_location_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "latin1.log"
    log.write_bytes(b"caf\xe9 started\n" + read("vllm-18995-no-kernel-image-rtx5090.log"))
    assert main(["inspect", "log", str(log), "--json"]) == 1
    captured = capsys.readouterr()
    assert f"{log}: line 1: 1 byte sequence(s) are not UTF-8" in captured.err
    assert json.loads(captured.out)["undecodable"] == {"sequences": 1, "first_line": 1}


# -- the class catalog -----------------------------------------------------------------------------


def test_class_catalog_problems_are_located(tmp_path: Path) -> None:
    bad = tmp_path / "classes.yaml"
    bad.write_text(
        "schema_version: 1\nclasses:\n  - id: x\n    title: t\n    severity: fatal\n    priority: 1\n"
        "    match: ['(']\n    components: ['[']\n    what: w\n    next: n\n    colour: red\nphases: []\nfacts: []\n"
    )
    with pytest.raises(MatrixError) as info:
        load_classes(bad)
    text = "\n".join(info.value.problems)
    assert f"{bad}:5: classes[0].severity: must be fail or warn, got 'fatal'" in text
    assert f"{bad}:7: classes[0].match[0]: not a valid regular expression" in text
    assert f"{bad}:8: classes[0].components[0]: not a valid regular expression" in text
    assert f"{bad}:11: classes[0].colour: unknown key" in text
    assert "needs the python-exception class" in text and "needs a `serving` phase" in text
    bad.write_text(
        bad.read_text().replace("components: ['[']", "components: nvidia-ctk").replace("match: ['(']", "match: []")
    )
    with pytest.raises(MatrixError) as info:
        load_classes(bad)
    text = "\n".join(info.value.problems)
    assert f"{bad}:7: classes[0].match: must be a non-empty list of regular expressions" in text
    assert f"{bad}:8: classes[0].components: must be a list of regular expressions" in text


def test_every_class_pattern_cites_where_its_text_comes_from() -> None:
    text = CLASSES_FILE.read_text()
    body = text.split("\nclasses:\n", 1)[1].split("\nphases:\n", 1)[0]
    blocks = re.split(r"\n  - id: ", body)[1:]
    for block in blocks:
        name = block.split("\n", 1)[0]
        # The Xid entries share the comment above them (NVIDIA's catalog and the threads).
        assert "#" in block or name.startswith("xid-"), f"{name}: no citation comment"
    assert "docs.nvidia.com/deploy/xid-errors" in body


def test_every_class_is_proven_on_a_real_log_or_a_realistic_line() -> None:
    lines = {
        "xid-79": SAMPLES["nvrm-xid-79"],
        "xid-43": SAMPLES["nvrm-xid-43"],
        "xid-ecc": "[ 88.1] NVRM: Xid (PCI:0000:9b:00): 94, pid=1234, name=python3, Contained ECC error\n",
        "xid-nvlink": "NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000)\n",
        "xid-timeout": "[Fri Aug 30 11:43:14 2024] NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005\n",
        "xid-62": "NVRM: Xid (PCI:0000:3b:00): 62, pid=2415, name=python3, 0000d2f3 0000d2f2 00000000\n",
        "xid-other": "[24128.828315] NVRM: Xid (PCI:0000:01:00): 32, Channel ID 00000000 intr 00004000\n",
        "engine-init-failed": SAMPLES["vllm-engine-core-init-failed"],
        "python-exception": "(EngineCore pid=24) ERROR 11-30 10:00:00 [core.py:1010] Traceback (most recent call last):\n",
        "p2p-unavailable": "(eager_allreduce pid=3040) WARNING 05-13 08:48:35 custom_all_reduce.py:166] Custom allreduce is disabled because your platform lacks GPU P2P capability or P2P test failed. To silence this warning, specify disable_custom_all_reduce=True explicitly.\n",
        # vLLM 0.28.0 vllm/platforms/cuda.py:451's wording
        "attention-backend-unavailable": "(EngineCore pid=9) ERROR 04-14 02:13:13 [core.py:1108] ValueError: No valid attention backend found for cuda with AttentionSelectorConfig(head_size=64, has_sink=True). Reasons: {FLASH_ATTN: [sink setting not supported]}\n",
        # dockerd's answer to a pull of an image that does not exist, as the docker CLI prints it
        "container-error": "docker: Error response from daemon: pull access denied for vllm/vllm-openai-nightly, repository does not exist or may require 'docker login': denied: requested access to the resource is denied.\n",
        "unclassified-error": "(EngineCore_DP0 pid=311) ERROR 03-02 10:11:12 [core.py:1010] EngineCore failed to bind the ZMQ socket\n",
    }
    # The real logs: the corpus and the tune halves of the unseen pastes (issue 26) and of the
    # pastes beyond the families issue 26 knew (issue 44).
    tune = yaml.safe_load((REAL.parent / "unseen" / "tune" / "index.yaml").read_text())["logs"]
    tune += yaml.safe_load((REAL.parent / "beyond" / "tune" / "index.yaml").read_text())["logs"]
    corpus = {e["class"] for e in (*INDEX, *tune)}
    for c in load_classes().classes:
        assert c.id in corpus or c.id in lines, f"{c.id}: no real log or realistic line proves it"
    for class_id, line in lines.items():
        d = diagnose(line.encode())
        seen = [h.id for h in (*d.classes, *d.warnings)]
        assert seen[:1] == [class_id], (class_id, seen)


def test_the_literal_prefilter_never_drops_a_line_the_regex_matches(real_matrix) -> None:
    # scan() only runs a regex on lines holding one of its literals: for every pattern the
    # diagnosis and the catalog use, that must find exactly the lines a plain regex search finds.
    from pipeline.matrix.model import LogRule
    from verify.logs.classes import scan_rules
    from verify.logs.logscan import scan

    text = b"".join(p.read_bytes() for p in sorted(REAL.glob("*.log"))) + "".join(SAMPLES.values()).encode()
    lines = text.split(b"\n")
    patterns = [r.pattern for r in scan_rules()]
    patterns += [p for s in load_catalog() for p in (s.match, s.first) if p]
    # the stages' rules too: the built-in sets and every cell's and arm's (same prefilter)
    patterns += [r.pattern for rs in load_rulesets() for r in rs.rules]
    patterns += [
        r.pattern for c in real_matrix.cells for r in (*c.log_rules, *(x for a in c.arms for x in a.log_rules))
    ]
    unique = list(dict.fromkeys(patterns))
    matches = scan(text, tuple(LogRule(id=str(i), kind="evidence", pattern=p) for i, p in enumerate(unique)), ())
    for i, pattern in enumerate(unique):
        regex = re.compile(pattern.encode())
        expected = [n + 1 for n, line in enumerate(lines) if regex.search(line)]
        assert [m.line_no for m in matches if m.id == str(i)] == expected, pattern


def test_the_process_of_the_failure_is_a_fact() -> None:
    facts = {(f.name, f.value) for f in diagnose(read("vllm-46721-triton-shared-memory-kimi-sm120-compose.log")).facts}
    assert ("process", "Worker_TP0_DCP0_EP0") in facts


def test_a_traceback_the_server_started_serving_after_is_a_warning() -> None:
    lines = CPU_LOG.read_bytes().splitlines(keepends=True)
    traceback = b"(APIServer pid=1) Traceback (most recent call last):\n"
    before = diagnose(b"".join([*lines[:40], traceback, *lines[40:]]))
    assert before.verdict == "clean" and [w.id for w in before.warnings] == ["python-exception"]
    after = diagnose(CPU_LOG.read_bytes() + traceback)
    assert after.verdict == "failed" and after.primary is not None and after.primary.id == "python-exception"
