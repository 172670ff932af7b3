"""Issue 27 on `stackproof report`: a PASS only where a receipt earns it, files only from inside
the run directory, receipts of the wrong shape located, pages never lost or mixed. Each test was
seen failing before its fix."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stackproof.cli import main
from stackproof.site_report.model import build_site
from stackproof.site_report.render import render_site, slug
from tests.unit.test_report import PASS_RUN, _doc, _receipt

CANARY = "CANARY-outside-the-run-directory"


def _run(tmp_path: Path, document: dict[str, Any] | None = None, name: str = "run") -> Path:
    run = tmp_path / "runs" / "cpu-tiny" / name
    shutil.copytree(PASS_RUN, run)
    if document is not None:
        (run / "receipt.json").write_text(json.dumps(document))
    return run


def _index(tmp_path: Path, *runs: Path) -> dict[str, Any]:
    out = tmp_path / "site"
    assert main(["report", "--receipts", *map(str, runs), "--out", str(out), "--cells", "cpu-tiny"]) == 0
    document: dict[str, Any] = json.loads((out / "index.json").read_text())
    return document


# -- class 1: PASS only for a receipt whose stages all ran and whose image is the cell's --------------


def _only_imports(d: dict[str, Any]) -> None:
    d["stages"] = d["stages"][:1]


def _other_cell_image(d: dict[str, Any]) -> None:
    d["image"]["ref"] = "stackproof/another-cell:e973fb2d985073ba"


def _not_a_digest(d: dict[str, Any]) -> None:
    d["image"]["id"] = "latest"


def _failed_stage(d: dict[str, Any]) -> None:
    d["stages"][3]["status"] = "FAIL"


@pytest.mark.parametrize("edit", [_only_imports, _other_cell_image, _not_a_digest, _failed_stage])
def test_a_receipt_claiming_pass_without_earning_it_is_not_shown_pass(edit: Callable[[dict[str, Any]], None]) -> None:
    document = _doc()
    edit(document)
    receipt = _receipt(document)
    assert receipt.status == "INCONCLUSIVE" and receipt.status_reason.startswith("claims PASS, but")
    index = json.loads(render_site(build_site([receipt]), generated_at="t")["index.json"])
    assert [s["status"] for s in index["squares"]] == ["INCONCLUSIVE"]
    assert _receipt(_doc()).status == "PASS"  # the real receipt still is


# -- class 2: files only from inside the run directory ---------------------------------------------------


def test_artifacts_outside_the_run_directory_are_never_copied(tmp_path: Path) -> None:
    secret = tmp_path / "secret.log"
    secret.write_text(CANARY)
    document = _doc()
    document["stages"][1]["artifacts"]["server_log"] = str(PASS_RUN / ".." / ".." / ".." / ".." / "secret.log")
    dotted = _run(tmp_path, document, "dotted")
    linked = _run(tmp_path, None, "linked")
    (linked / "server.log").unlink()
    (linked / "server.log").symlink_to(secret)
    (linked / "junit.xml").unlink(missing_ok=True)
    (linked / "junit.xml").symlink_to(secret)
    _index(tmp_path, dotted, linked)
    for path in (tmp_path / "site").rglob("*"):
        if path.is_file():
            assert CANARY not in path.read_text(errors="replace"), path


# -- class 5: receipt fields of the wrong type are exit 2 with their path ----------------------------------

WRONG_TYPES: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("seconds-string", lambda d: d.update(seconds="long"), "seconds"),
    ("seconds-nan", lambda d: d.update(seconds=float("nan")), "seconds"),
    ("runtime-list", lambda d: d.update(runtime=[1]), "runtime"),
    ("distributions-list", lambda d: d["runtime"].update(distributions=[1]), "runtime.distributions"),
    ("outcome-list", lambda d: d.update(outcome=[1]), "outcome"),
    ("arm-list", lambda d: d.update(arm=["a"]), "arm"),
    ("image-string", lambda d: d.update(image="x"), "image"),
    ("image-ref-number", lambda d: d["image"].update(ref=3), "image.ref"),
    ("load-list", lambda d: d.update(load=[1]), "load"),
    ("events-map", lambda d: d["load"].update(events={"a": 1}), "load.events"),
    # the load section is typed (pipeline/findings.py): each of its fields is checked, with its path
    ("latency-string", lambda d: d["load"]["latency_ms"]["ttft"].update(p50="fast"), "load.latency_ms.ttft.p50"),
    ("questions-missing", lambda d: d["load"].pop("questions"), "load.questions"),
    ("tok-s-inf", lambda d: d["load"]["throughput"].update(output_tok_s=math.inf), "load.throughput.output_tok_s"),
    ("event-number", lambda d: d["load"].update(events=[3]), "load.events[0]"),
    ("checks-map", lambda d: d["stages"][0].update(checks={"a": 1}), "stages[0].checks"),
    ("check-number", lambda d: d["stages"][0].update(checks=[3]), "stages[0].checks[0]"),
    ("artifacts-list", lambda d: d["stages"][0].update(artifacts=[1]), "stages[0].artifacts"),
    ("stage-seconds", lambda d: d["stages"][0].update(seconds="x"), "stages[0].seconds"),
    ("autotune-n", lambda d: d.update(autotune=[{"op": "o", "n": "x", "k": 1, "rows": []}]), "autotune[0].n"),
    ("host-list", lambda d: d.update(host=[1]), "host"),
]


@pytest.mark.parametrize(("name", "edit", "path"), WRONG_TYPES, ids=[w[0] for w in WRONG_TYPES])
def test_a_receipt_field_of_the_wrong_type_is_exit_2_naming_its_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, edit: Callable[[dict[str, Any]], None], path: str
) -> None:
    document = _doc()
    edit(document)
    run = _run(tmp_path, document)
    assert main(["report", "--receipts", str(run), "--out", str(tmp_path / "site")]) == 2
    err = capsys.readouterr().err
    assert f"receipt.json: {path}:" in err and "Traceback" not in err


def test_names_with_tex_specials_and_non_finite_timings_draw(tmp_path: Path) -> None:
    document = _doc()
    document["host"]["gpus"] = [{"name": "$\\frac{1}{0}$ ^_^ %", "compute_capability": "9.0"}]
    document["arm"] = "a$b^c"
    run = _run(tmp_path, document)
    with (run / "load" / "requests.jsonl").open("a") as f:
        f.write(json.dumps({"kind": "load", "ttft": float("inf"), "itl": [float("nan"), 1e308]}) + "\n")
    _index(tmp_path, run)
    assert "a$b^c" in (tmp_path / "site" / "cells" / "cpu-tiny.html").read_text()


# -- class 7: no lost pages, no mixed sites ---------------------------------------------------------------


def test_page_names_are_injective() -> None:
    ids = ["a.b", "a_b", "a b", "a-b", "a/b", "..", ".", "a_2Eb", "é"]
    assert len({slug(i) for i in ids}) == len(ids)
    assert all("/" not in slug(i) and slug(i) not in (".", "..") for i in ids)


def test_two_reports_into_one_out_do_not_mix(tmp_path: Path) -> None:
    out = tmp_path / "site"
    old = _run(tmp_path, None, "old")
    renamed = _doc()
    renamed["cell"] = "cpu.tiny"
    renamed["image"]["ref"] = "stackproof/cpu.tiny:e973fb2d985073ba"
    other = _run(tmp_path / "b", renamed, "other")
    assert main(["report", "--receipts", str(old), "--out", str(out), "--cells", "cpu-tiny"]) == 0
    assert (out / "cells" / "cpu-tiny.html").is_file()
    assert main(["report", "--receipts", str(other), "--out", str(out), "--cells", "cpu.tiny"]) == 0
    pages = sorted(p.name for p in (out / "cells").iterdir())
    assert pages == [f"{slug('cpu.tiny')}.html"], pages  # the first report's page is gone
    assert not [p for p in out.rglob("*.partial")]


def test_an_earlier_sites_manifest_removes_nothing_outside_out(tmp_path: Path) -> None:
    """The manifest of the pages a previous report wrote (.stackproof-site.json) is read back from
    --out, a directory that may come from elsewhere (a CI artifact, another user): an absolute path,
    a `..` or a symlinked folder in it must never make this report delete a file outside --out.
    Before: `out / "/abs/path"` is the absolute path, and it was unlinked."""
    from stackproof.site_report.write import SITE_MANIFEST, write_site

    victim = tmp_path / "victim"
    victim.mkdir()
    for name in ("absolute.txt", "dotted.txt", "linked.html"):
        (victim / name).write_text("keep me")
    out = tmp_path / "site"
    (out / "cells").mkdir(parents=True)
    (out / "elsewhere").symlink_to(victim, target_is_directory=True)
    listed = [str(victim / "absolute.txt"), "cells/../../victim/dotted.txt", "elsewhere/linked.html", "cells/old.html"]
    (out / "cells" / "old.html").write_text("a page of the earlier report")
    (out / SITE_MANIFEST).write_text(json.dumps(listed))
    write_site({"index.html": b"new"}, out)
    assert sorted(p.name for p in victim.iterdir()) == ["absolute.txt", "dotted.txt", "linked.html"]
    assert not (out / "cells" / "old.html").exists()  # the earlier report's own page is still removed


def test_an_earlier_sites_manifest_that_is_a_fifo_or_endless_is_ignored(tmp_path: Path) -> None:
    """Before: the manifest was read with read_text(): a FIFO in --out hung the report for ever."""
    import os
    import threading

    from stackproof.site_report.write import SITE_MANIFEST, write_site

    out = tmp_path / "site"
    out.mkdir()
    os.mkfifo(out / SITE_MANIFEST)
    done = threading.Event()
    thread = threading.Thread(target=lambda: (write_site({"index.html": b"new"}, out), done.set()), daemon=True)
    thread.start()
    thread.join(timeout=10)
    if not done.is_set():  # unblock the reader so that the test run itself goes on
        with open(out / SITE_MANIFEST, "w"):
            pass
        pytest.fail("write_site waited for a writer of the FIFO in --out")
    assert (out / "index.html").read_bytes() == b"new"


def test_a_huge_junit_beside_a_receipt_is_not_copied_whole(tmp_path: Path) -> None:
    """Class 4: a junit.xml over the copy limit is rendered from the receipt instead (a sparse
    file: the size is announced, the bytes cost nothing); a FIFO in its place is skipped, not waited on."""
    import os

    from stackproof.site_report.sources import COPY_LIMIT_BYTES

    big = _run(tmp_path, None, "big")
    (big / "junit.xml").unlink(missing_ok=True)
    with (big / "junit.xml").open("wb") as f:
        f.truncate(COPY_LIMIT_BYTES * 8)
    piped = _run(tmp_path, None, "piped")
    (piped / "junit.xml").unlink(missing_ok=True)
    os.mkfifo(piped / "junit.xml")
    _index(tmp_path, big, piped)
    copied = list((tmp_path / "site").rglob("junit.xml"))
    assert copied and all(0 < p.stat().st_size <= COPY_LIMIT_BYTES for p in copied)
    assert all(b"\0" not in p.read_bytes() for p in copied)  # the rendered one, not the sparse zeros


def test_cell_ids_that_differ_only_in_punctuation_get_their_own_pages(tmp_path: Path) -> None:
    """Class 7 end to end (the slug alone is test_page_names_are_injective): three cells whose ids
    differ only in `.`, `_` and `-` give three cell pages through `stackproof report`."""
    runs = []
    for cell in ("cpu.tiny", "cpu_tiny", "cpu-tiny"):
        document = _doc()
        document["cell"] = cell
        document["image"]["ref"] = f"stackproof/{cell}:e973fb2d985073ba"
        runs.append(_run(tmp_path / cell, document))
    out = tmp_path / "site"
    argv = ["report", "--receipts", *map(str, runs), "--out", str(out), "--cells", "cpu.tiny", "cpu_tiny", "cpu-tiny"]
    assert main(argv) == 0
    pages = sorted(p.name for p in (out / "cells").iterdir())
    assert pages == sorted(f"{slug(c)}.html" for c in ("cpu.tiny", "cpu_tiny", "cpu-tiny")), pages
