"""Issue 27, class 1: nothing is called verified that is not. Each test was seen failing before its fix."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from pipeline import attest
from pipeline.errors import CheckFailed
from pipeline.publish import fetch_verified
from pipeline.registry import RegistryClient
from tests.unit.fake_oci import FakeOci, publish_receipt
from tests.unit.test_registry import _receipt

HOST = "127.0.0.1:5000"


def _fetch(fake: FakeOci, cell: str, **kw: Any) -> Any:
    with RegistryClient(HOST, transport=httpx.MockTransport(fake.handler)) as client:
        return fetch_verified(client, "stackproof", cell, platform="linux/amd64", here_key=None, **kw)


def test_a_key_given_means_a_signature_is_required() -> None:
    """Before: with --key but without --require-signature, a garbage envelope was 'verified (KEY)'."""
    key = ec.generate_private_key(ec.SECP256R1())
    receipt = _receipt()
    cell = receipt["cell"]
    garbage = FakeOci()
    publish_receipt(garbage, receipt, cell=cell, envelope=b'{"payload": "not signed", "signatures": []}')
    with pytest.raises(CheckFailed, match="no receipt can be trusted: .*signature"):
        _fetch(garbage, cell, public_key=key.public_key())
    unsigned = FakeOci()
    publish_receipt(unsigned, receipt, cell=cell)
    with pytest.raises(CheckFailed, match="not signed"):
        _fetch(unsigned, cell, public_key=key.public_key())
    # Without a key an unsigned receipt is what it is: shown as unsigned, never as verified.
    assert _fetch(unsigned, cell).signature == "unsigned"


def test_a_really_signed_receipt_verifies_with_the_key_alone() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    receipt = _receipt()
    cell = receipt["cell"]
    fake = FakeOci()
    probe = FakeOci()
    digest, _ = publish_receipt(probe, receipt, cell=cell)  # the same bytes: the same image digest
    signed_receipt = json.loads(json.dumps(receipt))
    signed_receipt["image"]["id"] = json.loads(probe.manifests[digest][1])["config"]["digest"]
    envelope = attest.sign_receipt(key, name=f"{HOST}/stackproof", digest=digest, receipt=signed_receipt)
    publish_receipt(fake, receipt, cell=cell, envelope=envelope)
    chosen = _fetch(fake, cell, public_key=key.public_key())
    assert chosen.signature == f"verified ({attest.key_id(key.public_key())})"
    stranger = ec.generate_private_key(ec.SECP256R1())
    with pytest.raises(CheckFailed, match="no signature in it verifies"):
        _fetch(fake, cell, public_key=stranger.public_key())
