"""Signed receipts: an in-toto statement in a DSSE envelope, signed with an ECDSA P-256 key.

The statement's subject is the image manifest digest the receipt binds, its predicate the receipt
itself. The envelope is the one cosign and sigstore use (`payloadType`
`application/vnd.in-toto+json`, the signature over DSSE's pre-authentication encoding, ECDSA
P-256 with SHA-256, DER, base64), so `cosign verify-blob-attestation --key cosign.pub` reads it.
Keys are PEM: a PKCS#8 or SEC1 private key to sign (`publish --sign-key`; an encrypted one takes its
password from STACKPROOF_SIGN_KEY_PASSWORD), a SubjectPublicKeyInfo public key to verify
(`pull --require-signature --key`), as `cosign generate-key-pair` + `cosign public-key` write them.

`verify_envelope` is pure: an envelope, a key and the digest it must name in, a verdict out.

Keyless (GitHub Actions): verify.yml has the official attestation action sign the same statement
(subject: `HOST/REPO` at the manifest digest, predicateType `PREDICATE_TYPE`, predicate: the
receipt) with a Fulcio certificate for the workflow's OIDC identity, logged in Rekor; the action
writes a sigstore bundle (v0.3, a DSSE envelope inside), which publish attaches beside the receipt
(`publish --sigstore-bundle`). `pull --require-signature --identity ISSUER/SUBJECT` verifies that
bundle with sigstore-python (certificate chain to the trusted root, transparency log inclusion,
the certificate's issuer and subject) before it trusts the receipt, then checks the statement
exactly as for a key-signed envelope.
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

from pipeline.errors import InfraError, InputError
from pipeline.guard import boundedio

__all__ = [
    "ENVELOPE_MEDIA_TYPE",
    "PREDICATE_TYPE",
    "SIGSTORE_BUNDLE_MEDIA_TYPE",
    "Identity",
    "Verified",
    "bundle_statement_problems",
    "load_private_key",
    "load_public_key",
    "parse_identity",
    "sign_receipt",
    "verify_envelope",
    "verify_sigstore_bundle",
]

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://stackproof.dev/attestation/receipt/v1"
ENVELOPE_MEDIA_TYPE = "application/vnd.dsse.envelope.v1+json"
# What the attestation action writes (`bundle-path`) and attaches: a sigstore bundle, v0.3.
SIGSTORE_BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
PASSWORD_ENV = "STACKPROOF_SIGN_KEY_PASSWORD"
# Key files and the trusted root are inputs like any other (issue 27): read through the bounded
# reader, so /dev/zero, a FIFO nobody writes to or a huge file is exit 2 naming the flag, never a
# wait without end or an out-of-memory exit 3. A PEM key is a few hundred bytes; sigstore's
# trusted_root.json tens of KB.
KEY_LIMIT = 64 * 2**10
TRUSTED_ROOT_LIMIT = 16 * 2**20


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what is actually signed."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def load_private_key(path: Path, *, password: str | None = None) -> ec.EllipticCurvePrivateKey:
    data = _read_key(path, "--sign-key")
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
    data = _read_key(path, "--key")
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


def _read_key(path: Path, flag: str) -> bytes:
    try:
        return boundedio.read_bytes(path, "key file", limit=KEY_LIMIT)
    except InputError as exc:
        raise InputError(f"{flag} {exc}") from None


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
    return _statement_verdict(payload, digest=digest, signer=f"signed by {key_id(key)}")


def _statement_verdict(payload: bytes, *, digest: str, signer: str, predicate_type: str = PREDICATE_TYPE) -> Verified:
    """Whether a verified payload is an in-toto statement of `predicate_type` about `digest` (pure)."""
    try:
        signed = json.loads(payload)
    except ValueError:
        return Verified(ok=False, reason="the signed payload is not JSON")
    if not isinstance(signed, dict):
        return Verified(ok=False, reason="the signed payload is not an in-toto statement")
    algorithm, _, hex_digest = digest.partition(":")
    subjects = [s.get("digest", {}).get(algorithm) for s in signed.get("subject") or [] if isinstance(s, dict)]
    if signed.get("_type") != STATEMENT_TYPE or signed.get("predicateType") != predicate_type:
        return Verified(ok=False, reason="the signed statement is not a stackproof receipt attestation")
    if hex_digest not in subjects:
        return Verified(ok=False, reason=f"the signed statement is about another image, not {digest}")
    predicate = signed.get("predicate")
    if not isinstance(predicate, dict):
        return Verified(ok=False, reason="the signed statement has no receipt")
    return Verified(ok=True, reason=signer, receipt=predicate)


# -- keyless: sigstore bundles -----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Identity:
    """Who must have signed: the OIDC issuer and the certificate's subject (a workflow URL or an email)."""

    issuer: str
    subject: str

    def __str__(self) -> str:
        return f"{self.issuer}/{self.subject}"


