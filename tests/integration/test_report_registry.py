"""`stackproof report --registry` against a real registry (Debian's docker-registry on 127.0.0.1).

A tiny imported image stands in for the cell image (as in test_publish.py); its receipt is the real
cpu-tiny receipt of tests/fixtures/receipts with the image id set to the tiny image's, published by
the real `stackproof publish`. No server is started: the tier's time stays where it was.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.engine import Engine
from tests.integration.conftest import REPO, stackproof

pytestmark = pytest.mark.integration

FIXTURE = REPO / "tests/fixtures/receipts/cpu-tiny-pass/cpu-tiny/run-20261201T181931/receipt.json"


def test_the_site_from_a_registry_shows_the_published_receipt(
    engine: Engine, tiny_images: tuple[str, str], registry: str, tmp_path: Path
) -> None:
    image, _ = tiny_images
    info = engine.image(image)
    assert info is not None
    receipt = json.loads(FIXTURE.read_text())
    receipt["image"] = {**receipt["image"], "ref": image, "id": info.id}
    path = tmp_path / "receipt.json"
    path.write_text(json.dumps(receipt))
    published = stackproof(["publish", "cpu-tiny", "--registry", registry, "--image", image, "--receipt", str(path)])
    assert published.returncode == 0, published.stderr[-3000:]

    site = tmp_path / "site"
    done = stackproof(["report", "--registry", registry, "--out", str(site), "--json"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.json()["receipts"] == 1
    index = json.loads((site / "index.json").read_text())
    [square] = [s for s in index["squares"] if s["cell"] == "cpu-tiny"]
    assert square["status"] == "PASS" and square["origin"] == "registry" and square["image_id"] == info.id
    assert square["output_tok_s"] == receipt["load"]["throughput"]["output_tok_s"]
    cell = (site / "cells/cpu-tiny.html").read_text()
    assert "not available" in cell  # a receipt alone: no raw series, said so
    assert json.loads((site / square["receipt"]).read_text()) == receipt
