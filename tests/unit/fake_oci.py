"""An in-memory OCI registry for unit tests (an httpx.MockTransport handler): manifests by tag and
digest, blobs by digest, tag lists. No referrers API (404), so receipts are found through the OCI
tag schema's `sha256-<hex>` index, as on a registry of distribution 2.x. A stand-in, named as one:
the real registries are in tests/integration/test_publish.py.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import httpx

from pipeline.registry import attest
from pipeline.registry.oci import OCI_INDEX, OCI_MANIFEST
from pipeline.registry.publish import RECEIPT_MEDIA_TYPE, referrers_tag

__all__ = ["FakeOci", "publish_receipt"]


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class FakeOci:
    manifests: dict[str, tuple[str, bytes]] = field(default_factory=dict)  # tag or digest -> (type, body)
    blobs: dict[str, bytes] = field(default_factory=dict)

    def blob(self, data: bytes) -> dict[str, Any]:
        digest = _digest(data)
        self.blobs[digest] = data
        return {"digest": digest, "size": len(data)}

    def put(self, document: dict[str, Any], media_type: str, *tags: str) -> str:
        body = json.dumps(document).encode()
        digest = _digest(body)
        for name in (digest, *tags):
            self.manifests[name] = (media_type, body)
        return digest

    def handler(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v2/":
            return httpx.Response(200, json={})
        repo, _, rest = path.removeprefix("/v2/").partition("/")
        kind, _, reference = rest.partition("/")
        if kind == "manifests" and reference in self.manifests:
            media_type, body = self.manifests[reference]
            return httpx.Response(200, content=body, headers={"Content-Type": media_type})
        if kind == "blobs" and reference in self.blobs:
            return httpx.Response(200, content=self.blobs[reference])
        if kind == "tags":
            tags = sorted(t for t in self.manifests if not t.startswith("sha256:"))
            return httpx.Response(200, json={"name": repo, "tags": tags})
        return httpx.Response(404, json={"errors": [{"code": "NOT_FOUND", "message": path}]})


def publish_receipt(
    fake: FakeOci, receipt: dict[str, Any], *, cell: str, envelope: bytes | None = None
) -> tuple[str, str]:
    """An image whose config digest the receipt names, tagged CELL-verified, and its receipt artifact
    (with `envelope` as its DSSE layer when given). Returns (image manifest digest, artifact digest)."""
    config = fake.blob(b'{"architecture": "amd64", "os": "linux"}')
    receipt = json.loads(json.dumps(receipt))
    receipt["image"]["id"] = config["digest"]
    image = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config},
        "layers": [],
    }
    image_digest = fake.put(image, OCI_MANIFEST, f"{cell}-verified")
    layers = [{"mediaType": RECEIPT_MEDIA_TYPE, **fake.blob(json.dumps(receipt).encode())}]
    if envelope is not None:
        layers.append({"mediaType": attest.ENVELOPE_MEDIA_TYPE, **fake.blob(envelope)})
    artifact = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": RECEIPT_MEDIA_TYPE,
        "config": {"mediaType": "application/vnd.oci.empty.v1+json", **fake.blob(b"{}")},
        "layers": layers,
        "subject": {"mediaType": OCI_MANIFEST, "digest": image_digest, "size": 1},
    }
    artifact_digest = fake.put(artifact, OCI_MANIFEST)
    index = {
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [{"mediaType": OCI_MANIFEST, "artifactType": RECEIPT_MEDIA_TYPE, "digest": artifact_digest}],
    }
    fake.put(index, OCI_INDEX, referrers_tag(image_digest))
    return image_digest, artifact_digest
