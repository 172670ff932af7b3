"""Fuzz and bad input (issue 16): hundreds of hostile inputs to the real CLI, each asserting the exit
code, a located message (the file and line, or the option) and no traceback or hang.

Every case runs in one child process (tests/unit/fuzz_driver.py) under a memory cap (RLIMIT_AS)
and a per-case alarm: a case that would take the host down kills only that child. Inputs cover the
matrix, the command line, collect-env and other repro sources, caches, locks, logs, receipts and
doctor input, questions files, and hostile servers on 127.0.0.1.
"""

from __future__ import annotations

import functools
import json
import os
import re
import resource
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
MEMORY_CAP = 3 * 2**30

VALID = """\
schema_version: 1
indexes:
  pypi: {url: "https://pypi.org/simple"}
bases:
  img:
    image: "example/img:1.0"
    digest: "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
cells:
  - id: a
    base: img
    platform: linux/amd64
    arch: none
    env: {VLLM_X: "1"}
    serve:
      model: {source: "hf:org/model", revision: "0123456789abcdef0123456789abcdef01234567"}
      args: ["--max-num-batched-tokens", "8192"]
      load: {questions: 4, concurrency: 2}
"""


@dataclass(frozen=True)
class Case:
    id: str
    argv: list[str]
    expect: tuple[int, ...]
    located: str  # a regex the stderr must match: the file:line, or the option, that is at fault
    files: dict[str, bytes] = field(default_factory=dict)
    stdin: str = ""
    timeout: int = 30
    env: dict[str, str] = field(default_factory=dict)
    # Issue 27: the defect class a case attacks (benchmarks/hostile_inputs.py counts per class), a
    # canary that must appear in no output and no file the command wrote under the case's directory,
    # and (file, regex) that must not match the named file once the command ran (a false PASS).
    klass: str = ""
    forbid: str = ""
    refute: tuple[str, str] | None = None
    fifos: tuple[str, ...] = ()  # names made as FIFOs with no writer
    # `pull` asks docker for the host before it asks the registry: without a daemon the case meets
    # exit 3 "no docker daemon answers", not the registry's fault it was written for.
    needs_docker: bool = False


# -- the matrix ----------------------------------------------------------------------------------

# (path in the valid document, hostile YAML value). Every one must be refused with FILE:LINE.
FIELD_VALUES: list[tuple[str, str]] = []
for _path, _values in {
    "cells.0.id": [
        "[a, b]",
        "{x: 1}",
        "''",
        "'a b'",
        "'../x'",
        "'A'",
        "'" + "a" * 300 + "'",
        "'a\\nb'",
        "-1.5",
        "true",
    ],
    "cells.0.base": ["[img]", "{x: 1}", "nope", "''", "1"],
    "cells.0.platform": ["linux/riscv", "[linux/amd64]", "1", "''"],
    "cells.0.arch": ["sm999", "[none]", "{}", "0"],
    "cells.0.env": [
        "[1]",
        "'x'",
        "{1BAD: x}",
        "{VLLM_A: [1]}",
        '{VLLM_A: "\\x1b[31m"}',
        "{HF_TOKEN: x}",
        "{VLLM_A: sk-abcdefghijklmnopqrstuvwx}",
        "{VLLM_A: {b: 1}}",
    ],
    "cells.0.system_packages": ["['g++ && id']", "['$(id)']", "[[1]]", "'g++'", "['a;b']", "['`id`']"],
    "cells.0.uninstall": ["['x; id']", "[[x]]", "'x'", "['a b']"],
    "cells.0.recipes": ["[/etc]", "['../..']", "[nope]", "'x'", "[[1]]"],
    "cells.0.runner": ["'x'", "{a: 1}"],
    "cells.0.extends": ["[a]", "nope", "a", "{x: 1}"],
    "cells.0.serve": ["[1]", "'x'", "{model: x}", "{}"],
    "cells.0.serve.args": [
        "'--x'",
        "[--host, 0.0.0.0]",
        "[--port=1]",
        "[--api-key, x]",
        "[[1]]",
        '["a\\nb"]',
        "[--hf-token=hf_abcdefghijklmnopqrstuvwx]",
    ],
    "cells.0.serve.readiness_timeout": [".nan", ".inf", "-1", "0", "'x'", "1.0e+999", "[1]", "true"],
    "cells.0.serve.load.concurrency": ["1000000000", "0", "-1", "1.5", "'x'", ".nan", "true", "[1]"],
    "cells.0.serve.load.questions": ["10000000000", "0", "'many'", ".inf"],
    "cells.0.serve.load.duration": [".nan", ".inf", "-.inf", "0", "1.0e+300", "'long'"],
    "cells.0.serve.load.stall_seconds": [".nan", ".inf", "0", "'x'"],
    "cells.0.serve.load.chunk_timeout": [".nan", "1.0e+999", "-1"],
    "cells.0.serve.load.rate": [".nan", ".inf", "0", "-2"],
    "cells.0.serve.load.baseline_rate": ["'1/0'", "'x'", "2", "0", ".nan", "'1e999'"],
    "cells.0.serve.load.questions_file": ["no-such-file.jsonl", "[1]"],
    "cells.0.serve.load": ["[1]", "{nope: 1}", "{determinism: [1]}", "{determinism: {repeats: .nan}}"],
    "cells.0.serve.model": ["'hf:x'", "{source: 's3://b/m'}", "{source: [1]}", "[1]"],
    "cells.0.overrides": [
        "[1]",
        "{six: 1}",
        "{six: {version: '>=1', index: pypi}}",
        "{six: {version: '1.0', index: nope}}",
        "{'bad name!': {version: '1', index: pypi}}",
    ],
    "cells.0.expect": [
        "{outcome: pass}",
        "[1]",
        "{outcome: fail, stage: nope, reason: x, match: x}",
        "{outcome: fail, stage: imports, reason: x, match: '('}",
    ],
    "cells.0.log_rules": ["[1]", "'x'", "[{expect: '('}]", "[{nope: x}]"],
    "cells.0.arms": ["[1]", "{'Bad Arm': {}}", "{a1: {env: {HF_TOKEN: x}}}", "{a1: {args: [--port, 1]}}"],
    "cells.0.autotune": ["[1]", "{forbid: x}", "{forbid: [{op: 1}]}"],
    "cells.0.install": ["{requirements: {}}", "[1]"],
    "indexes": [
        "[1]",
        "{'../x': {url: 'https://x'}}",
        '{"a\\nb": {url: "https://x"}}',
        "{p: {url: 'ftp://x'}}",
        "{p: {url: 'https://u:p@x/s'}}",
        "{p: {url: 'https://x y'}}",
        "{P: {url: 'https://x'}}",
    ],
    "bases.img": [
        "{image: 'BAD IMAGE'}",
        "{image: 'x:1', digest: md5}",
        "{image: 'x:1', python: 'python3 -c x'}",
        "{bootstrap: {suite: 'a;b', venv: /v}}",
        "{bootstrap: {suite: bookworm, venv: 'v'}}",
        "{bootstrap: {suite: bookworm, venv: '/v && id'}}",
        "{cell: a}",
        "[1]",
    ],
    "schema_version": ["2", "'1'", "[1]", "null"],
}.items():
    FIELD_VALUES += [(_path, _v) for _v in _values]


