"""Signed receipts: an in-toto statement in a DSSE envelope, signed with an ECDSA P-256 key.

The statement's subject is the image manifest digest the receipt binds, its predicate the receipt
itself. The envelope is the one cosign and sigstore use (`payloadType`
`application/vnd.in-toto+json`, the signature over DSSE's pre-authentication encoding, ECDSA
P-256 with SHA-256, DER, base64), so `cosign verify-blob-attestation --key cosign.pub` reads it.
Keys are PEM: a PKCS#8 or SEC1 private key to sign (`publish --sign-key`; an encrypted one takes its
password from STACKPROOF_SIGN_KEY_PASSWORD), a SubjectPublicKeyInfo public key to verify
(`pull --require-signature --key`), as `cosign generate-key-pair` + `cosign public-key` write them.

`verify_envelope` is pure: an envelope, a key and the digest it must name in, a verdict out.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from pipeline.errors import InputError

__all__ = [
    "ENVELOPE_MEDIA_TYPE",
    "PREDICATE_TYPE",
    "Verified",
    "load_private_key",
    "load_public_key",
    "sign_receipt",
    "verify_envelope",
]

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://stackproof.dev/attestation/receipt/v1"
ENVELOPE_MEDIA_TYPE = "application/vnd.dsse.envelope.v1+json"
PASSWORD_ENV = "STACKPROOF_SIGN_KEY_PASSWORD"


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what is actually signed."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def load_private_key(path: Path, *, password: str | None = None) -> ec.EllipticCurvePrivateKey:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"--sign-key {path}: cannot read it ({exc.strerror})") from exc
    try:
        key = serialization.load_pem_private_key(data, password=password.encode() if password else None)
    except TypeError as exc:
        raise InputError(f"--sign-key {path}: the key is encrypted: set {PASSWORD_ENV}") from exc
    except ValueError as exc:
        raise InputError(f"--sign-key {path}: not a PEM private key, or the wrong password") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        raise InputError(f"--sign-key {path}: not an ECDSA P-256 key (cosign generate-key-pair makes one)")
    return key


def load_public_key(path: Path) -> ec.EllipticCurvePublicKey:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"--key {path}: cannot read it ({exc.strerror})") from exc
    try:
        key: Any = serialization.load_pem_public_key(data)
    except ValueError:
        try:
            key = serialization.load_pem_private_key(data, password=None).public_key()
        except (ValueError, TypeError) as exc:
            raise InputError(f"--key {path}: not a PEM public key") from exc
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP256R1):
        raise InputError(f"--key {path}: not an ECDSA P-256 public key")
    return key


def statement(*, name: str, digest: str, receipt: dict[str, Any]) -> dict[str, Any]:
    algorithm, _, hex_digest = digest.partition(":")
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": name, "digest": {algorithm: hex_digest}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": receipt,
    }


def key_id(key: ec.EllipticCurvePublicKey) -> str:
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + _sha256(der)


def sign_receipt(key: ec.EllipticCurvePrivateKey, *, name: str, digest: str, receipt: dict[str, Any]) -> bytes:
    """The DSSE envelope (JSON bytes) of the statement `receipt` binds `name@digest`."""
    payload = json.dumps(statement(name=name, digest=digest, receipt=receipt), sort_keys=True).encode()
    signature = key.sign(pae(PAYLOAD_TYPE, payload), ec.ECDSA(hashes.SHA256()))
    envelope = {
        "payloadType": PAYLOAD_TYPE,
        "payload": base64.b64encode(payload).decode(),
        "signatures": [{"keyid": key_id(key.public_key()), "sig": base64.b64encode(signature).decode()}],
    }
    return json.dumps(envelope).encode()


@dataclass(frozen=True, kw_only=True)
class Verified:
    ok: bool
    reason: str
    receipt: dict[str, Any] | None = None  # the signed predicate, when ok


def verify_envelope(envelope: bytes, key: ec.EllipticCurvePublicKey, *, digest: str) -> Verified:
    """Whether `envelope` is signed by `key` and states a stackproof receipt about `digest`."""
    try:
        doc = json.loads(envelope)
        payload = base64.b64decode(doc["payload"], validate=True)
        signatures = [base64.b64decode(s["sig"], validate=True) for s in doc["signatures"]]
        payload_type = str(doc["payloadType"])
    except (ValueError, KeyError, TypeError):
        return Verified(ok=False, reason="the signature envelope is not DSSE JSON")
    if payload_type != PAYLOAD_TYPE:
        return Verified(ok=False, reason=f"the envelope carries {payload_type!r}, not an in-toto statement")
    for signature in signatures:
        try:
            key.verify(signature, pae(payload_type, payload), ec.ECDSA(hashes.SHA256()))
            break
        except InvalidSignature:
            continue
    else:
        return Verified(ok=False, reason=f"no signature in it verifies with the key {key_id(key)}")
    try:
        signed = json.loads(payload)
    except ValueError:
        return Verified(ok=False, reason="the signed payload is not JSON")
    algorithm, _, hex_digest = digest.partition(":")
    subjects = [s.get("digest", {}).get(algorithm) for s in signed.get("subject") or [] if isinstance(s, dict)]
    if signed.get("_type") != STATEMENT_TYPE or signed.get("predicateType") != PREDICATE_TYPE:
        return Verified(ok=False, reason="the signed statement is not a stackproof receipt attestation")
    if hex_digest not in subjects:
        return Verified(ok=False, reason=f"the signed statement is about another image, not {digest}")
    predicate = signed.get("predicate")
    if not isinstance(predicate, dict):
        return Verified(ok=False, reason="the signed statement has no receipt")
    return Verified(ok=True, reason=f"signed by {key_id(key)}", receipt=predicate)


def _sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()
