"""The GPU session's read-back (benchmarks/gpu_ab/check.py) and the CPU-side benchmarks of issue 45,
each proven both ways on documents made here by the real judge: an A/A that must pass and one with
a false alarm that must fail, the known-direction A/B with its sign and with the wrong one, a bisect
naming 5.0 and one naming 4.0; the disjoint-window judge (benchmarks/ab.py --windows) on an A/A
and on an A/B; the planted index and GPU matrix (planted.py); the schedule on H100 noise (ab_looks.py).
When the GPU session has left its documents in tests/fixtures/gpu_ab/, they are checked too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.gpu_ab.check import check_dir
from verify.perf.ab import AbConfig, SliceMetrics, judge

FIXTURES = Path(__file__).parents[2] / "tests" / "fixtures" / "gpu_ab"
NAMES = ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90", "itl_p50", "itl_p90", "e2el_p50", "output_tok_s")


def report(
    pairs: int, *, effect: float = 0.0, noise: float = 0.004, seed: int = 0, engines: bool = True
) -> dict[str, Any]:
    """An ab.json of the real judge over drawn pairs: B `effect` slower (tok/s down, latency up)."""
    rng = np.random.default_rng(seed)
    slices = []
    for pair in range(pairs):
        for side in ("A", "B"):
            worse = 1 + effect if side == "B" else 1.0
            values: dict[str, float | None] = {
                n: (1000.0 / worse if n == "output_tok_s" else 10.0 * worse) * float(np.exp(rng.normal(0, noise)))
                for n in NAMES
            }
            slices.append(SliceMetrics(side=side, pair=pair, position=len(slices), seconds=3.0, questions=8, faulted=0,
                                       values=values))  # fmt: skip
    config = AbConfig(threshold=0.05, confidence=0.95, resamples=2000, slice_s=3.0, pairs=pairs, concurrency=8,
                      seed=seed, max_tokens=64)  # fmt: skip
    facts = {
        "kv_cache_gib": 21.6,
        "kv_cache_tokens": 11_000_000,
        "started_order": 1,
        "start_s": 40.0,
        "restarted": True,
    }
    done = judge(
        slices, a="c", b="c", config=config, seconds=300.0, engines={"A": facts, "B": facts} if engines else None
    )
    return done.to_json()


def bisect(first_bad: str) -> dict[str, Any]:
    return {"result": "FIRST BAD", "first_bad": first_bad, "ab_runs": 4, "seconds": 420.0}


def write(directory: Path, documents: dict[str, dict[str, Any]]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, document in documents.items():
        (directory / name).write_text(json.dumps(document))
    return directory


def test_a_clean_session_passes_every_claim(tmp_path: Path) -> None:
    good = write(tmp_path, {
        **{f"aa{i}.ab.json": report(12, seed=i) for i in (1, 2, 3)},
        "ab-one-seq.ab.json": report(12, effect=0.8),
        "bisect.bisect.json": bisect("5.0"),
    })  # fmt: skip
    results = check_dir(good)
    assert all(ok for ok, _ in results), results
    assert any("A/A NO CHANGE 3/3" in line for _, line in results)


@pytest.mark.parametrize(
    ("name", "document", "failed"),
    [
        ("aa2.ab.json", report(12, effect=0.3, seed=2), "A/A false alarms: 1/3"),  # an "A/A" whose sides differ
        ("aa2.ab.json", report(12, seed=2, engines=False), "A/A engines"),  # KV caches never read
        ("ab-one-seq.ab.json", report(12, effect=-0.5), "A/B one-seq: IMPROVEMENT"),  # the wrong sign
        ("bisect.bisect.json", bisect("4.0"), "bisect: FIRST BAD, first bad 4.0"),
    ],
)
def test_each_claim_fails_on_its_wrong_document(
    tmp_path: Path, name: str, document: dict[str, Any], failed: str
) -> None:
    documents = {
        **{f"aa{i}.ab.json": report(12, seed=i) for i in (1, 2, 3)},
        "ab-one-seq.ab.json": report(12, effect=0.8),
        "bisect.bisect.json": bisect("5.0"),
    }
    results = check_dir(write(tmp_path, documents | {name: document}))
    assert [line for ok, line in results if not ok and line.startswith(failed)], results


def test_the_session_s_documents_when_present() -> None:
    if not FIXTURES.is_dir():
        pytest.skip("no GPU session has left its documents in tests/fixtures/gpu_ab/ yet (benchmarks/gpu_ab/README.md)")
    results = check_dir(FIXTURES)
    assert all(ok for ok, _ in results), results


def test_disjoint_windows_of_an_a_a_and_of_an_a_b(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.ab import windows

    aa = [write(tmp_path / f"aa{i}", {"ab.json": report(12, seed=i)}) / "ab.json" for i in (1, 2)]
    windows(aa, 6)
    out = capsys.readouterr().out
    assert "24 A/A pairs from 2 report(s), 4 disjoint windows of 6 pairs" in out and "false alarms 0/4" in out
    ab = [write(tmp_path / "ab", {"ab.json": report(12, effect=0.3)}) / "ab.json"]
    windows(ab, 6)
    out = capsys.readouterr().out
    assert "false alarms 2/2" in out and "output_tok_s  -23." in out


def test_the_planted_index_and_the_gpu_matrix(tmp_path: Path) -> None:
    from benchmarks.gpu_ab.planted import VERSIONS, build_index, gpu_matrix

    simple = build_index(tmp_path, 0.005)
    page = (simple / "stackproof-planted" / "index.html").read_text()
    assert all(f"stackproof_planted-{v}-py3-none-any.whl#sha256=" in page for v in VERSIONS)
    import zipfile

    with zipfile.ZipFile(tmp_path / "files" / "stackproof_planted-5.0-py3-none-any.whl") as bad:
        assert "DELAY_S = 0.005 " in bad.read("stackproof_planted.py").decode()
    with zipfile.ZipFile(tmp_path / "files" / "stackproof_planted-4.0-py3-none-any.whl") as good:
        assert "DELAY_S = 0.0 " in good.read("stackproof_planted.py").decode()
    cell = gpu_matrix(8765)["cells"][0]
    assert cell["arms"]["one-seq"]["args"] == ["--max-num-seqs", "1"] and "stackproof-planted" in cell["overrides"]


def test_the_matrix_it_writes_loads(tmp_path: Path) -> None:
    """Written beside matrix.yaml as planted.py writes it (images/ is found beside the matrix)."""
    from benchmarks.gpu_ab.planted import CELL, REPO, write_matrix
    from pipeline.matrix.read import load_matrix

    path = write_matrix(8765, REPO / f".matrix.gpu-ab.test-{tmp_path.name}.yaml")
    try:
        cell = load_matrix(path, images_dir=REPO / "images").cell(CELL)
    finally:
        path.unlink()
    assert [a.name for a in cell.arms] == ["default", "fp8", "one-seq"]
    assert [o.pin for o in cell.overrides] == ["stackproof-planted==1.0"]


def test_the_schedule_on_h100_noise_quick() -> None:
    """ab_looks.py's quick mode: the runs end with a verdict, the A/B's a REGRESSION at the first look."""
    from benchmarks.ab_looks import simulate

    results = simulate(1, 0)
    assert results["A/B, 10% regression"]["verdicts"]["REGRESSION"] == 1
    assert results["A/B, 10% regression"]["pairs"] == [12]
    assert sum(results["A/A, no offset (apart + restart)"]["verdicts"].values()) == 1


@pytest.mark.slow  # uv makes two environments: about 3 s
def test_a_layer_over_a_given_environment_shadows_only_its_pin(tmp_path: Path) -> None:
    """`bisect --python`: the planted 5.0 as a layer over an existing venv that no `install:`
    describes (uv, the planted wheels as a local index). The layer's python imports the layer's
    copy (DELAY_S 0.005) and still sees the base's own packages; the base is never written to; the
    layer is found built the second time, and not once its base interpreter is gone."""
    import subprocess
    import sys

    from benchmarks.gpu_ab.planted import CELL, REPO, build_index
    from pipeline.host.env import _uv, given_env
    from pipeline.host.layer import build_layer, built_layer, given_base_plan, plan_layer
    from pipeline.matrix.model import Requirement
    from pipeline.matrix.read import load_matrix
    from pipeline.matrix.site import Mirror, SiteSettings

    build_index(tmp_path / "index", 0.005)
    base = tmp_path / "base"
    subprocess.run([_uv(), "venv", "--no-python-downloads", "--python", sys.executable, str(base)], check=True,
                   capture_output=True)  # fmt: skip
    site_packages = next(base.glob("lib/python*/site-packages"))
    (site_packages / "base_only.py").write_text("WHERE = 'base'\n")
    before = sorted(p.name for p in site_packages.iterdir())
    matrix = load_matrix(REPO / "matrix.yaml", images_dir=REPO / "images")
    given = given_env(str(base / "bin" / "python"))
    pin = Requirement(name="stackproof-planted", version="5.0", index="pypi")
    plan = plan_layer(given_base_plan(matrix.cell(CELL), given), (pin,), given=given.python)
    site = SiteSettings(mirrors=(Mirror(index="pypi", location=str(tmp_path / "index" / "files")),))
    layer = build_layer(plan, given, site, matrix, envs_dir=tmp_path / "envs")
    probe = "import stackproof_planted, base_only; print(stackproof_planted.DELAY_S, base_only.WHERE)"
    done = subprocess.run([str(layer.python), "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["0.005", "base"]
    assert sorted(p.name for p in site_packages.iterdir()) == before  # the base untouched
    assert built_layer(plan, envs_dir=tmp_path / "envs") is not None
    moved = plan_layer(plan.base, plan.pins, given=tmp_path / "gone" / "python")
    assert built_layer(moved, envs_dir=tmp_path / "envs") is None  # its base interpreter is gone