def _set(document: str, path: str, value: str) -> str:
    """The valid document with the value at `path` replaced by `value` (YAML text), as text."""
    return _with_placeholder(document, path).replace("'@@VALUE@@'", value)


@functools.cache  # one YAML round trip per path, not per value: every worker collects these cases
def _with_placeholder(document: str, path: str) -> str:
    import yaml

    data = yaml.safe_load(document)
    target: Any = data
    parts = [int(p) if p.isdigit() else p for p in path.split(".")]
    for part in parts[:-1]:
        target = target[part]
    target[parts[-1]] = "@@VALUE@@"
    return yaml.safe_dump(data, sort_keys=False, width=10_000)


def _matrix_cases() -> list[Case]:
    cases = []
    for n, (path, value) in enumerate(FIELD_VALUES):
        text = _set(VALID, path, value)
        cases.append(
            Case(
                id=f"matrix-{n:03d}-{path}",
                argv=["matrix", "validate", "--matrix", "{DIR}/m.yaml", "--images", str(REPO / "images")],
                expect=(2,),
                located=r"{DIR}/m\.yaml:\d+: ",
                files={"m.yaml": text.encode()},
            )
        )
    structural = {
        "non-utf8": b"schema_version: 1\ncells:\n  - id: caf\xe9\n",
        "nul-byte": b"schema_version: 1\x00\n",
        "empty": b"",
        "scalar": b"42\n",
        "list": b"- 1\n- 2\n",
        "deep-list": b"cells: " + b"[" * 10_000 + b"]" * 10_000 + b"\n",
        "deep-map": b"cells: " + b"{a: " * 10_000 + b"1" + b"}" * 10_000 + b"\n",
        "deep-block": b"schema_version: 1\ncells:\n" + b"".join(b"  " * i + b"- \n" for i in range(1, 200)),
        "recursive-alias": b"schema_version: 1\ncells: &a [*a]\n",
        "recursive-map": b"schema_version: 1\ncells:\n  - &c {id: a, base: *c}\n",
        "billion-laughs": b"schema_version: 1\na: &a [x, x, x, x, x, x, x, x, x, x]\n"
        + b"".join(
            f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n".encode() for p, c in zip("abcdefgh", "bcdefghi", strict=True)
        )
        + b"cells: *i\n",
        "huge": b"schema_version: 1\ncells: []\n# " + b"x" * (9 * 2**20) + b"\n",
        "tabs": b"schema_version: 1\ncells:\n\t- id: a\n",
        "bad-yaml": b"schema_version: 1\ncells: [\n",
        "duplicate-key": b"schema_version: 1\nschema_version: 1\ncells: []\n",
        "key-list": b"schema_version: 1\n[a]: 1\ncells: []\n",
        "key-map": b"schema_version: 1\n? {a: 1}\n: 2\ncells: []\n",
        "cells-map": b"schema_version: 1\ncells: {a: 1}\n",
        "cells-null": b"schema_version: 1\ncells:\n",
        "numeric-dup": b"schema_version: 1\n"
        + VALID.split("schema_version: 1\n", 1)[1].encode()
        + b"  - id: a\n    base: img\n    platform: linux/amd64\n    arch: none\n",
        "bad-tag": b"schema_version: !!python/object:os.system 1\ncells: []\n",
        "binary-tag": b"schema_version: 1\ncells: !!binary notbase64\n",
        "long-line": b"schema_version: 1\ncells: [" + b"1, " * 300_000 + b"]\n",
        "extends-cycle": b"schema_version: 1\nbases: {img: {image: 'x:1'}}\ncells:\n"
        b"  - {id: a, extends: b, base: img, platform: linux/amd64, arch: none}\n"
        b"  - {id: b, extends: a}\n",
        "cell-base-loop": b"schema_version: 1\nbases: {me: {cell: a}}\ncells:\n"
        b"  - {id: a, base: me, platform: linux/amd64, arch: none}\n",
    }
    head = b'schema_version: 1\nbases:\n  img: {image: "example/img:1.0"}\n'
    first = b"cells:\n  - {id: c0, base: img, platform: linux/amd64, arch: none}\n"
    structural["extends-3000-deep"] = (
        head + first + b"".join(f"  - {{id: c{i}, extends: c{i - 1}}}\n".encode() for i in range(1, 3000))
    )
    structural["cell-bases-3000-deep"] = (
        head
        + b"".join(f"  b{i}: {{cell: c{i}}}\n".encode() for i in range(3000))
        + first
        + b"".join(
            f"  - {{id: c{i}, base: b{i - 1}, platform: linux/amd64, arch: none}}\n".encode() for i in range(1, 3000)
        )
    )
    for name, data in structural.items():
        cases.append(
            Case(
                id=f"matrix-structure-{name}",
                argv=["matrix", "validate", "--matrix", "{DIR}/m.yaml"],
                expect=(2,),
                located=r"{DIR}/m\.yaml(:\d+)?: ",
                files={"m.yaml": data},
            )
        )
    # the same matrices through other commands: list, show, render, --json error documents
    for command in (["matrix", "list"], ["matrix", "show", "a"], ["render", "--out", "{DIR}/out"], ["ci-matrix"]):
        for name in ("non-utf8", "recursive-alias", "billion-laughs", "deep-list"):
            cases.append(
                Case(
                    id=f"{'-'.join(command[:2])}-{name}-json",
                    argv=[*command, "--matrix", "{DIR}/m.yaml", "--json"],
                    expect=(2,),
                    located=r"{DIR}/m\.yaml(:\d+)?: ",
                    files={"m.yaml": structural[name]},
                )
            )
    return cases


