"""Verified pull from an OCI registry: resolve `CELL-verified` (and an index to this platform), find
the receipts that refer to the manifest (referrers API, then the tag schema, then the `.receipt`
tags of earlier versions), take the PASS one of this host's GPUs when there is one, refuse a
missing, non-PASS, mismatched or (with `--require-signature`) unsigned one, pull by digest and tag
`stackproof/CELL:verified`. The registry layout it reads is described in pipeline/registry/publish.py.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.docker.client import CONTAINERD_STORE, Docker
from pipeline.errors import CheckFailed, InfraError, InputError
from pipeline.host.geometry import HostFingerprint, differences, host_fingerprint
from pipeline.receipt import Receipt, ReceiptError, receipt_problems
from pipeline.registry import attest
from pipeline.registry.layout import docker_login, repository, resolve_platform
from pipeline.registry.oci import OCI_INDEX, OCI_MANIFEST, Credentials, Manifest, RegistryClient
from pipeline.registry.publish import RECEIPT_MEDIA_TYPE, legacy_receipt_tag, referrers_tag

__all__ = ["Candidate", "Chosen", "PullResult", "fetch_verified", "pull"]

_repo = repository
_docker_login = docker_login
_resolve = resolve_platform


@dataclass(frozen=True, kw_only=True)
class PullResult:
    reference: str
    digest: str  # the platform manifest pulled
    config_digest: str
    receipt_digest: str
    receipts_found: int
    signature: str  # "verified (...)", "unsigned", "signed, not checked (no --key)"
    local_tag: str
    verified_on: str
    here: str
    host_differences: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "digest": self.digest,
            "config_digest": self.config_digest,
            "receipt_digest": self.receipt_digest,
            "receipts_found": self.receipts_found,
            "signature": self.signature,
            "local_tag": self.local_tag,
            "verified_on": self.verified_on,
            "here": self.here,
            "host_differences": list(self.host_differences),
        }


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One receipt found for a manifest digest, read and judged."""

    artifact: str
    receipt: Receipt | None  # None: it did not parse (`problem` says why)
    document: dict[str, Any]  # the receipt's JSON as pushed: what a signature states
    envelope: bytes | None
    subject: str | None
    problem: str | None  # why it cannot be trusted, or None
    unreadable: bool = False  # the registry failed to serve it (an infrastructure fault, not the receipt's)


@dataclass(frozen=True, kw_only=True)
class Chosen:
    tag_digest: str  # what CELL-verified points at
    manifest: Manifest  # the platform manifest
    candidate: Candidate
    found: int
    signature: str


def fetch_verified(
    client: RegistryClient,
    repo: str,
    cell_id: str,
    *,
    platform: str,
    here_key: str | None,
    public_key: Any = None,
    require_signature: bool = False,
    identity: attest.Identity | None = None,
    trusted_root: Path | None = None,
) -> Chosen:
    """The receipt-checked manifest behind CELL-verified, or CheckFailed saying why not.

    `identity` (keyless): the receipt must carry a sigstore bundle signed by that identity
    (verified against `trusted_root`, else the public-good root); `public_key`: a key-signed envelope."""
    where = f"{client.host}/{repo}"
    # All or nothing: a key or an identity given is a signature required. Without this, a receipt
    # with a garbage envelope beside it was reported "verified (KEY)" because it was never checked.
    require_signature = require_signature or public_key is not None or identity is not None
    top = client.manifest(repo, f"{cell_id}-verified")
    if top is None:
        raise CheckFailed(f"{where}:{cell_id}-verified does not exist: no verified image of {cell_id} was published")
    top, manifest = _resolve(client, repo, top.digest, platform, where=f"{where}:{cell_id}-verified")
    found = [
        _judge(
            client,
            repo,
            artifact,
            manifest,
            cell_id,
            public_key,
            require_signature,
            top.digest,
            keyless=(identity, trusted_root) if identity is not None else None,
        )
        for artifact in _receipt_artifacts(client, repo, manifest.digest)
    ]
    if not found:
        raise CheckFailed(f"{where}:{cell_id}-verified -> {manifest.digest} has no receipt attached: refusing it")
    good = [c for c in found if c.problem is None]
    if not good:
        why = f"{where}:{cell_id}-verified -> {manifest.digest}: no receipt can be trusted: " + "; ".join(
            f"{c.artifact[:19]}: {c.problem}" for c in found
        )
        # Every receipt unreadable (a blob past the cap, a deadline): the registry failed, exit 3.
        raise InfraError(why) if all(c.unreadable for c in found) else CheckFailed(why)
    # This host's GPUs first, then the newest.
    good.sort(
        key=lambda c: (
            c.receipt is not None and c.receipt.host.key == here_key,
            c.receipt.finished_at if c.receipt else "",
        )
    )
    chosen = good[-1]
    if chosen.envelope is None:
        signature = "unsigned"
    elif identity is not None:
        signature = f"verified keyless ({identity})"
    elif public_key is None:
        signature = "signed, not checked (no --key)"
    else:
        signature = f"verified ({attest.key_id(public_key)})"
    return Chosen(tag_digest=top.digest, manifest=manifest, candidate=chosen, found=len(found), signature=signature)


