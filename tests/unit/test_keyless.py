"""Keyless receipt signatures (issue 15 item 4): sigstore bundles verified offline, both ways.

The bundle and trusted root are real (tests/fixtures/sigstore/README.md: a GitHub Actions keyless
DSSE bundle from sigstore-python's test assets, and the staging trusted root sigstore-python ships).
The staging root is a STAND-IN for the public-good root: Fulcio and Rekor are unreachable here, so
verification runs offline against it, through sigstore-python's own verifier.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest

from pipeline.errors import InputError
from pipeline.registry import attest

pytest.importorskip("sigstore", reason="the keyless extra (sigstore-python) is not installed")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sigstore"
BUNDLE = FIXTURES / "a.dsse.staging-rekor-v2.txt.sigstore.json"
STANDIN_ROOT = FIXTURES / "staging-trusted_root.json"  # stand-in for the public-good trusted root
ISSUER = "https://token.actions.githubusercontent.com"
SUBJECT = (
    "https://github.com/sigstore-conformance/extremely-dangerous-public-oidc-beacon/"
    ".github/workflows/extremely-dangerous-oidc-beacon.yml@refs/heads/main"
)
SIGNED_DIGEST = "sha256:a0cfc71271d6e278e57cd332ff957c3f7043fdda354c4cbb190a30d56efa01bf"  # the statement's subject
SLSA = "https://slsa.dev/provenance/v1"  # the real bundle's predicate type


def verify(bundle: bytes, *, subject: str = SUBJECT, issuer: str = ISSUER, digest: str = SIGNED_DIGEST):  # type: ignore[no-untyped-def]
    return attest.verify_sigstore_bundle(
        bundle,
        identity=attest.Identity(issuer=issuer, subject=subject),
        digest=digest,
        trusted_root=STANDIN_ROOT,
        predicate_type=SLSA,
    )


def test_a_real_bundle_with_the_right_identity_verifies_offline() -> None:
    verdict = verify(BUNDLE.read_bytes())
    assert verdict.ok, verdict.reason
    assert verdict.reason == f"signed by {ISSUER}/{SUBJECT}"
    assert verdict.receipt == {
        "buildDefinition": {"buildType": "https://github.com/sigstore-conformance/rekor2-dsse-hashedrekord-regen"},
        "runDetails": {"builder": {"id": "https://github.com/sigstore-conformance/rekor2-dsse-hashedrekord-regen"}},
    }


def test_another_workflow_of_the_same_issuer_is_refused() -> None:
    other = SUBJECT.replace("extremely-dangerous-oidc-beacon.yml", "release.yml")
    verdict = verify(BUNDLE.read_bytes(), subject=other)
    assert not verdict.ok
    assert verdict.reason.startswith("sigstore: ") and f"wanted {ISSUER}/{other}" in verdict.reason
    assert verdict.receipt is None


def test_the_right_workflow_from_another_issuer_is_refused() -> None:
    verdict = verify(BUNDLE.read_bytes(), issuer="https://accounts.google.com")
    assert not verdict.ok and "sigstore: " in verdict.reason


def test_a_tampered_statement_is_refused() -> None:
    """The attested artifact changed after signing: the DSSE signature no longer verifies."""
    doc = json.loads(BUNDLE.read_bytes())
    statement = json.loads(base64.b64decode(doc["dsseEnvelope"]["payload"]))
    forged = "sha256:" + hashlib.sha256(b"another image").hexdigest()
    statement["subject"][0]["digest"]["sha256"] = forged.split(":")[1]
    doc["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    verdict = verify(json.dumps(doc).encode(), digest=forged)
    assert not verdict.ok and verdict.reason.startswith("sigstore: ")


def test_a_tampered_predicate_is_refused() -> None:
    doc = json.loads(BUNDLE.read_bytes())
    statement = json.loads(base64.b64decode(doc["dsseEnvelope"]["payload"]))
    statement["predicate"]["runDetails"]["builder"]["id"] = "https://example.invalid/builder"
    doc["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    assert not verify(json.dumps(doc).encode()).ok


def test_a_bundle_for_another_artifact_is_refused() -> None:
    """A valid bundle, but about another digest than the image being pulled."""
    other = "sha256:" + hashlib.sha256(b"the image being pulled").hexdigest()
    verdict = verify(BUNDLE.read_bytes(), digest=other)
    assert not verdict.ok
    assert verdict.reason == f"the signed statement is about another image, not {other}"


def test_a_valid_bundle_of_another_predicate_type_is_not_a_receipt() -> None:
    verdict = attest.verify_sigstore_bundle(
        BUNDLE.read_bytes(),
        identity=attest.Identity(issuer=ISSUER, subject=SUBJECT),
        digest=SIGNED_DIGEST,
        trusted_root=STANDIN_ROOT,
    )
    assert not verdict.ok and verdict.reason == "the signed statement is not a stackproof receipt attestation"


def test_garbage_is_not_a_bundle() -> None:
    verdict = verify(b'{"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json"}')
    assert not verdict.ok and verdict.reason.startswith("not a sigstore bundle")


def test_a_bad_trusted_root_is_bad_input(tmp_path: Path) -> None:
    bad = tmp_path / "root.json"
    bad.write_text("{}")
    with pytest.raises(InputError, match=r"--trusted-root .*root.json: not a sigstore trusted root"):
        attest.verify_sigstore_bundle(
            BUNDLE.read_bytes(),
            identity=attest.Identity(issuer=ISSUER, subject=SUBJECT),
            digest=SIGNED_DIGEST,
            trusted_root=bad,
        )


@pytest.mark.parametrize(
    ("text", "issuer", "subject"),
    [
        (f"{ISSUER}/{SUBJECT}", ISSUER, SUBJECT),
        ("https://accounts.google.com/someone@example.com", "https://accounts.google.com", "someone@example.com"),
        (
            "https://oauth2.sigstore.dev/auth/someone@example.com",
            "https://oauth2.sigstore.dev/auth",
            "someone@example.com",
        ),
    ],
)
def test_identity_is_issuer_slash_subject(text: str, issuer: str, subject: str) -> None:
    assert attest.parse_identity(text) == attest.Identity(issuer=issuer, subject=subject)


@pytest.mark.parametrize("text", ["", SUBJECT.removeprefix("https://"), ISSUER, f"{ISSUER}/ {SUBJECT}"])
def test_an_identity_without_issuer_and_subject_is_bad_input(text: str) -> None:
    with pytest.raises(InputError, match="write ISSUER/SUBJECT"):
        attest.parse_identity(text)


# -- publish's consistency check of the bundle it attaches (pure, no signature) ---------------------------


def _bundle(statement: dict[str, object]) -> bytes:
    payload = base64.b64encode(json.dumps(statement).encode()).decode()
    return json.dumps(
        {
            "mediaType": attest.SIGSTORE_BUNDLE_MEDIA_TYPE,
            "dsseEnvelope": {"payload": payload, "payloadType": attest.PAYLOAD_TYPE, "signatures": []},
        }
    ).encode()


def test_publish_accepts_the_bundle_of_this_receipt_about_this_image() -> None:
    receipt = {"kind": "stackproof.receipt", "status": "PASS"}
    statement = attest.statement(name="127.0.0.1:5000/stackproof", digest=SIGNED_DIGEST, receipt=receipt)
    assert attest.bundle_statement_problems(_bundle(statement), digest=SIGNED_DIGEST, receipt=receipt) == []


def test_publish_refuses_a_bundle_of_another_image_or_receipt() -> None:
    receipt = {"kind": "stackproof.receipt", "status": "PASS"}
    statement = attest.statement(name="r/stackproof", digest=SIGNED_DIGEST, receipt=receipt)
    other = "sha256:" + "0" * 64
    assert attest.bundle_statement_problems(_bundle(statement), digest=other, receipt=receipt) == [
        f"the signed statement is about another image, not {other}"
    ]
    assert attest.bundle_statement_problems(_bundle(statement), digest=SIGNED_DIGEST, receipt={"status": "FAIL"}) == [
        "its predicate is not this receipt"
    ]
    assert attest.bundle_statement_problems(b"[]", digest=SIGNED_DIGEST, receipt=receipt) == [
        "it is not a sigstore bundle holding a DSSE envelope"
    ]
