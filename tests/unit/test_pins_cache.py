"""Release pins for a release missing from the table: fetched once, kept on disk, an unreachable
index asked once per command.

pip itself (`fetch_metadata`) asks a stand-in index served by `http.server` on 127.0.0.1, which
counts the requests it gets. Its wheels are tiny stand-ins whose METADATA carries the real
Requires-Dist of the vllm 0.33.0 wheel and of torch 2.14.0 (tests/fixtures/pins), under the version
0.31.0 so that the release-pin table (which has 0.33.0) does not answer first.
"""

from __future__ import annotations

import http.server
import json
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.releases.pins import ReleaseLookup

REPO = Path(__file__).resolve().parents[2]
METADATA = json.loads((REPO / "tests" / "fixtures" / "pins" / "pypi-metadata-vllm-0.33.0.json").read_text())
WHEELS = {
    "vllm": ("0.31.0", "cp38-abi3-manylinux_2_28_x86_64", METADATA["vllm"]["linux/amd64"]["requires_dist"]),
    "torch": ("2.14.0", "cp312-cp312-manylinux_2_28_x86_64", METADATA["torch"]["linux/amd64"]["requires_dist"]),
}


def _wheel(directory: Path, name: str, version: str, tag: str, requires: list[str]) -> str:
    filename = f"{name}-{version}-{tag}.whl"
    info = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {line}\n" for line in requires)
    with zipfile.ZipFile(directory / filename, "w") as wheel:
        wheel.writestr(f"{info}/METADATA", metadata)
        wheel.writestr(f"{info}/WHEEL", f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {tag}\n")
        wheel.writestr(f"{info}/RECORD", "")
    return filename


@pytest.fixture
def index(tmp_path: Path) -> Iterator[tuple[str, list[str], dict[str, Any]]]:
    """(simple index URL, the request paths it received, a switch: {"down": True} answers 503)."""
    root = tmp_path / "index"
    for name, (version, tag, requires) in WHEELS.items():
        (root / "simple" / name).mkdir(parents=True)
        filename = _wheel(root / "simple" / name, name, version, tag, requires)
        (root / "simple" / name / "index.html").write_text(f'<a href="{filename}">{filename}</a>\n')
    requests: list[str] = []
    state: dict[str, Any] = {"down": False}

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(root), **kwargs)

        def do_GET(self) -> None:
            requests.append(self.path)
            if state["down"]:
                self.send_error(503, "down for the test")
                return
            super().do_GET()

        def do_HEAD(self) -> None:
            requests.append(self.path)
            super().do_HEAD()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple", requests, state
    finally:
        server.shutdown()
        server.server_close()


def test_a_second_command_asks_no_index(index: tuple[str, list[str], dict[str, Any]], tmp_path: Path) -> None:
    url, requests, _ = index
    first = ReleaseLookup(online=True, cache=tmp_path / "cache", index_url=url)
    pins, source = first("0.31.0", "linux/amd64")
    assert pins is not None, source
    assert "fetched now" in source and first.asked == 2  # vllm, then the torch it pins
    assert (pins.get("flashinfer-python"), pins.get("nvidia-cudnn-cu13")) == ("0.7.2.post1", "9.24.0.43")
    asked = len(requests)
    assert asked >= 2
    second = ReleaseLookup(online=True, cache=tmp_path / "cache", index_url=url)  # the next command
    again, source = second("0.31.0", "linux/amd64")
    assert again is not None and again.pins == pins.pins and "kept by an earlier command" in source
    assert second.asked == 0 and len(requests) == asked