def parse_identity(text: str) -> Identity:
    """`ISSUER/SUBJECT`: the issuer URL, a slash, then the subject, e.g.
    `https://token.actions.githubusercontent.com/https://github.com/ORG/REPO/.github/workflows/verify.yml@refs/heads/main`.
    The subject starts at its own `https://` (a workflow), else after the last slash (an email)."""
    text = text.strip()
    scheme = text.find("://")
    second = text.find("/https://", scheme + 3) if scheme > 0 else -1
    if second < 0:
        second = text.find("/http://", scheme + 3) if scheme > 0 else -1
    if second < 0 and scheme > 0 and "@" in text.rpartition("/")[2]:
        second = text.rfind("/")
    issuer, subject = (text[:second], text[second + 1 :]) if second > 0 else ("", "")
    if not issuer.startswith(("https://", "http://")) or not subject or any(c.isspace() for c in text):
        raise InputError(
            f"--identity {text!r}: write ISSUER/SUBJECT, e.g. https://token.actions.githubusercontent.com/"
            "https://github.com/ORG/REPO/.github/workflows/verify.yml@refs/heads/main"
        )
    return Identity(issuer=issuer, subject=subject)


def verify_sigstore_bundle(
    bundle: bytes,
    *,
    identity: Identity,
    digest: str,
    trusted_root: Path | None = None,
    predicate_type: str = PREDICATE_TYPE,
) -> Verified:
    """Whether `bundle` is a sigstore bundle whose DSSE statement about `digest` was signed by `identity`.

    sigstore-python checks the certificate chain to the trusted root, the signed certificate
    timestamps, the transparency log entry and its inclusion proof, and the certificate's issuer and
    subject. `trusted_root`: a trusted_root.json to verify against offline (an air-gapped site, or
    GitHub's own instance for private repositories: `gh attestation trusted-root`); without it, the
    public-good instance's root, refreshed through TUF (network)."""
    try:
        from sigstore.errors import Error as SigstoreError
        from sigstore.errors import VerificationError
        from sigstore.models import Bundle, InvalidBundle
        from sigstore.verify import Verifier, policy
        from sigstore.verify.policy import Identity as IdentityPolicy
    except ImportError as exc:  # an optional extra: keyless verification only
        raise InputError("--identity needs sigstore-python: pip install 'stackproof[keyless]'") from exc
    try:
        parsed = Bundle.from_json(bundle)
    except (InvalidBundle, ValueError) as exc:
        return Verified(ok=False, reason=f"not a sigstore bundle ({exc})")
    verifier = _verifier(Verifier, trusted_root)
    wanted: policy.VerificationPolicy = IdentityPolicy(identity=identity.subject, issuer=identity.issuer)
    try:
        payload_type, payload = verifier.verify_dsse(parsed, wanted)
    except VerificationError as exc:
        return Verified(ok=False, reason=f"sigstore: {exc} (wanted {identity})")
    except SigstoreError as exc:
        return Verified(ok=False, reason=f"sigstore: {exc}")
    if payload_type != PAYLOAD_TYPE:
        return Verified(ok=False, reason=f"the bundle's envelope carries {payload_type!r}, not an in-toto statement")
    return _statement_verdict(payload, digest=digest, signer=f"signed by {identity}", predicate_type=predicate_type)


def _verifier(verifier_type: Any, trusted_root: Path | None) -> Any:
    from sigstore.errors import Error as SigstoreError
    from sigstore.models import TrustedRoot
    from sigstore_models.trustroot import v1 as trustroot_v1

    try:
        if trusted_root is None:
            return verifier_type.production()
        # Not TrustedRoot.from_file: it reads the path whole, whatever it is.
        data = boundedio.read_bytes(trusted_root, "trusted root", limit=TRUSTED_ROOT_LIMIT)
        return verifier_type(trusted_root=TrustedRoot(trustroot_v1.TrustedRoot.from_json(data)))
    except InputError as exc:
        raise InputError(f"--trusted-root {exc}") from None
    except (SigstoreError, ValueError) as exc:
        where = f"--trusted-root {trusted_root}" if trusted_root else "the sigstore public-good trust root (TUF)"
        if trusted_root is not None:
            raise InputError(f"{where}: not a sigstore trusted root ({exc})") from exc
        raise InfraError(f"{where} could not be fetched: {exc}; give --trusted-root FILE offline") from exc


def bundle_statement_problems(bundle: bytes, *, digest: str, receipt: dict[str, Any]) -> list[str]:
    """Why a sigstore bundle is not the attestation of `receipt` about `digest` (pure; no signature
    is checked here: pull does that). Publish runs it so a bundle made for another image or receipt
    is refused before it is attached."""
    try:
        doc = json.loads(bundle)
        envelope = doc["dsseEnvelope"]
        payload = base64.b64decode(envelope["payload"], validate=True)
        media_type = str(doc["mediaType"])
    except (ValueError, KeyError, TypeError):
        return ["it is not a sigstore bundle holding a DSSE envelope"]
    problems = []
    if not media_type.startswith("application/vnd.dev.sigstore.bundle"):
        problems.append(f"its mediaType is {media_type!r}, not a sigstore bundle's")
    verdict = _statement_verdict(payload, digest=digest, signer="")
    if not verdict.ok:
        problems.append(verdict.reason)
    elif verdict.receipt != receipt:
        problems.append("its predicate is not this receipt")
    return problems


def _sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()