def _receipt_artifacts(client: RegistryClient, repo: str, digest: str) -> list[str]:
    """Digests of the receipt artifacts of `digest`: referrers API, else the tag schema; plus the old tag."""
    listed = client.referrers(repo, digest)
    if listed is None:
        index = client.manifest(repo, referrers_tag(digest), accept=(OCI_INDEX,))
        listed = list(index.json.get("manifests") or []) if index is not None and index.is_index else []
    artifacts = [str(d["digest"]) for d in listed if d.get("artifactType") == RECEIPT_MEDIA_TYPE and d.get("digest")]
    legacy = client.manifest(repo, legacy_receipt_tag(digest), accept=(OCI_MANIFEST,))
    if legacy is not None and legacy.digest not in artifacts:
        artifacts.append(legacy.digest)
    return artifacts


def _judge(
    client: RegistryClient,
    repo: str,
    artifact_digest: str,
    manifest: Manifest,
    cell_id: str,
    public_key: Any,
    require_signature: bool,
    index_digest: str,
    *,
    keyless: tuple[attest.Identity, Path | None] | None = None,
) -> Candidate:
    """One receipt artifact read and judged; `envelope` is the signature material checked: the DSSE
    envelope (a key), or the sigstore bundle (`keyless`: identity and trusted root)."""
    artifact = client.manifest(repo, artifact_digest, accept=(OCI_MANIFEST,))
    if artifact is None:
        return _refused(artifact_digest, None, "listed but gone")
    layers = artifact.json.get("layers") or []
    receipt_layer = next((la for la in layers if la.get("mediaType") == RECEIPT_MEDIA_TYPE), None)
    signature_type = attest.SIGSTORE_BUNDLE_MEDIA_TYPE if keyless else attest.ENVELOPE_MEDIA_TYPE
    envelope_layer = next((la for la in layers if la.get("mediaType") == signature_type), None)
    subject = (artifact.json.get("subject") or {}).get("digest")
    if receipt_layer is None:
        return _refused(artifact.digest, subject, "no receipt layer")
    try:
        document = json.loads(client.get_blob(repo, receipt_layer["digest"]))
        envelope = client.get_blob(repo, envelope_layer["digest"]) if envelope_layer else None
    except (ValueError, InfraError, RecursionError) as exc:
        return _refused(artifact.digest, subject, str(exc), unreadable=isinstance(exc, InfraError))
    try:
        receipt = Receipt.parse(document, source="the receipt")
    except ReceiptError as exc:
        return _refused(artifact.digest, subject, str(exc))
    problem = _receipt_problem(receipt, document, manifest, subject, cell_id, index_digest)
    if problem is None and require_signature:
        if envelope is None:
            problem = "it is not signed (--require-signature)" + (" keyless (no sigstore bundle)" if keyless else "")
        else:
            verdict = (
                attest.verify_sigstore_bundle(
                    envelope, identity=keyless[0], digest=manifest.digest, trusted_root=keyless[1]
                )
                if keyless
                else attest.verify_envelope(envelope, public_key, digest=manifest.digest)
            )
            if not verdict.ok:
                problem = f"signature: {verdict.reason}"
            elif verdict.receipt != document:
                problem = "signature: the receipt is not the one that was signed (tampered)"
    return Candidate(
        artifact=artifact.digest,
        receipt=receipt,
        document=document,
        envelope=envelope,
        subject=subject,
        problem=problem,
    )


def _finished(candidate: Candidate) -> str:
    return candidate.receipt.finished_at if candidate.receipt is not None else ""