def test_an_unreachable_index_is_asked_once_per_command(
    index: tuple[str, list[str], dict[str, Any]], tmp_path: Path
) -> None:
    url, requests, state = index
    state["down"] = True
    lookup = ReleaseLookup(online=True, cache=tmp_path / "cache", index_url=url)
    pins, source = lookup("0.31.0", "linux/amd64")
    assert pins is None and "pins unknown" in source
    after_first = len(requests)
    assert after_first >= 1
    for version, platform in (("0.31.0", "linux/arm64"), ("0.32.0", "linux/amd64"), ("0.30.0", "linux/arm64")):
        pins, source = lookup(version, platform)
        assert pins is None and "asked once in this command" in source
    assert lookup.asked == 1 and len(requests) == after_first
    # The next command asks again (the index may be back), and nothing was cached from the failure.
    state["down"] = False
    pins, _ = ReleaseLookup(online=True, cache=tmp_path / "cache", index_url=url)("0.31.0", "linux/amd64")
    assert pins is not None and len(requests) > after_first


AUDIT_MATRIX = """\
schema_version: 1
indexes:
  pypi: {url: "http://127.0.0.1:9/simple"}
  flashinfer: {url: "http://127.0.0.1:9/whl"}
  flashinfer-cu130: {url: "http://127.0.0.1:9/whl/cu130"}
bases:
  vllm-openai-0.28.0: {image: "vllm/vllm-openai:v0.28.0", python: python3}
cells:
  - id: release
    base: vllm-openai-0.28.0
    platform: linux/amd64
    arch: sm120
    runner: [self-hosted, gpu]
    serve:
      model: {source: "hf:org/model", revision: "0123456789abcdef0123456789abcdef01234567"}
      readiness_timeout: 900
      shm_size: 8g
      gpus: all
  - id: fix
    extends: release
    overrides:
      flashinfer-python: {version: "0.6.18.post1", index: pypi}
      flashinfer-jit-cache: {version: "0.6.18.post1+cu130", index: flashinfer-cu130}
  - id: fix-arm
    extends: fix
    platform: linux/arm64
    arch: sm121
"""


@pytest.mark.slow
def test_the_audit_asks_an_unreachable_wheel_index_once(
    index: tuple[str, list[str], dict[str, Any]], tmp_path: Path
) -> None:
    """Three cells, three different jit-cache requests (two versions, two platforms) on one index
    that answers 503: one pip run reaches it, the rest are not checkable without asking."""
    from pipeline.matrix.read import load_matrix
    from tests.unit.test_audit_cell import wheel
    from verify.audit import Sources, audit_matrix

    url, requests, state = index
    state["down"] = True
    links = tmp_path / "links"
    links.mkdir()
    wheel(links, "vllm", "0.28.0", {"vllm/envs.py": "import os\n"})
    for version in ("0.6.16.post3", "0.6.18.post1"):
        wheel(links, "flashinfer-python", version, {"flashinfer/__init__.py": "print('hello')\n"})
    wheel(links, "uvicorn", "0.54.0", {"uvicorn/on.py": 'logger.info("Application startup complete.")\n'})
    (tmp_path / "matrix.yaml").write_text(AUDIT_MATRIX)
    matrix = load_matrix(tmp_path / "matrix.yaml", images_dir=REPO / "images")
    sources = Sources(root=tmp_path / "cache", index_url=lambda n: ("local", links) if n == "pypi" else (url, None))
    report = audit_matrix(
        matrix,
        matrix.cells,
        sources=sources,
        lookup=ReleaseLookup(online=False),
        rulesets=lambda facts: [],
        signatures=[],
        progress=lambda line: None,
    )
    jit = [next(p for p in c.packages if p.name == "flashinfer-jit-cache") for c in report.cells]
    assert [p.version for p in jit] == ["0.6.16.post3+cu130", "0.6.18.post1+cu130", "0.6.18.post1+cu130"]
    assert all(p.status == "not-checkable" for p in jit)
    assert "cannot be reached" in jit[0].note and "No matching distribution" not in jit[0].note
    assert all("not asked again in this audit" in p.note for p in jit[1:])
    assert len({r for r in requests}) == 1  # one pip run: /simple/flashinfer-jit-cache/ (and its retry)