# -- the command line -----------------------------------------------------------------------------

VALID_FILES = {"m.yaml": VALID.encode()}


def _cli_cases() -> list[Case]:
    cases = []

    def add(name: str, argv: list[str], expect: tuple[int, ...], located: str, **kw: Any) -> None:
        files = kw.pop("files", {})
        cases.append(
            Case(id=f"cli-{name}", argv=argv, expect=expect, located=located, files={**VALID_FILES, **files}, **kw)
        )

    m = ["--matrix", "{DIR}/m.yaml", "--images", str(REPO / "images")]
    for i, rate in enumerate(["0", "1", "-1", "nan", "inf", "1/0", "x", "1e999", "1/-3", "", "2/1", "1e-999"]):
        add(f"stats-rate-{i}", ["stats", "--baseline-rate", rate, "--questions", "10"], (2,), r"--baseline-rate")
    for i, extra in enumerate(
        [
            ["--questions", "0"],
            ["--questions", "-5"],
            ["--questions", "10", "--faults", "11"],
            ["--questions", "10", "--faults", "-1"],
            ["--questions", "10", "--other-questions", "0", "--other-faults", "0"],
            ["--questions", "10", "--other-questions", "-1", "--other-faults", "0"],
            ["--questions", "10", "--other-questions", "5", "--other-faults", "9"],
            ["--questions", "10", "--other-questions", "5"],
            ["--questions", "x"],
            ["--questions", "99999999999999999999999999"],
        ]
    ):
        add(f"stats-{i}", ["stats", "--baseline-rate", "1/450", *extra], (2,), r"questions|faults")
    for i, (flag, value) in enumerate(
        [
            ("--concurrency", "1000000000"),
            ("--concurrency", "nan"),
            ("--concurrency", "0"),
            ("--duration", "nan"),
            ("--duration", "inf"),
            ("--duration", "1e999"),
            ("--stall-seconds", "nan"),
            ("--stall-seconds", "-1"),
            ("--chunk-timeout", "inf"),
            ("--scrape-interval", "nan"),
            ("--rate", "nan"),
            ("--rate", "inf"),
            ("--burstiness", "nan"),
            ("--questions", "nan"),
            ("--max-tokens", "1e3"),
            ("--determinism-repeats", "-1"),
            ("--baseline-rate", "nan"),
            ("--questions-file", "{DIR}/missing.jsonl"),
        ]
    ):
        add(
            f"load-{flag}-{i}",
            ["load", "--url", "http://127.0.0.1:{PORT}/ok", flag, value, "--out", "{DIR}/o"],
            (2,),
            r"missing\.jsonl" if flag == "--questions-file" else re.escape(flag),
        )
    for i, url in enumerate(
        [
            "http://127.0.0.1:99999",
            "http://127.0.0.1:-1",
            "http://10.0.0.1:8000",
            "ftp://127.0.0.1/",
            "not a url",
            "http://[::1",
            "http://127.0.0.1:8000:9",
            "http://user@example.com",
        ]
    ):
        add(f"load-url-{i}", ["load", "--url", url, "--out", "{DIR}/o"], (2,), r"--url")
    add("stages-comma", ["verify", "a", *m, "--stages", ","], (2,), r"--stages")
    add("stages-unknown", ["verify", "a", *m, "--stages", "imports,nope"], (2,), r"--stages")
    add("show-unknown", ["matrix", "show", "nope", *m], (2,), r"nope")
    add("show-unknown-json", ["matrix", "show", "nope", *m, "--json"], (2,), r"nope")
    add("arm-unknown", ["verify", "a", *m, "--arm", "nope"], (2,), r"nope")
    add("render-unwritable", ["render", *m, "--out", "/proc/stackproof-out"], (2, 3), r"/proc/stackproof-out")
    add("render-out-is-file", ["render", *m, "--out", "{DIR}/m.yaml"], (2, 3), r"m\.yaml")
    add("matrix-missing", ["matrix", "validate", "--matrix", "{DIR}/none.yaml"], (2,), r"none\.yaml")
    add("matrix-is-dir", ["matrix", "validate", "--matrix", "{DIR}"], (2,), r"{DIR}")
    add("soak-arms-empty", ["soak", "a", *m, "--arms", ","], (2,), r"--arms")
    add("soak-slice-nan", ["soak", "a", *m, "--slice", "nan"], (2,), r"--slice")
    add("probe-imports-neither", ["probe", "imports", *m], (2,), r"CELL|--host")
    add("probe-kernels-noconfig", ["probe", "kernels", "--host", "--config", "{DIR}/none.json", *m], (2,), r"--config")
    add("inspect-autotune-missing", ["inspect", "autotune", "{DIR}/none.json"], (2,), r"none\.json")
    add(
        "mirrors-malformed",
        ["render", *m, "--out", "{DIR}/o"],
        (2,),
        r"STACKPROOF_MIRRORS",
        env={"STACKPROOF_MIRRORS": "x"},
    )
    add("unknown-command", ["frobnicate"], (2,), r"frobnicate|invalid choice")
    add("version-json", ["matrix", "list", *m, "--json"], (0,), r"")
    dated = VALID.replace("id: a", "id: 2001-12-14").encode()  # YAML reads a date: the id as written
    add(
        "timestamp-id",
        ["matrix", "show", "2001-12-14", "--matrix", "{DIR}/d.yaml", "--json"],
        (0,),
        r"",
        files={"d.yaml": dated},
    )
    return cases


# -- files the tool reads: caches, logs, questions, repro sources, doctor input, receipts, locks ------------


