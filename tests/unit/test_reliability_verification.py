"""Issue 27, class 1: nothing is called verified that is not. Each test was seen failing before its fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from pipeline.errors import CheckFailed
from pipeline.registry import attest
from pipeline.registry.oci import RegistryClient
from pipeline.registry.pull import fetch_verified
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
    with pytest.raises(CheckFailed, match=r"no receipt can be trusted: .*signature"):
        _fetch(garbage, cell, public_key=key.public_key())
    unsigned = FakeOci()
    publish_receipt(unsigned, receipt, cell=cell)
    with pytest.raises(CheckFailed, match="not signed"):
        _fetch(unsigned, cell, public_key=key.public_key())
    # Without a key an unsigned receipt is what it is: shown as unsigned, never as verified.
    assert _fetch(unsigned, cell).signature == "unsigned"


def test_pull_reads_a_registry_receipt_through_the_model_and_names_the_broken_field() -> None:
    receipt = _receipt()
    cell = receipt["cell"]
    good = FakeOci()
    publish_receipt(good, receipt, cell=cell)
    chosen = _fetch(good, cell)
    assert chosen.candidate.receipt is not None and chosen.candidate.receipt.cell == cell  # the typed model
    broken = json.loads(json.dumps(receipt))
    broken["outcome"]["passed"] = "yes"  # a PASS that is no boolean: not a receipt this tool reads
    bad = FakeOci()
    publish_receipt(bad, broken, cell=cell)
    with pytest.raises(CheckFailed, match=r"no receipt can be trusted: .*outcome\.passed: a str, expected true"):
        _fetch(bad, cell)


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
    from pipeline.errors import InfraError
    from pipeline.host import modelstore
    from pipeline.matrix.model import ModelSource

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

    from pipeline.errors import InfraError
    from pipeline.host import modelstore
    from pipeline.matrix.model import ModelSource

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


# -- compare: a NaN or negative gap is no near-tie; a duplicated prompt hides nothing -----------------


def _greedy(path: Path, prompts: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {"kind": "stackproof.greedy-samples", "schema_version": 1, "model": "m", "max_tokens": 4}
    path.write_text(json.dumps({**document, "label": path.parent.name, "prompts": prompts}))
    return path


def _p(index: int, tokens: list[str], gaps: list[Any]) -> dict[str, Any]:
    return {"index": index, "prompt": f"p{index}", "tokens": tokens, "top2_gaps": gaps}


@pytest.mark.parametrize("gap", [float("nan"), -5.0, float("inf")])
def test_a_divergence_at_a_nan_or_negative_gap_is_bad_input_never_a_near_tie(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], gap: float
) -> None:
    """Before: `NaN > 0.5` is false and `-5 > 0.5` is false: the divergence was called a near-tie, exit 0."""
    from stackproof.cli import main

    a = _greedy(tmp_path / "a" / "greedy.json", [_p(0, ["x", "y"], [3.0, 3.0])])
    b = _greedy(tmp_path / "b" / "greedy.json", [_p(0, ["x", "z"], [3.0, 0.0])])
    b.write_text(b.read_text().replace("0.0]", f"{json.dumps(gap)}]"))
    assert main(["compare", str(a), str(b), "--json"]) == 2
    captured = capsys.readouterr()
    assert "top2_gaps[1]" in captured.err or "not strict JSON" in captured.err
    assert json.loads(captured.out)["error"]["exit_code"] == 2


def test_a_duplicated_prompt_index_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: the second prompts[] entry of index 0 replaced the first, whose divergence vanished."""
    from stackproof.cli import main

    a = _greedy(tmp_path / "a" / "greedy.json", [_p(0, ["x", "y"], [3.0, 3.0])])
    b = _greedy(tmp_path / "b" / "greedy.json", [_p(0, ["x", "z"], [3.0, 3.0]), _p(0, ["x", "y"], [3.0, 3.0])])
    assert main(["compare", str(a), str(b)]) == 2
    assert "prompts[1].index: 0 again" in capsys.readouterr().err
    honest = _greedy(tmp_path / "c" / "greedy.json", [_p(0, ["x", "z"], [3.0, 3.0])])
    assert main(["compare", str(a), str(honest)]) == 1  # the divergence at a confident gap: corruption


@pytest.mark.parametrize("name", ["../escaped.json", "a/../../escaped.json", "/tmp/escaped.json", "x\x00y"])
def test_a_hub_listing_a_file_name_outside_the_snapshot_is_exit_3_and_stores_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """Class 5: huggingface_hub refuses a `../` or absolute file name with a plain ValueError (a
    traceback before); the store classifies it as the hub's fault, and nothing is written anywhere."""
    from pipeline.errors import InfraError
    from pipeline.host import modelstore
    from pipeline.matrix.model import ModelSource

    context, _ = _store_hub()
    with context as hub:
        hub.files[name] = b"ESCAPED"
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        model = ModelSource(source=f"hf:{hub.repo_id}", revision=hub.revision)
        with pytest.raises(InfraError, match="answered what cannot be stored") as refused:
            modelstore.fetch(model, store=tmp_path / "store")
        assert refused.value.exit_code == 3
        assert modelstore.snapshot_in_store(model, tmp_path / "store") is None
        assert not [p for p in tmp_path.rglob("*escaped*")] and not Path("/tmp/escaped.json").exists()
