"""Issue 27, class 1: nothing is called verified that is not. Each test was seen failing before its fix."""

from __future__ import annotations

import json
from pathlib import Path
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


# -- the model store: an entry only after the commit and every file hash check out -------------------


def _store_hub(**hostile: Any) -> Any:
    from tests.standin_hub import stand_in_hub

    files = {"config.json": b'{"model_type": "llama"}\n', "model.safetensors": bytes(range(256)) * 400}
    hub = stand_in_hub("stackproof-test/tiny", files)
    return hub, hostile


@pytest.mark.parametrize(
    ("hostile", "said"),
    [
        ({"answer_commit": "f" * 40}, "answered commit f{40} for the pinned"),
        ({"corrupt": frozenset({"model.safetensors"})}, "model.safetensors: its bytes do not match"),
    ],
)
def test_a_hub_that_lies_about_the_commit_or_the_bytes_leaves_nothing_in_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hostile: dict[str, Any], said: str
) -> None:
    """Before: exit 0, and the store's entry for the pinned revision pointed at the other commit's
    files, or held a file whose bytes were not the announced ones."""
    from pipeline import modelstore
    from pipeline.errors import InfraError
    from pipeline.model import ModelSource

    context, _ = _store_hub()
    with context as hub:
        for key, value in hostile.items():
            setattr(hub, key, value)
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        model = ModelSource(source=f"hf:{hub.repo_id}", revision=hub.revision)
        with pytest.raises(InfraError, match=said) as refused:
            modelstore.fetch(model, store=tmp_path)
        assert refused.value.exit_code == 3 and "nothing was stored" in str(refused.value)
        assert modelstore.snapshot_in_store(model, tmp_path) is None
        assert not (tmp_path / "models--stackproof-test--tiny").exists()
        # The honest hub again: the same store takes the model.
        for key in hostile:
            setattr(hub, key, type(hub).__dataclass_fields__[key].default)
        assert modelstore.fetch(model, store=tmp_path).snapshot.name == hub.revision


def test_a_listing_too_long_or_too_slow_is_refused_within_its_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    from pipeline import modelstore
    from pipeline.errors import InfraError
    from pipeline.model import ModelSource

    context, _ = _store_hub()
    with context as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "1")
        model = ModelSource(source=f"hf:{hub.repo_id}", revision=hub.revision)
        hub.extra_listed = modelstore.MAX_FILES + 1
        with pytest.raises(InfraError, match="lists more than 10,000 items"):
            modelstore.fetch(model, store=tmp_path)
        hub.extra_listed, hub.stall_listing, hub.stall_seconds = 0, True, 3.0
        started = time.monotonic()
        with pytest.raises(InfraError, match="unreachable or stalled"):
            modelstore.fetch(model, store=tmp_path)
        assert time.monotonic() - started < 3
