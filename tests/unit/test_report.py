"""`stackproof report`: receipts -> the site's model, pages and index.json; bad input exits 2, located.

Rendered from the real cpu-tiny run directories in tests/fixtures/receipts (see its README); the
real H200 host-runtime receipts (tests/fixtures/h200-vllm-0.26.0/receipts) fill an "H200 (sm90)"
column where a test reads them. Every other GPU square stays "not verified".
"""

from __future__ import annotations

import copy
import json
import re
import signal
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from pipeline.errors import InputError
from pipeline.host.geometry import HostFingerprint
from stackproof.cli import main
from stackproof.site_report import plots
from stackproof.site_report.model import ORIGIN_RECEIPT_ONLY, build_site, parse_receipt, winner_changes
from stackproof.site_report.render import render_site, slug
from stackproof.site_report.sources import receipts_from_dirs, receipts_from_registry

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
PASS_RUN = FIXTURES / "receipts/cpu-tiny-pass/cpu-tiny/run-20261201T181931"
PARTIAL_RUN = FIXTURES / "receipts/cpu-tiny-imports-only/cpu-tiny/run-20261201T182001"


@pytest.fixture(autouse=True)
def _signals(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("STACKPROOF_MATRIX", raising=False)
    handler = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, handler)


def _doc(run: Path = PASS_RUN) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((run / "receipt.json").read_text())
    return document


def _receipt(document: dict[str, Any], source: str = "r.json") -> Any:
    return parse_receipt(document, source=source, origin=ORIGIN_RECEIPT_ONLY)


# -- the model -------------------------------------------------------------------------------------


def test_a_real_run_directory_gives_its_receipt_and_raw_series() -> None:
    [receipt] = receipts_from_dirs([PASS_RUN])
    document = _doc()
    assert receipt.status == "PASS" and receipt.cell == "cpu-tiny" and receipt.host.arch == "cpu"
    assert receipt.tok_s == document["load"]["throughput"]["output_tok_s"]
    assert receipt.latency("ttft", "p50") == document["load"]["latency_ms"]["ttft"]["p50"]
    # The raw series come from the run directory, although the receipt names the original run's /tmp paths.
    assert PASS_RUN not in Path(document["stages"][3]["artifacts"]["requests"]).parents
    assert receipt.raw is not None
    requests = [json.loads(line) for line in (PASS_RUN / "load/requests.jsonl").read_text().splitlines()]
    assert len(receipt.raw.ttft_ms) == sum(1 for r in requests if r["kind"] == "load" and not r["error_class"])
    assert len(receipt.raw.timeline) == len((PASS_RUN / "load/scrapes.jsonl").read_text().splitlines())
    assert set(receipt.files) == {"junit.xml", "summary.md", "server.log"}


def test_a_receipt_alone_has_no_raw_series() -> None:
    receipt = _receipt(_doc())
    assert receipt.raw is None and receipt.files == {}


def test_a_known_bad_cell_that_failed_is_expected_failure_seen_and_a_plain_fail_is_not() -> None:
    known_bad = _doc()
    known_bad.update(status="FAIL", outcome={**known_bad["outcome"], "expected_failure": "imports: as declared"})
    assert _receipt(known_bad).status == "EXPECTED_FAIL"
    plain = _doc()
    plain.update(status="FAIL", outcome={**plain["outcome"], "expected_failure": None})
    assert _receipt(plain).status == "FAIL"


def test_empty_squares_say_not_verified_and_are_never_filled() -> None:
    receipts = receipts_from_dirs([PASS_RUN])
    site = build_site(receipts, cells=["cpu-tiny", "sm120-vllm-0.28.0-release"])
    [host] = site.hosts
    assert site.square("cpu-tiny", host).receipt is not None
    assert site.square("sm120-vllm-0.28.0-release", host).receipt is None
    files = render_site(site, generated_at="2026-12-01T00:00:00Z")
    index = json.loads(files["index.json"])
    statuses = {(s["cell"], s["status"]) for s in index["squares"]}
    assert statuses == {("cpu-tiny", "PASS"), ("sm120-vllm-0.28.0-release", "NOT_VERIFIED")}
    assert "not verified" in files["index.html"].decode()


