"""Two publishes at once keep both receipts in the tag schema's referrers index (a real registry).

distribution 2.8 has no referrers API, so each publish lists its receipt in the `sha256-<hex>`
index by read-modify-write; without the re-read-and-merge, the later PUT of two overlapping
publishes drops the earlier one's receipt. The receipts are attached by publish's own code
(`_attach_receipt`) from two threads released together; no image or daemon is needed, only a
subject manifest pushed by hand.
"""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from pipeline.receipt import Receipt
from pipeline.registry.oci import OCI_INDEX, OCI_MANIFEST, RegistryClient
from pipeline.registry.publish import RECEIPT_MEDIA_TYPE, _attach_receipt, referrers_tag
from tests.integration.registries import start_registry
from tests.unit.test_registry import _receipt

pytestmark = pytest.mark.integration
REPO = "stackproof"


def _subject(client: RegistryClient):  # type: ignore[no-untyped-def]
    config = b'{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}'
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": client.put_blob(REPO, config),
            "size": len(config),
        },
        "layers": [],
    }
    client.put_manifest(REPO, "subject", json.dumps(manifest).encode(), OCI_MANIFEST)
    found = client.manifest(REPO, "subject")
    assert found is not None
    return found


@pytest.mark.parametrize("round_", range(3))
def test_two_concurrent_publishes_keep_both_receipts(tmp_path: Path, round_: int) -> None:
    (tmp_path / "registry").mkdir()
    with start_registry("anonymous", tmp_path / "registry", password="") as registry:
        with RegistryClient(registry.address) as client:
            subject = _subject(client)
        base = Receipt.parse(_receipt())  # two hosts' receipts of one image: one per GPU runner
        receipts = [replace(base, host=replace(base.host, driver=driver)) for driver in ("host-a", "host-b")]
        start = threading.Barrier(2)
        results: dict[str, str] = {}
        errors: list[BaseException] = []

        def publish(receipt: Receipt) -> None:
            try:
                with RegistryClient(registry.address) as own:
                    start.wait(timeout=10)
                    results[receipt.host.key] = _attach_receipt(own, REPO, subject, receipt, None)[0]
            except BaseException as exc:  # reported below, on the test's thread
                errors.append(exc)

        threads = [threading.Thread(target=publish, args=(r,)) for r in receipts]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors, errors
        with RegistryClient(registry.address) as client:
            index = client.manifest(REPO, referrers_tag(subject.digest), accept=(OCI_INDEX,))
        assert index is not None
        listed = [d["digest"] for d in index.json["manifests"] if d.get("artifactType") == RECEIPT_MEDIA_TYPE]
        assert sorted(listed) == sorted(results.values()) and len(listed) == 2, index.json