BAD_JSON = {
    "not-json": b"this is not json",
    "non-utf8": b'{"a": "caf\xe9"}',
    "list": b"[1, 2, 3]",
    "string": b'"x"',
    "null": b"null",
    "number": b"1e999",
    "deep": b"[" * 100_000 + b"]" * 100_000,
    "deep-map": b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    "empty": b"",
    "nul": b"\x00\x00\x00",
    "huge-key": b'{"' + b"k" * 1_000_000 + b'": 1}',
}


def _file_cases() -> list[Case]:
    cases = []
    m = ["--matrix", "{DIR}/m.yaml", "--images", str(REPO / "images")]

    def add(
        name: str, argv: list[str], expect: tuple[int, ...], located: str, files: dict[str, bytes], **kw: Any
    ) -> None:
        cases.append(Case(id=name, argv=argv, expect=expect, located=located, files={**VALID_FILES, **files}, **kw))

    for name, data in BAD_JSON.items():
        add(f"autotune-{name}", ["inspect", "autotune", "{DIR}/c.json"], (2,), r"{DIR}/c\.json", {"c.json": data})
        add(
            f"autotune-json-{name}",
            ["inspect", "autotune", "{DIR}/c.json", "--json"],
            (2,),
            r"{DIR}/c\.json",
            {"c.json": data},
        )
        add(f"doctor-input-{name}", ["doctor", "--input", "{DIR}/d.json", *m], (2,), r"d\.json", {"d.json": data})
        add(f"repro-doctor-{name}", ["repro", "{DIR}/d.json", *m, "--offline"], (2,), r"d\.json", {"d.json": data})
        add(
            f"questions-{name}",
            ["load", "--url", "http://127.0.0.1:{PORT}/ok", "--questions-file", "{DIR}/q.jsonl", "--out", "{DIR}/o"],
            (2,),
            r"{DIR}/q\.jsonl",
            {"q.jsonl": data},
        )
        lock_matrix = VALID.replace('    env: {VLLM_X: "1"}\n', "    install: {requirements: {}, lock: lock.json}\n")
        add(
            f"lock-{name}",
            ["render", *m, "--out", "{DIR}/o"],
            (2,),
            r"{DIR}/lock\.json",
            {"m.yaml": lock_matrix.encode(), "lock.json": data},
        )
    cache_keys = {
        "key-1e999": b'{"_metadata": {}, "(\'fp8_gemm\', \'R\', ((1e999, 2), (3, 4)))": ["R", 1]}',
        "key-nan": b'{"_metadata": {}, "(\'fp8_gemm\', \'R\', ((NaN, 2),))": ["R", 1]}',
        "key-garbage": b'{"_metadata": {}, "((((((": ["R", 1]}',
        "key-deep": b'{"_metadata": {}, "' + b"(" * 5000 + b")" * 5000 + b'": ["R", 1]}',
        "value-bad": b"{\"_metadata\": {}, \"('op', 'R', ())\": 5}",
        "metadata-list": b'{"_metadata": [1]}',
        "value-nan": b'{"_metadata": {}, "(\'op\', \'R\', ())": ["R", NaN]}',
    }
    for name, data in cache_keys.items():
        add(f"autotune-{name}", ["inspect", "autotune", "{DIR}/c.json", "--json"], (0, 1, 2), r"", {"c.json": data})
    questions = {
        "one-turn": b'{"id": "q", "turns": ["a"]}\n',
        "id-list": b'{"id": ["q"], "turns": ["a", "b"]}\n',
        "turns-map": b'{"turns": {"a": 1}}\n',
        "dup": b'{"id": "q", "turns": ["a", "b"]}\n{"id": "q", "turns": ["a", "b"]}\n',
        "extra": b'{"id": "q", "turns": ["a", "b"], "x": 1}\n',
        "long-line": b'{"id": "q", "turns": ["' + b"a" * 3_000_000 + b'"]}\n',
        "blank": b"\n\n\n",
    }
    for name, data in questions.items():
        add(
            f"questions-{name}",
            ["load", "--url", "http://127.0.0.1:{PORT}/ok", "--questions-file", "{DIR}/q.jsonl", "--out", "{DIR}/o"],
            (2,),
            r"{DIR}/q\.jsonl",
            {"q.jsonl": data},
        )
    sources = {
        "non-utf8": b"GPU: caf\xe9\n",
        "empty": b"",
        "binary": bytes(range(256)) * 100,
        "long-line": b"vLLM: " + b"0.28.0 " * 200_000 + b"\n",
        "long-line-nospace": b"x" * 2_000_000,
        "many-lines": b"PyTorch version: 2.13.0\n" * 200_000,
        "collect-env-garbage": (
            b"Collecting environment information...\nPyTorch version: ???\nGPU models and configuration: \n"
        ),
        "pip-freeze-bad": b"torch==\nvllm==x.y\n==1.0\n",
        "doctor-deep": b'{"stackproof_doctor": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
    }
    for name, data in sources.items():
        add(
            f"repro-src-{name}",
            ["repro", "{DIR}/src.txt", *m, "--offline"],
            (0, 2),
            r"src\.txt",
            {"src.txt": data},
            timeout=60,
        )
    add("repro-stdin-empty", ["repro", "-", *m, "--offline"], (2,), r"-|stdin", {}, stdin="")
    add("repro-missing", ["repro", "{DIR}/none.txt", *m, "--offline"], (2,), r"none\.txt", {})
    add("repro-dir", ["repro", "{DIR}", *m, "--offline"], (2,), r"{DIR}", {})
    for name, data in BAD_JSON.items():
        if name == "huge-key":  # a valid object: the run goes on (and needs the image)
            continue
        add(f"previous-{name}", ["verify", "a", *m, "--previous", "{DIR}/p.json"], (2,), r"p\.json", {"p.json": data})
    for name, data in BAD_JSON.items():
        add(
            f"receipts-{name}",
            ["doctor", "--receipts", "{DIR}/r", "--input", "{DIR}/ok.json", *m],
            (0, 1, 2),
            r"",
            {"r/receipt.json": data, "ok.json": b'{"schema_version": 1}'},
        )
    return cases


# -- hostile servers on 127.0.0.1 -----------------------------------------------------------------------