def test_a_full_run_is_the_square_over_a_later_partial_one_and_a_partial_alone_shows() -> None:
    both = build_site(receipts_from_dirs([FIXTURES / "receipts"]))
    [host] = both.hosts
    square = both.square("cpu-tiny", host)
    assert square.receipt is not None and square.receipt.status == "PASS" and square.others == 1
    partial = build_site(receipts_from_dirs([PARTIAL_RUN]))
    only = partial.square("cpu-tiny", partial.hosts[0]).receipt
    assert only is not None and only.status == "INCONCLUSIVE"


def test_the_same_receipt_found_twice_is_one_receipt() -> None:
    site = build_site(receipts_from_dirs([PASS_RUN, PASS_RUN / "receipt.json"]))
    assert len(site.receipts) == 1


def test_compare_names_changed_winners_and_pins_and_nothing_when_equal() -> None:
    table = [{"op": "fp8_gemm", "n": 5120, "k": 4096, "rows": [{"m_bucket": 512, "runner": "CutlassFp8GemmRunner"}]}]
    a_doc = {**_doc(), "autotune": table}
    b_doc = copy.deepcopy(a_doc)
    b_doc["autotune"][0]["rows"][0]["runner"] = "CudnnFp8GemmRunner"
    b_doc["started_at"] = "2026-12-02T00:00:00Z"
    a, b = _receipt(a_doc), _receipt(b_doc)
    assert winner_changes(a, b) == [("fp8_gemm", 5120, 4096, 512, "CutlassFp8GemmRunner", "CudnnFp8GemmRunner")]
    assert winner_changes(a, a) == []
    site = build_site([a, b])
    [compare] = site.compares["cpu-tiny"]
    assert compare.why == "two dates" and compare.a is a and compare.b is b
    page = render_site(site, generated_at="now")[f"compare/cpu-tiny/{compare.id}.html"].decode()
    assert "CudnnFp8GemmRunner" in page and "changed" in page


# -- pages -----------------------------------------------------------------------------------------


def test_pages_show_the_receipts_numbers_and_link_every_file() -> None:
    site = build_site(receipts_from_dirs([FIXTURES / "receipts"]))
    files = render_site(site, generated_at="now")
    [full] = [r for r in site.receipts if r.status == "PASS"]
    index, cell = files["index.html"].decode(), files["cells/cpu-tiny.html"].decode()
    assert "1,512.6 tok/s" in index and "TTFT p50 71.2 ms" in index and "vllm 0.28.0+cpu" in index
    assert "1,512.621" in cell and "71.155" in cell and "408.660" in cell  # tok/s, TTFT p50, TTFT p99
    assert "9 greedy samples identical" in cell  # determinism
    for link in re.findall(r'href="\.\./([^"#]+)"', cell):
        assert link in files, link  # every link of the cell page resolves inside the site
    assert json.loads(files[f"receipts/{full.id}/receipt.json"]) == full.document
    assert files[f"receipts/{full.id}/server.log.txt"] == (PASS_RUN / "server.log").read_bytes()
    index_doc = json.loads(files["index.json"])
    assert index_doc["kind"] == "stackproof.report-index"
    assert index_doc["squares"][0]["output_tok_s"] == 1512.621


def test_plots_have_text_alternatives_and_ids_unique_in_their_page() -> None:
    files = render_site(build_site(receipts_from_dirs([PASS_RUN])), generated_at="now")
    cell = files["cells/cpu-tiny.html"].decode()
    assert cell.count("<svg") == 2  # latency distributions, engine-progress timeline (one receipt: no bars)
    assert cell.count('role="img"') == 2 and cell.count("<title id=") == 2 and cell.count("<desc id=") == 2
    ids = re.findall(r'\bid="([^"]+)"', cell)
    assert len(ids) == len(set(ids))
    assert "Cumulative distributions of TTFT (194 requests)" in cell


def test_one_receipt_shows_its_numbers_in_the_table_and_two_get_the_bar_chart() -> None:
    one = render_site(build_site([_receipt(_doc())]), generated_at="now")["cells/cpu-tiny.html"].decode()
    assert "Throughput and TTFT" not in one, "a bar chart of one bar compares nothing"
    assert ">1,512.6<" in one, "the single value is shown as a number"
    other = _doc()
    other["arm"] = "b"
    two = build_site([_receipt(_doc()), _receipt(other, source="b.json")])
    assert "Throughput and TTFT" in render_site(two, generated_at="now")["cells/cpu-tiny.html"].decode()