def _refused(artifact: str, subject: str | None, problem: str, *, unreadable: bool = False) -> Candidate:
    return Candidate(
        artifact=artifact,
        receipt=None,
        document={},
        envelope=None,
        subject=subject,
        problem=problem,
        unreadable=unreadable,
    )


def _receipt_problem(
    receipt: Receipt, document: dict[str, Any], manifest: Manifest, subject: str | None, cell_id: str, index_digest: str
) -> str | None:
    """Why this receipt (`document`, as read, parsed into `receipt`) does not vouch for `manifest` (pure), or None."""
    if subject != manifest.digest:
        return f"its subject names {subject}, not {manifest.digest}"
    image = receipt.image
    binds = image.id_is  # receipts of stackproof 0.1 bind the config digest (the model's default)
    expected = manifest.config_digest if binds == "config" else manifest.digest
    # On the containerd store a multi-platform image's local id is its index: the tag's digest.
    if image.id != expected and not (binds == "manifest" and image.id == index_digest):
        return f"it is for image {image.id} ({binds} digest), but this image's is {expected}"
    if receipt.cell != cell_id:
        return f"it is for cell {receipt.cell!r}, not {cell_id!r}"
    if receipt.status != "PASS":
        return f"it is {receipt.status} ({receipt.status_reason})"
    inconsistent = receipt_problems(document)
    if inconsistent:
        return "it does not hold together: " + "; ".join(inconsistent)
    return None


def pull(
    docker: Docker,
    *,
    cell_id: str,
    registry: str,
    platform: str | None = None,
    require_same_gpu: bool = False,
    credentials: Credentials | None = None,
    require_signature: bool = False,
    public_key: Any = None,
    ca_bundle: str | None = None,
    here: HostFingerprint | None = None,
    identity: attest.Identity | None = None,
    trusted_root: Path | None = None,
) -> PullResult:
    if require_signature and public_key is None and identity is None:
        raise InputError(
            "--require-signature needs --key PUBLIC.pem (the publisher's ECDSA P-256 public key) "
            "or --identity ISSUER/SUBJECT (keyless)"
        )
    here = here or host_fingerprint(docker.server_version())
    platform = platform or docker.platform()
    host, repo = _repo(registry)
    with RegistryClient(host, credentials=credentials, ca_bundle=ca_bundle) as client:
        client.check()
        chosen = fetch_verified(
            client,
            repo,
            cell_id,
            platform=platform,
            here_key=here.key,
            public_key=public_key,
            require_signature=require_signature,
            identity=identity,
            trusted_root=trusted_root,
        )
    if chosen.candidate.receipt is None:  # never: a candidate without a problem parsed
        raise CheckFailed(f"{cell_id}: the chosen receipt did not parse")
    verified = chosen.candidate.receipt.host
    diffs = tuple(differences(verified, here))
    if diffs:
        message = f"{cell_id}: verified on {verified.describe()}, you have {here.describe()} ({'; '.join(diffs)})"
        if require_same_gpu:
            raise CheckFailed(
                message + f" ({chosen.found} receipt(s), none from this host's GPUs): refusing (--require-same-gpu); "
                "nothing was pulled"
            )
        print(f"warning: {message}", file=sys.stderr)
    if chosen.signature == "unsigned":
        print(f"note: {cell_id}: the receipt is unsigned: it is only as trustworthy as the registry", file=sys.stderr)
    digest = chosen.manifest.digest
    config = str(chosen.manifest.config_digest)
    reference = f"{host}/{repo}@{digest}"
    docker.pull(reference, login=_docker_login(credentials))
    local = f"stackproof/{cell_id}:verified"
    docker.tag(reference, local)
    info = docker.image(local)
    expected = digest if docker.image_store() == CONTAINERD_STORE else config
    if info is None or info.id != expected:
        docker.remove_image(local)
        raise CheckFailed(f"pulled {reference} but its image id is {info.id if info else None}, not {expected}")
    print(f"{cell_id}: pulled {reference} (verified on {verified.describe()}) as {local}", file=sys.stderr)
    return PullResult(
        reference=reference,
        digest=digest,
        config_digest=config,
        receipt_digest=chosen.candidate.artifact,
        receipts_found=chosen.found,
        signature=chosen.signature,
        local_tag=local,
        verified_on=verified.describe(),
        here=here.describe(),
        host_differences=diffs,
    )