def _server_cases() -> list[Case]:
    cases = []
    spec = [
        "--questions",
        "2",
        "--concurrency",
        "2",
        "--max-tokens",
        "2",
        "--determinism-repeats",
        "0",
        "--duration",
        "10",
        "--chunk-timeout",
        "3",
    ]
    for mode, expect in {
        "html": (1,),
        "data-string": (1,),
        "data-empty": (1,),
        "id-list": (1,),
        "nested": (1,),
        "status-500": (1,),
        "list": (1,),
        "bad-usage": (1,),
        "garbage": (1,),
        "list-event": (1,),
        "huge-usage": (0, 1),
    }.items():
        cases.append(
            Case(
                id=f"server-{mode}",
                argv=["load", "--url", f"http://127.0.0.1:{{PORT}}/{mode}", *spec, "--out", "{DIR}/o"],
                expect=expect,
                located=r"127\.0\.0\.1",
                timeout=60,
            )
        )
    cases.append(
        Case(
            id="server-closed-port",
            argv=["load", "--url", "http://127.0.0.1:9", *spec, "--out", "{DIR}/o"],
            expect=(1,),
            located=r"127\.0\.0\.1:9",
            timeout=60,
        )
    )
    return cases


# -- issue 27: the new surfaces (report, compare, repro sources, doctor input, load URLs, logs) ---------

CANARY = "CANARYs3cret9"
_RECEIPT = (REPO / "tests/fixtures/receipts/cpu-tiny-pass/cpu-tiny/run-20261201T181931/receipt.json").read_bytes()


_PROJECT_MATRIX = (REPO / "matrix.yaml").read_bytes()


def _receipt_with(edit: Any) -> bytes:
    document = json.loads(_RECEIPT)
    edit(document)
    return json.dumps(document).encode()


def _greedy(gap: str, *, duplicate: bool = False) -> bytes:
    prompts = [f'{{"index": 0, "prompt": "p", "tokens": ["x", "z"], "top2_gaps": [3.0, {gap}]}}']
    if duplicate:
        prompts.append('{"index": 0, "prompt": "p", "tokens": ["x", "y"], "top2_gaps": [3.0, 3.0]}')
    head = '{"kind": "stackproof.greedy-samples", "schema_version": 1, "model": "m", "max_tokens": 4, "label": "b"'
    return (head + ', "prompts": [' + ", ".join(prompts) + "]}").encode()