@pytest.mark.parametrize(("in_flight", "top"), [([6, 7, 6, 5], 8.0), ([], 1.0), ([0, 0], 1.0)])
def test_the_in_flight_axis_starts_at_zero(in_flight: list[int], top: float) -> None:
    assert plots.in_flight_limits(in_flight) == (0.0, top), "from zero: a drop of one is not a drop to zero"


def test_a_receipt_without_run_directory_says_not_available() -> None:
    files = render_site(build_site([_receipt(_doc())]), generated_at="now")
    cell = files["cells/cpu-tiny.html"].decode()
    assert "not available" in cell and "server log not available" in cell
    assert "71.155" in cell  # the summary's percentiles still show
    receipt_id = _receipt(_doc()).id
    assert f"receipts/{receipt_id}/junit.xml" in files  # rendered from the receipt itself


def test_autotune_winners_draw_a_heatmap_with_its_table() -> None:
    table = [
        {"op": "fp8_gemm", "n": 5120, "k": 4096, "rows": [{"m_bucket": m, "runner": r, "tactic": 0}]}
        for m, r in ((1, "CublasFp8GemmRunner"), (512, "CudnnFp8GemmRunner"))
    ]
    files = render_site(build_site([_receipt({**_doc(), "autotune": table})]), generated_at="now")
    cell = files["cells/cpu-tiny.html"].decode()
    assert "Autotune winners:" in cell and "CudnnFp8GemmRunner wins 1 bucket(s)" in cell


def test_the_fixture_page_labels_where_each_number_came_from(tmp_path: Path) -> None:
    out = tmp_path / "site"
    assert main(["report", "--receipts", str(PASS_RUN), "--out", str(out), "--fixtures", str(FIXTURES)]) == 0
    page = (out / "fixtures.html").read_text()
    assert "not from receipts" in page
    assert "tests/fixtures/autotune/h200-ministral14b-fi0.6.18.post1-cudnn9.19.json" in page
    assert "684.705" in page  # the NVML busy sample's power
    index = json.loads((out / "index.json").read_text())
    assert all(h["arch"] == "cpu" for h in index["hosts"])  # the H200 fixture is no host of the matrix


# -- the command: good and bad input ---------------------------------------------------------------


def test_report_writes_the_site_and_one_json_document(tmp_path: Path, capsys) -> None:
    out = tmp_path / "site"
    matrix = REPO / "matrix.yaml"
    code = main(
        ["report", "--matrix", str(matrix), "--receipts", str(FIXTURES / "receipts"), "--out", str(out), "--json"]
    )
    assert code == 0
    document = json.loads(capsys.readouterr().out)
    assert document["receipts"] == 2 and document["squares_with_receipt"] == 1
    assert document["cells"] > 1  # the matrix's cells are rows, verified or not
    assert (out / "index.html").is_file() and (out / "style.css").is_file()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", r"receipt\.json:1:2: not JSON"),
        ('{"kind": "other"}', r"receipt\.json: kind: 'other', not 'stackproof\.receipt'"),
        ("[1, 2]", r"receipt\.json: not a receipt \(a JSON list"),
    ],
)
def test_a_broken_receipt_exits_2_located_without_traceback(tmp_path: Path, capsys, content: str, message: str) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "receipt.json").write_text(content)
    assert main(["report", "--receipts", str(tmp_path), "--out", str(tmp_path / "site")]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and "Traceback" not in err
    assert not (tmp_path / "site").exists()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.pop("status"), "status: missing, expected a string"),
        (lambda d: d.update(status="GREEN"), "status: 'GREEN', not one of"),
        (lambda d: d["host"].pop("key"), "host.key: missing"),
        (lambda d: d.update(autotune=[{"op": "fp8_gemm"}]), "autotune[0]: expected {op, n, k, rows}"),
        (lambda d: d.update(stages=[3]), "stages[0]: not a stage object"),
        (lambda d: d.update(schema_version=2), "schema_version: 2; this tool reads 1"),
    ],
)
def test_a_receipt_with_a_wrong_field_names_the_field(edit: Any, message: str) -> None:
    document = _doc()
    edit(document)
    with pytest.raises(InputError) as caught:
        _receipt(document, source="x/receipt.json")
    assert str(caught.value).startswith("x/receipt.json: ") and message in str(caught.value)
    _receipt(_doc(), source="x/receipt.json")  # the unedited receipt parses


