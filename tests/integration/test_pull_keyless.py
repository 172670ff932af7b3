"""Signed and keyless pull through a real registry (issue 27, class 1: nothing falsely verified).

Verification is all or nothing: a key or an identity given is a signature required. Through the
real registry of test_publish's Bench: a key-signed receipt pulls verified; the same image with its
envelope swapped for garbage is refused when a key is given, even without --require-signature; an
unsigned receipt is refused when a signature (a key's or a keyless one) is required and pulls
"unsigned" when none is; a garbage sigstore bundle is refused for --identity. The keyless refusals
are decided before any trust root is needed, so nothing here reaches the network.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from pipeline.registry import attest
from pipeline.registry.oci import OCI_INDEX, OCI_MANIFEST, sha256_digest
from pipeline.registry.publish import referrers_tag
from tests.integration.conftest import Daemon
from tests.integration.publish_bench import CELL, REPO_NAME, Bench, _bench

pytestmark = pytest.mark.integration

IDENTITY = (
    "https://token.actions.githubusercontent.com/https://github.com/o/r/.github/workflows/verify.yml@refs/heads/main"
)


@pytest.fixture
def bench(daemon: Daemon, tmp_path: Path, docker_config: Path) -> Iterator[Bench]:
    """test_publish's Bench on an anonymous registry (the signature logic does not depend on the auth)."""
    yield from _bench(daemon, "anonymous", tmp_path, docker_config, f"CANARY-{secrets.token_hex(8)}")


def keypair(tmp_path: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    private, public = tmp_path / "publisher.key", tmp_path / "publisher.pub"
    private.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return private, public


def with_layer(b: Bench, published: dict[str, object], media_type: str, blob: bytes) -> None:
    """Rewrite the published receipt artifact so its `media_type` layer is `blob` (added or replaced),
    and point the referrers tag at the rewritten artifact alone: what a hostile registry could serve."""
    with b.client() as client:
        artifact = client.manifest(REPO_NAME, str(published["receipt_digest"]))
        assert artifact is not None
        doc = artifact.json
        doc["layers"] = [la for la in doc["layers"] if la["mediaType"] != media_type]
        doc["layers"].append({"mediaType": media_type, "digest": client.put_blob(REPO_NAME, blob), "size": len(blob)})
        forged = json.dumps(doc).encode()
        client.put_manifest(REPO_NAME, sha256_digest(forged), forged, OCI_MANIFEST)
        index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
            {"mediaType": OCI_MANIFEST, "digest": sha256_digest(forged), "size": len(forged),
             "artifactType": doc.get("artifactType") or "application/vnd.stackproof.receipt.v1+json"}]}  # fmt: skip
        client.put_manifest(
            REPO_NAME, referrers_tag(str(published["manifest_digest"])), json.dumps(index).encode(), OCI_INDEX
        )


def test_a_key_signed_receipt_verifies_and_a_garbage_envelope_with_a_key_is_refused(
    bench: Bench, tmp_path: Path
) -> None:
    signing, public = keypair(tmp_path)
    version = bench.version("keyed")
    published = bench.publish(version, bench.receipt(version), extra=("--sign-key", str(signing)))
    assert published.returncode == 0 and published.json()["signed"], published.stderr[-3000:]

    valid = bench.pull("--key", str(public), "--json")  # a key given: the signature is checked
    assert valid.returncode == 0, valid.stderr[-2000:]
    assert valid.json()["signature"].startswith("verified") and bench.pulled_id() == version.image_id
    bench.daemon.docker("rmi", f"stackproof/{CELL}:verified")

    with_layer(bench, published.json(), attest.ENVELOPE_MEDIA_TYPE, b'{"payloadType": "x", "payload": "garbage"}')
    garbage = bench.pull("--key", str(public))  # no --require-signature: a key is enough to require it
    assert garbage.returncode == 1 and "signature:" in garbage.stderr, garbage.stderr[-2000:]
    assert "Traceback" not in garbage.stderr and bench.pulled_id() is None


def test_an_unsigned_receipt_is_refused_when_a_signature_is_required(bench: Bench, tmp_path: Path) -> None:
    _, public = keypair(tmp_path)
    version = bench.version("unsigned")
    published = bench.publish(version, bench.receipt(version))
    assert published.returncode == 0 and not published.json()["signed"], published.stderr[-3000:]

    keyed = bench.pull("--require-signature", "--key", str(public))
    assert keyed.returncode == 1 and "it is not signed" in keyed.stderr, keyed.stderr[-2000:]
    keyless = bench.pull("--identity", IDENTITY)
    assert keyless.returncode == 1 and "no sigstore bundle" in keyless.stderr, keyless.stderr[-2000:]
    assert "Traceback" not in keyed.stderr + keyless.stderr and bench.pulled_id() is None

    plain = bench.pull("--json")  # the other way: nothing required, it pulls and says unsigned
    assert plain.returncode == 0 and plain.json()["signature"] == "unsigned", plain.stderr[-2000:]


def test_a_garbage_sigstore_bundle_is_refused_for_an_identity(bench: Bench, tmp_path: Path) -> None:
    version = bench.version("keyless")
    published = bench.publish(version, bench.receipt(version))
    assert published.returncode == 0, published.stderr[-3000:]
    bundle = json.dumps({"mediaType": attest.SIGSTORE_BUNDLE_MEDIA_TYPE, "dsseEnvelope": {"payload": "garbage"}})
    with_layer(bench, published.json(), attest.SIGSTORE_BUNDLE_MEDIA_TYPE, bundle.encode())
    refused = bench.pull("--identity", IDENTITY)
    assert refused.returncode == 1 and "not a sigstore bundle" in refused.stderr, refused.stderr[-2000:]
    assert "Traceback" not in refused.stderr and bench.pulled_id() is None