def _reliability_cases() -> list[Case]:
    cases = []

    def add(klass: str, name: str, argv: list[str], expect: tuple[int, ...], located: str = "", **kw: Any) -> None:
        cases.append(Case(id=f"rel{klass}-{name}", argv=argv, expect=expect, located=located, klass=klass, **kw))

    report = ["report", "--receipts", "{DIR}/runs", "--out", "{DIR}/site", "--cells", "cpu-tiny"]
    not_pass = ("site/index.json", r'"status": "PASS"')
    good = _greedy("3.0")
    compare = ["compare", "{DIR}/a/greedy.json", "{DIR}/b/greedy.json"]
    # 1. nothing called verified that is not
    for name, edit in {
        "imports-only": lambda d: d.update(stages=d["stages"][:1]),
        "other-image": lambda d: d["image"].update(ref="stackproof/other:1"),
        "image-not-digest": lambda d: d["image"].update(id="latest"),
        "stage-failed": lambda d: d["stages"][3].update(status="FAIL"),
    }.items():
        add(
            "1",
            f"report-pass-{name}",
            report,
            (0,),
            files={"runs/r/receipt.json": _receipt_with(edit)},
            refute=not_pass,
        )
    for name, gap in {"nan": "NaN", "negative": "-5.0", "infinite": "Infinity"}.items():
        add("1", f"compare-gap-{name}", compare, (1, 2), r"b/greedy\.json",
            files={"a/greedy.json": good, "b/greedy.json": _greedy(gap)}, refute=("out.txt", "near-tie"))  # fmt: skip
    add("1", "compare-duplicate-index", compare, (1, 2), r"b/greedy\.json",
        files={"a/greedy.json": good.replace(b'"z"', b'"y"'), "b/greedy.json": _greedy("3.0", duplicate=True)},
        refute=("out.txt", "agree on every token"))  # fmt: skip
    # 2. files and secrets stay where they belong
    outside = _receipt_with(lambda d: d["stages"][1]["artifacts"].update(server_log="{DIR}/runs/r/../../secret.log"))
    leaked = {"runs/r/receipt.json": outside, "secret.log": CANARY.encode()}
    add("2", "report-dotdot-artifact", report, (0,), files=leaked, forbid=CANARY)
    freeze = f"vllm==0.28.0\nflashinfer-python @ https://bob:{CANARY}@internal.example/fi-0.6.18-py3-none-any.whl\n"
    freeze += f"foo @ git+https://{CANARY}x@github.com/x/foo@v1\n"
    m = ["--matrix", "{DIR}/m.yaml", "--images", str(REPO / "images")]
    add("2", "repro-freeze-credentials", ["repro", "{DIR}/f.txt", *m, "--offline", "--arch", "sm90"], (0, 2),
        files={"f.txt": freeze.encode(), **VALID_FILES}, forbid=CANARY)  # fmt: skip
    add("2", "repro-freeze-credentials-write", ["repro", "{DIR}/f.txt", *m, "--offline", "--arch", "sm90", "--write"],
        (0, 2), files={"f.txt": freeze.encode(), "m.yaml": _PROJECT_MATRIX}, forbid=CANARY)  # fmt: skip
    secrets = {"HF_TOKEN": CANARY, "PIP_INDEX_URL": f"https://u:{CANARY}@x/s"}
    doctor = json.dumps({"schema_version": 1, "env": secrets})
    add("2", "doctor-input-secrets", ["doctor", "--input", "{DIR}/d.json", *m], (0, 1, 2),
        files={"d.json": doctor.encode(), **VALID_FILES}, forbid=CANARY)  # fmt: skip
    add("2", "load-url-credentials", ["load", "--url", f"http://u:{CANARY}@127.0.0.1:{{PORT}}/ok", "--questions", "2",
        "--concurrency", "1", "--max-tokens", "2", "--determinism-repeats", "0", "--out", "{DIR}/o"], (0, 1, 2),
        forbid=CANARY, timeout=60)  # fmt: skip
    # 3. waits without an end
    add("3", "inspect-log-fifo", ["inspect", "log", "{DIR}/fifo"], (2,), r"fifo", fifos=("fifo",), timeout=10)
    add("3", "repro-fifo", ["repro", "{DIR}/fifo", *m, "--offline"], (2,), r"fifo", fifos=("fifo",),
        files=VALID_FILES, timeout=10)  # fmt: skip
    patho = b"INFO start\n" + b"No tuned config covers x input_shapes=; falling back to runner=" * 20_000 + b"\n"
    add(
        "3",
        "signature-pathological-line",
        ["inspect", "log", "{DIR}/l.log"],
        (0, 1),
        files={"l.log": patho},
        timeout=10,
    )
    # 3. and 4. a server whose answers do not end: `load` stops at --duration plus its grace
    # (--chunk-timeout + 10 s), each stream within max_tokens chunks and a byte cap, each scrape and
    # models answer within a byte cap (verify/serving/openai.py)
    hostile_load = ["--questions", "2", "--concurrency", "2", "--determinism-repeats", "0", "--duration", "5",
                    "--chunk-timeout", "3", "--out", "{DIR}/o"]  # fmt: skip
    for klass, mode, tokens, expect in (
        ("3", "forever", "2", (1,)),
        ("3", "dribble", "200", (1,)),
        ("4", "long-line", "2", (1,)),
        ("3", "million-series", "2", (0, 1)),
        ("4", "endless-models", "2", (1,)),
        ("4", "endless-error", "2", (1,)),
    ):
        add(klass, f"load-server-{mode}", ["load", "--url", f"http://127.0.0.1:{{PORT}}/{mode}", "--max-tokens",
            tokens, *hostile_load], expect, r"127\.0\.0\.1", timeout=40)  # fmt: skip
    # 4. unbounded memory: an endless input given as each file the tool reads
    for name, argv in {
        "autotune": ["inspect", "autotune", "/dev/zero"],
        "log": ["inspect", "log", "/dev/zero"],
        "questions": [
            "load",
            "--url",
            "http://127.0.0.1:{PORT}/ok",
            "--questions-file",
            "/dev/zero",
            "--out",
            "{DIR}/o",
        ],
        "doctor-input": ["doctor", "--input", "/dev/zero", *m],
        "compare": ["compare", "/dev/zero", "/dev/zero"],
        "report": ["report", "--receipts", "/dev/zero", "--out", "{DIR}/site"],
        "repro": ["repro", "/dev/zero", *m, "--offline"],
    }.items():
        add("4", f"dev-zero-{name}", argv, (2,), r"/dev/zero", files=VALID_FILES, timeout=20)
    # 3. the matrix read through the bounded reader (a FIFO waited for a writer); the other reads moved
    # onto it this stop are tests/unit/test_bounded_reads.py's
    add("3", "matrix-fifo", ["matrix", "list", "--matrix", "{DIR}/fifo"], (2,), r"fifo", fifos=("fifo",), timeout=10)
    # 5. tracebacks: receipt fields of the wrong type, TeX specials, a vanishing rate
    for name, edit in {
        "seconds-string": lambda d: d.update(seconds="long"),
        "runtime-list": lambda d: d.update(runtime=[1]),
        "checks-map": lambda d: d["stages"][0].update(checks={"a": 1}),
        "artifacts-list": lambda d: d["stages"][0].update(artifacts=[1]),
        "load-events-map": lambda d: d["load"].update(events={"a": 1}),
        "autotune-n-string": lambda d: d.update(autotune=[{"op": "o", "n": "x", "k": 1, "rows": []}]),
    }.items():
        add(
            "5",
            f"report-type-{name}",
            report,
            (2,),
            r"receipt\.json: ",
            files={"runs/r/receipt.json": _receipt_with(edit)},
        )
    tex = _receipt_with(lambda d: d.update(arm="$\\frac{a}{b}$^_%"))
    add("5", "report-tex-specials", report, (0,), files={"runs/r/receipt.json": tex})
    for rate in ("1e-320", "5e-324", "0.9999999999999999"):
        add(
            "5", f"stats-rate-{rate}", ["stats", "--baseline-rate", rate, "--questions", "10"], (2,), r"--baseline-rate"
        )
    # 3. and 6. the older suite's shapes (issue 27 names them): a 10 MB one-line file to repro (exit 2,
    # its error cut, not the line echoed whole), an empty, a binary and a huge-line log, a
    # Jinja-looking description (a valid matrix: rendered, never evaluated), the signature inputs
    ten_mb = {"src.txt": b"vLLM: " * (10_000_000 // 6), **VALID_FILES}
    add("3", "repro-10mb-one-line", ["repro", "{DIR}/src.txt", *m, "--offline"], (2,), r"src\.txt:1: ",
        files=ten_mb, timeout=60)  # fmt: skip
    for name, data in {"empty": b"", "binary": bytes(range(256)) * 64}.items():
        add("6", f"inspect-log-{name}", ["inspect", "log", "{DIR}/l.log", "--json"], (2,), r"l\.log",
            files={"l.log": data})  # fmt: skip
    add("4", "inspect-log-huge-line", ["inspect", "log", "{DIR}/l.log"], (0, 1),
        files={"l.log": b"ERROR " + b"x" * 20_000_000 + b"\n"}, timeout=60)  # fmt: skip
    described = '    base: img\n    description: "{{ 7*7 }} {% if x %}{{ lipsum }}{% endif %} {#"\n'
    jinja = VALID.replace("    base: img\n", described)
    add("6", "render-jinja-description", ["render", *m, "--out", "{DIR}/o"], (0,),
        files={"m.yaml": jinja.encode()}, refute=("o/a/Dockerfile", r"\b49\b"))  # fmt: skip
    pull = ["pull", "cpu-tiny", "--registry", "127.0.0.1:9/stackproof", *m]
    add("4", "pull-key-dev-zero", [*pull, "--key", "/dev/zero"], (2,), r"--key /dev/zero", files=VALID_FILES)
    add("3", "pull-key-fifo", [*pull, "--key", "{DIR}/fifo"], (2,), r"--key .*fifo", fifos=("fifo",),
        files=VALID_FILES, timeout=10)  # fmt: skip
    # 6. the exit-code and JSON contract
    add(
        "6", "usage-error-json", ["stats", "--questions", "x", "--baseline-rate", "1/450", "--json"], (2,), r"questions"
    )
    add("6", "compare-nan-json", [*compare, "--json"], (1, 2), r"b/greedy\.json",
        files={"a/greedy.json": good, "b/greedy.json": _greedy("NaN")})  # fmt: skip
    return cases


PERFDOCS = REPO / "tests" / "fixtures" / "perfdocs"


def _perfdoc(name: str, edit: Any, *, raw: tuple[str, str] | None = None) -> bytes:
    document = json.loads((PERFDOCS / f"{name}.json").read_text())
    edit(document)
    text = json.dumps(document)
    return (text.replace(*raw) if raw else text).encode()


def _surface_cases() -> list[Case]:
    """Issue 43: the surfaces added since issue 27 (A/B, bisect, sweep, propose, the host runtime,
    the console); class `43.N` is the issue's class N. A closed or full stdout needs a real process:
    benchmarks/hostile_inputs.py's PROCESS_CASES and tests/unit/test_reliability_surfaces.py."""
    cases: list[Case] = []

    def add(klass: str, name: str, argv: list[str], expect: tuple[int, ...], located: str = "", **kw: Any) -> None:
        cases.append(Case(id=f"i43-{klass}-{name}", argv=argv, expect=expect, located=located, klass=f"43.{klass}",
                          **kw))  # fmt: skip

    m = ["--matrix", "{DIR}/m.yaml", "--images", str(REPO / "images")]
    doctor = json.loads((REPO / "tests" / "fixtures" / "doctor" / "cpu-tiny-container.json").read_text())
    # 1. quadratic work: a 300 kB environment value through the redaction of every printed line
    # (main: no answer in 100 s), nested ARGs (billion laughs) and a long `${V%%pat}` in a Dockerfile
    long_env = json.dumps({**doctor, "env_extra": {"VLLM_LONG": "a" * 300_000, "VLLM_DOTS": "a." * 150_000}})
    add("1", "doctor-long-env", ["doctor", "--input", "{DIR}/d.json", *m], (0,),
        files={"d.json": long_env.encode(), **VALID_FILES}, timeout=60)  # fmt: skip
    laughs = "FROM x\nARG A0=xxxxxxxxxx\n"
    laughs += "".join(f"ARG A{i}=" + f"${{A{i - 1}}}" * 4 + "\n" for i in range(1, 40))
    nowhere = {"STACKPROOF_MIRRORS": "pypi=http://127.0.0.1:9/s"}  # a late check would ask it: exit 3
    refresh = ["matrix", "pins", "refresh", "vllm==0.28.0", *m, "--dockerfile"]
    add("1", "dockerfile-billion-laughs", [*refresh, "{DIR}/Dockerfile"], (2,), r"Dockerfile:7: ",
        files={"Dockerfile": laughs.encode(), **VALID_FILES}, env=nowhere)  # fmt: skip
    quadratic = f'FROM x\nARG V={"a" * 200_000}\nRUN X="${{V%%*a*b}}"\n'
    add("1", "dockerfile-long-cut", [*refresh, "{DIR}/Dockerfile"], (2,), r"Dockerfile:2: ",
        files={"Dockerfile": quadratic.encode(), **VALID_FILES}, env=nowhere)  # fmt: skip
    # 5. arguments checked before anything starts (no docker daemon here: a late check is exit 3)
    add("5", "sweep-axis-past-cap", ["sweep", "a", "--sweep", "concurrency=1,1000000000", *m], (2,), r"--sweep",
        files=VALID_FILES)  # fmt: skip
    add("5", "ab-slice-nanosecond", ["ab", "a", "a", "--slice", "1e-9", *m], (2,), r"--slice", files=VALID_FILES)
    add("5", "sweep-slice-a-week", ["sweep", "a", "--sweep", "concurrency=1,2", "--slice", "604800", *m], (2,),
        r"--slice", files=VALID_FILES)  # fmt: skip
    for name, package in {"package-path": "../../etc", "package-empty": ""}.items():
        add("5", f"bisect-{name}", ["bisect", "a", "--package", package, "--good", "1.0", "--bad", "2.0", *m], (2,),
            r"--package", files=VALID_FILES)  # fmt: skip
    probe = ["probe", "kernels", "--host", "--python", sys.executable, "--config", "{DIR}/c.json", "--out", "{DIR}/o"]
    add("5", "probe-kernels-missing-modules", [*probe, *m], (3,), r"flashinfer",
        files={"c.json": b"{}", **VALID_FILES})  # fmt: skip
    # 6. the documents `report` reads back: Infinity, a 5,000-digit integer, a string for a count
    report = ["report", "--receipts", "{DIR}/runs", "--out", "{DIR}/site"]
    for name, doc, edit, raw in (
        ("ab-infinity", "ab", lambda d: d["config"].update(slice_s="INF"), ('"INF"', "Infinity")),
        ("ab-huge-integer", "ab", lambda d: d["config"].update(pairs="BIG"), ('"BIG"', "9" * 5000)),
        ("ab-faults-string", "ab", lambda d: d["faults"].update(A="many"), None),
        ("sweep-huge-integer", "sweep", lambda d: d["points"][0].update(questions="BIG"), ('"BIG"', "9" * 5000)),
        ("bisect-infinity", "bisect", lambda d: d.update(threshold="INF"), ('"INF"', "-Infinity")),
    ):
        add(
            "6",
            f"report-{name}",
            report,
            (2,),
            rf"{doc}\.json",
            files={f"runs/x/{doc}.json": _perfdoc(doc, edit, raw=raw), "runs/r/receipt.json": _receipt_with(str)},
        )
    # 7. escape sequences from a reporter's file never reach the terminal (main: four raw ESCs)
    escapes = {**doctor, "env_extra": {"VLLM_TITLE": "\x1b]0;owned\x07\x1b[2J"}}
    escapes["host"] = {**doctor["host"], "os": "Debian \x1b]0;owned\x07"}
    add("7", "doctor-input-escapes", ["doctor", "--input", "{DIR}/d.json", *m], (0,),
        files={"d.json": json.dumps(escapes).encode(), **VALID_FILES}, forbid="\x1b")  # fmt: skip
    # 8. an index or registry that cannot answer is exit 3: a mirror answering 500, one unreachable,
    # a registry answering a byte a second (given up at the rate floor, not after 300 s)
    for name, mirror in {"mirror-500": "http://127.0.0.1:{PORT}/status-500/simple", "mirror-unreachable":
                         "http://127.0.0.1:9/simple"}.items():  # fmt: skip
        add("8", f"pins-refresh-{name}", ["matrix", "pins", "refresh", "vllm==0.28.0", *m], (3,), r"could not answer",
            files=VALID_FILES, env={"STACKPROOF_MIRRORS": f"pypi={mirror}"}, timeout=60)  # fmt: skip
    add("8", "registry-dribble", ["pull", "a", "--registry", "127.0.0.1:{PORT}/stackproof", *m], (3,),
        r"bytes/s", files=VALID_FILES, timeout=60, needs_docker=True)  # fmt: skip
    return cases


CASES = [*_matrix_cases(), *_cli_cases(), *_file_cases(), *_server_cases(), *_reliability_cases(), *_surface_cases()]


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    root = tmp_path_factory.mktemp("fuzz")
    documents = []
    for n, case in enumerate(CASES):
        directory = root / f"c{n:03d}"
        directory.mkdir()
        for name, data in case.files.items():
            (directory / name).parent.mkdir(parents=True, exist_ok=True)
            (directory / name).write_bytes(data.replace(b"{DIR}", str(directory).encode()))
        for name in case.fifos:
            os.mkfifo(directory / name)
        documents.append(
            {
                "id": case.id,
                "argv": [a.replace("{DIR}", str(directory)) for a in case.argv],
                "stdin": case.stdin,
                "timeout": case.timeout,
                "env": case.env,
            }
        )
    (root / "cases.json").write_text(json.dumps(documents))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STACKPROOF_", "HTTP", "http", "ALL_", "all_"))}
    env |= {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "NO_PROXY": "127.0.0.1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).with_name("fuzz_driver.py")),
            str(root / "cases.json"),
            str(root / "out.json"),
        ],
        cwd=REPO,
        env=env,
        preexec_fn=_limit_memory,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    out: dict[str, dict[str, Any]] = json.loads((root / "out.json").read_text())
    if os.environ.get("STACKPROOF_FUZZ_RESULTS"):  # keep what every case did, for a person to read
        Path(os.environ["STACKPROOF_FUZZ_RESULTS"]).write_text(json.dumps(out, indent=1))
    for n, case in enumerate(CASES):
        out[case.id]["dir"] = str(root / f"c{n:03d}")
    return out


def test_the_suite_is_large_enough() -> None:
    assert len(CASES) >= 250 and len({c.id for c in CASES}) == len(CASES)


@functools.cache
def _docker_answers() -> bool:
    try:
        return subprocess.run(["docker", "version"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.slow  # one child process runs all ~430 cases: about 30 s, most of it real deadlines
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input(case: Case, results: dict[str, dict[str, Any]]) -> None:
    if case.needs_docker and not _docker_answers():
        pytest.skip("needs a docker daemon (`.ci/setup` starts one): pull asks docker before the registry")
    result = results[case.id]
    assert result["traceback"] is None, result["traceback"]
    assert not result["hang"], f"no answer within {case.timeout}s"
    assert "Traceback (most recent call last)" not in result["stderr"]
    assert result["code"] in case.expect, f"exit {result['code']}, expected {case.expect}: {result['stderr'][-2000:]}"
    if result["code"] != 0 and case.located:
        pattern = case.located.replace("{DIR}", re.escape(result["dir"]))
        assert re.search(pattern, result["stderr"]), f"not located by {pattern!r}: {result['stderr'][-2000:]}"
    if "--json" in case.argv:
        document = json.loads(result["stdout"])  # strict: no NaN, one document
        json.dumps(document, allow_nan=False)
        if result["code"] not in (0, 1):
            assert document["error"]["exit_code"] == result["code"]
    for problem in reliability_problems(case, result):
        pytest.fail(problem)


def reliability_problems(case: Case, result: dict[str, Any]) -> list[str]:
    """What issue 27's judgement adds: no canary anywhere, no false PASS (also benchmarks/hostile_inputs.py)."""
    problems = []
    directory = Path(result["dir"])
    if case.forbid:
        if case.forbid in result["stdout"] + result["stderr"]:
            problems.append(f"{case.forbid} printed")
        for path in directory.rglob("*"):
            relative = path.relative_to(directory).as_posix()
            original = case.files.get(relative, b"").replace(b"{DIR}", str(directory).encode())
            data = path.read_bytes() if path.is_file() else b""
            if data != original and case.forbid.encode() in data:
                problems.append(f"{case.forbid} written to {path.relative_to(directory)}")
    if case.refute is not None:
        name, pattern = case.refute
        target = directory / name
        text = result["stdout"] if name == "out.txt" else (target.read_text() if target.is_file() else "")
        if re.search(pattern, text):
            problems.append(f"{name} matches {pattern!r}: a false verification")
    return problems


# -- what needs a real process: a closed pipe, stdin ---------------------------------------------------


def _cli(args: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("STACKPROOF_MIRRORS", None)
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args], cwd=REPO, env=env, preexec_fn=_limit_memory, text=True, **kw
    )


def test_a_closed_pipe_is_no_traceback(tmp_path: Path) -> None:
    """`stackproof matrix list --json | head`: the reader goes away after a few bytes."""
    cells = "".join(f"  - {{id: c{i}, base: img, platform: linux/amd64, arch: none}}\n" for i in range(3000))
    (tmp_path / "m.yaml").write_text(VALID.split("cells:\n")[0] + "cells:\n" + cells)
    shell = f"{sys.executable} -m pipeline matrix list --json --matrix {tmp_path / 'm.yaml'} | head -c 100 >/dev/null"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {shell}"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    assert proc.returncode in (0, 141)


def test_repro_reads_stdin(tmp_path: Path) -> None:
    source = (REPO / "tests" / "fixtures" / "repro" / "rtx-pro-6000-env-block.md").read_text()
    proc = _cli(["repro", "-", "--offline", "--json"], input=source, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["id"]