def test_a_missing_or_empty_directory_exits_2(tmp_path: Path, capsys) -> None:
    assert main(["report", "--receipts", str(tmp_path / "nope"), "--out", str(tmp_path / "s")]) == 2
    assert "no such directory" in capsys.readouterr().err
    assert main(["report", "--receipts", str(tmp_path), "--out", str(tmp_path / "s")]) == 2
    assert "no receipt.json under it" in capsys.readouterr().err


def test_a_broken_jsonl_beside_a_receipt_is_located(tmp_path: Path, capsys) -> None:
    import shutil

    run = tmp_path / "run-20261201T181931"
    shutil.copytree(PASS_RUN, run)
    (run / "load" / "scrapes.jsonl").write_text('{"t": 1}\n{oops\n')
    assert main(["report", "--receipts", str(tmp_path), "--out", str(tmp_path / "s")]) == 2
    assert "scrapes.jsonl:2: not JSON" in capsys.readouterr().err


# -- a registry (a stand-in distribution API on loopback) ------------------------------------------


class _Registry(BaseHTTPRequestHandler):
    blobs: ClassVar[dict[str, bytes]] = {}
    manifests: ClassVar[dict[str, bytes]] = {}

    def do_GET(self) -> None:
        path = self.path
        if path == "/v2/":
            return self._send(b"{}")
        if path == "/v2/stackproof/tags/list":
            return self._send(json.dumps({"name": "stackproof", "tags": sorted(self.manifests)}).encode())
        if path.startswith("/v2/stackproof/manifests/") and path.rsplit("/", 1)[1] in self.manifests:
            return self._send(self.manifests[path.rsplit("/", 1)[1]], "application/vnd.oci.image.manifest.v1+json")
        if path.startswith("/v2/stackproof/blobs/") and path.rsplit("/", 1)[1] in self.blobs:
            return self._send(self.blobs[path.rsplit("/", 1)[1]])
        self.send_response(404)
        self.end_headers()

    def _send(self, body: bytes, kind: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_receipts_from_a_registry_by_tag_schema_index_and_by_legacy_tag() -> None:
    from pipeline.registry.oci import sha256_digest
    from pipeline.registry.publish import RECEIPT_MEDIA_TYPE

    def artifact(document: dict[str, Any]) -> tuple[str, bytes]:
        body = json.dumps(document).encode()
        _Registry.blobs[sha256_digest(body)] = body
        layer = {"mediaType": RECEIPT_MEDIA_TYPE, "digest": sha256_digest(body), "size": len(body)}
        manifest = json.dumps({"artifactType": RECEIPT_MEDIA_TYPE, "layers": [layer]}).encode()
        _Registry.manifests[sha256_digest(manifest)] = manifest
        return sha256_digest(manifest), manifest

    _Registry.blobs, _Registry.manifests = {}, {}
    other_host = _doc()
    # another host: another driver, so another fingerprint key (the model derives it from the fields)
    other_host["host"] = {**other_host["host"], "driver": "another0host", "summary": "another host"}
    other_host["host"]["key"] = HostFingerprint.parse(other_host["host"]).key
    first, _ = artifact(_doc())
    second, _ = artifact(other_host)
    old_doc = {**_doc(), "started_at": "2026-11-01T00:00:00Z"}
    _, old = artifact(old_doc)
    index = {"manifests": [{"artifactType": RECEIPT_MEDIA_TYPE, "digest": d} for d in (first, second)]}
    _Registry.manifests["sha256-" + "a" * 64] = json.dumps(index).encode()  # the tag schema: two hosts
    _Registry.manifests["sha256-" + "b" * 64 + ".receipt"] = old  # stackproof 0.1's single receipt
    _Registry.manifests["cpu-tiny-verified"] = json.dumps({"layers": []}).encode()  # an image: no receipt
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Registry)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        receipts = receipts_from_registry(f"127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
    assert sorted((r.host.key, r.started_at) for r in receipts) == [
        (other_host["host"]["key"], "2026-12-01T18:19:31Z"),
        ("c765d02eb99f5d13", "2026-11-01T00:00:00Z"),
        ("c765d02eb99f5d13", "2026-12-01T18:19:31Z"),
    ]
    assert all(r.raw is None and r.origin == "registry" for r in receipts)
    assert any("via sha256-" in r.source for r in receipts)


def test_an_unreachable_registry_exits_3(tmp_path: Path, capsys) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Registry)
    port = server.server_address[1]
    server.server_close()  # a port nothing listens on
    assert main(["report", "--registry", f"127.0.0.1:{port}", "--out", str(tmp_path / "s")]) == 3
    assert "unreachable" in capsys.readouterr().err


# -- verify.yml publishes the site ---------------------------------------------------------------


def test_verify_yml_renders_the_registry_site_on_the_default_branch_and_uploads_it() -> None:
    import yaml

    workflow = yaml.safe_load((REPO / ".github/workflows/verify.yml").read_text())
    job = workflow["jobs"]["report"]
    assert "github.event_name != 'pull_request'" in job["if"] and "default_branch" in job["if"]
    assert job["if"].startswith("always()")  # a failed verify job's receipt belongs on the page too
    runs = " ".join(s.get("run", "") for s in job["steps"])
    assert "'.[report]'" in runs and 'stackproof report --registry "$REGISTRY" --out stackproof-site' in runs
    [upload] = [s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert upload["with"]["path"] == "stackproof-site/"


def test_without_matplotlib_the_command_says_what_to_install(tmp_path: Path, capsys, monkeypatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # an import of it now raises ImportError
    assert main(["report", "--receipts", str(PASS_RUN), "--out", str(tmp_path / "s")]) == 3
    assert "pip install 'stackproof[report]'" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()  # nothing half-written


def test_an_out_that_is_a_file_exits_2(tmp_path: Path, capsys) -> None:
    (tmp_path / "file").write_text("x")
    assert main(["report", "--receipts", str(PASS_RUN), "--out", str(tmp_path / "file")]) == 2
    assert "exists and is not a directory" in capsys.readouterr().err


def test_hosts_are_ordered_cpu_first_then_by_compute_capability() -> None:
    def on(name: str, cc: str, key: str) -> Any:
        document = _doc()
        document["host"] = {**document["host"], "gpus": [{"name": name, "compute_capability": cc}], "key": key}
        return _receipt(document)

    site = build_site([on("B200", "10.0", "b"), on("H200", "9.0", "h"), _receipt(_doc())])
    assert [h.arch for h in site.hosts] == ["cpu", "sm90", "sm100"]


def test_compares_pair_hosts_and_arms_newest_with_newest() -> None:
    other = _doc()
    other["host"] = {**other["host"], "driver": "another0host", "summary": "another host"}  # another key
    arm = {**_doc(), "arm": "no-fi-fp8"}
    site = build_site([_receipt(_doc()), _receipt(other), _receipt(arm)])
    compares = site.compares["cpu-tiny"]
    reference = site.by_cell["cpu-tiny"][0]
    assert len(compares) == 2 and all(reference in (c.a, c.b) for c in compares)  # each against the newest
    assert {c.why for c in compares} <= {"two arms", "two hosts", "two hosts, two arms"}
    assert len(build_site([_receipt(_doc())]).compares["cpu-tiny"]) == 0


def test_compare_pages_grow_linearly_with_the_hosts() -> None:
    """Before: all pairs of heads, 150 receipts on 150 hosts wrote 11,175 compare pages."""
    receipts = []
    for i in range(150):
        document = _doc()
        document["host"] = {**document["host"], "key": f"host{i:04d}", "summary": f"host {i}"}
        receipts.append(_receipt(document))
    assert len(build_site(receipts).compares["cpu-tiny"]) == 149


def test_the_h200_receipts_render_as_an_h200_sm90_column_on_the_host_runtime() -> None:
    h200 = FIXTURES / "h200-vllm-0.26.0" / "receipts"
    site = build_site(receipts_from_dirs([FIXTURES / "receipts", h200]))
    assert [h.label for h in site.hosts] == ["CPU", "H200 (sm90)"]
    on_h200 = site.by_cell["h200-vllm-0.26.0-tiny"]
    assert {r.runtime for r in on_h200} == {"host"} and {r.arm for r in on_h200} == {None, "fp8"}
    assert {r.runtime for r in site.by_cell["cpu-tiny"]} == {"docker"}  # an older receipt without the field
    files = render_site(site, generated_at="now")
    index, cell = files["index.html"].decode(), files[f"cells/{slug('h200-vllm-0.26.0-tiny')}.html"].decode()
    assert '<span class="host">H200 (sm90)</span>' in index and '<span class="muted runtime">host</span>' in index
    assert 'H200 (sm90) <span class="muted">host runtime' in cell
    square = site.square("h200-vllm-0.26.0-tiny", site.hosts[1])
    assert square.receipt is not None and square.receipt.status == "PASS"  # the full PASS over the stall run
