"""Verified publish and pull through an OCI registry.

Layout in the registry, repository `HOST[:PORT][/NAMESPACE]/stackproof`:
- `CELL-<content tag>`: the image, pushed always (immutable: the content tag names its inputs);
- the receipts of image manifest `sha256:<hex>`: OCI artifact manifests (artifactType
  `application/vnd.stackproof.receipt.v1+json`) whose `subject` is that manifest, so a registry
  with the OCI 1.1 referrers API lists them; for registries without it (e.g. distribution 2.8) the
  spec's tag schema `sha256-<hex>` holds an image index of them, updated on each publish, so the
  receipts of several hosts live side by side. A signed receipt carries a second layer: the DSSE
  envelope of an in-toto statement about the manifest digest (pipeline.registry.attest);
- `CELL` and `CELL-verified`: moved to the pushed digest only after a PASS receipt for that image
  is attached, by a manifest PUT of the exact digest, last of all, so an interrupted publish leaves
  the previous verified image where it was.

The identity of an image is its registry manifest digest (its config digest kept as a second
fact): an image index resolves to the cell's platform. Which local digest a receipt names
depends on the verifying daemon's image store (`image.id_is`: `config` on the classic store,
`manifest` on the containerd store); both are checked against the registry's manifest.

Pull resolves `CELL-verified` (and an index to this platform), finds the receipts that refer to the
manifest (referrers API, then the tag schema, then the `.receipt` tags of earlier versions), takes
the PASS one of this host's GPUs when there is one, refuses a missing, non-PASS, mismatched or
(with `--require-signature`) unsigned one, pulls by digest and tags `stackproof/CELL:verified`.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.docker.client import CONTAINERD_STORE, Docker, ImageInfo
from pipeline.errors import CheckFailed, InfraError, InputError
from pipeline.guard import boundedio
from pipeline.guard.jsonfile import read_json
from pipeline.host.geometry import HostFingerprint, differences, host_fingerprint
from pipeline.receipt import RECEIPT_KIND, RECEIPT_SCHEMA_VERSION, receipt_problems
from pipeline.registry import attest
from pipeline.registry.layout import REPOSITORY, content_ref, docker_login, repository, resolve_platform
from pipeline.registry.oci import (
    OCI_INDEX,
    OCI_MANIFEST,
    Credentials,
    Manifest,
    RegistryClient,
    sha256_digest,
)

__all__ = [
    "REPOSITORY",
    "PublishResult",
    "PullResult",
    "find_receipt",
    "legacy_receipt_tag",
    "publish",
    "publishable_problems",
    "pull",
    "referrers_tag",
]

RECEIPT_MEDIA_TYPE = "application/vnd.stackproof.receipt.v1+json"
EMPTY_CONFIG = ("application/vnd.oci.empty.v1+json", b"{}")
# A test hook: `STACKPROOF_TEST_HANG_AT=before-tag` makes publish stop there until killed, so the
# interrupted-publish test can kill it at exactly that point.
HANG_ENV = "STACKPROOF_TEST_HANG_AT"
_INDEX_ATTEMPTS = 5
_INDEX_SETTLE_S = 0.3


def referrers_tag(digest: str) -> str:
    """The OCI referrers tag schema's name for the referrers of `sha256:<hex>`: `sha256-<hex>`."""
    algorithm, _, hex_digest = digest.partition(":")
    return f"{algorithm}-{hex_digest}"


def legacy_receipt_tag(digest: str) -> str:
    """Where stackproof 0.1 put the (single) receipt of `sha256:<hex>`; still read by pull."""
    return referrers_tag(digest) + ".receipt"


# The registry layout's names live in pipeline.registry.layout (build pulls and pushes by them too).
_repo = repository
_docker_login = docker_login
_resolve = resolve_platform


def find_receipt(out_root: Path, cell_id: str, image_id: str) -> Path | None:
    """The newest receipt under `out_root/CELL/*/receipt.json` for this image id."""
    candidates = sorted((out_root / cell_id).glob("*/receipt.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for path in candidates:
        try:
            document = read_json(path, "receipt")
        except InputError:
            continue
        if (document.get("image") if isinstance(document.get("image"), dict) else {}).get("id") == image_id:
            return path
    return None


# -- publish -----------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PublishResult:
    reference: str  # REPO@sha256:... as pushed (a manifest, or an index)
    digest: str  # the pushed digest: what CELL and CELL-verified point at
    manifest_digest: str  # the platform manifest the receipt binds
    config_digest: str
    receipt_status: str
    receipt_digest: str  # the receipt artifact manifest
    referrers: str  # "api" (the registry indexes `subject`) or "tag-schema sha256-<hex>"
    signed: bool
    moved_tags: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "digest": self.digest,
            "manifest_digest": self.manifest_digest,
            "config_digest": self.config_digest,
            "receipt_status": self.receipt_status,
            "receipt_digest": self.receipt_digest,
            "referrers": self.referrers,
            "signed": self.signed,
            "moved_tags": list(self.moved_tags),
        }


def publishable_problems(
    receipt: dict[str, Any],
    report: dict[str, Any] | None,
    *,
    cell_id: str,
    image_id: str,
    content_tag: str,
    matrix_digest: str,
) -> list[str]:
    """Why this receipt may not be published as the cell's image (pure). Empty: it may.

    A receipt must be one this tool wrote for this cell's own content-tagged image under this
    matrix: its image id and ref, cell and matrix digest must be those, its status must follow
    from its own stages, and the run's report.json beside it must give those same stages."""
    problems: list[str] = []
    image = receipt.get("image") or {}
    if receipt.get("cell") != cell_id:
        problems.append(f"it is for cell {receipt.get('cell')!r}, not {cell_id!r}")
    if image.get("id") != image_id:
        problems.append(f"it is for image {image.get('id')}, not {content_tag} ({image_id})")
    if image.get("ref") != content_tag:
        problems.append(f"it verified {image.get('ref')!r}, not the cell's content tag {content_tag}")
    if receipt.get("matrix_digest") != matrix_digest:
        problems.append(
            f"it was made under matrix {receipt.get('matrix_digest')}, not this matrix.yaml ({matrix_digest})"
        )
    if (receipt.get("tool") or {}).get("name") != "stackproof":
        problems.append("it was not written by stackproof")
    if image.get("id_is", "config") not in ("config", "manifest"):
        problems.append(f"image.id_is {image.get('id_is')!r} is neither config nor manifest")
    problems += receipt_problems(receipt)
    if report is None:
        problems.append("no report.json beside it: it is not the output of a `stackproof run`/`verify`")
    else:
        ran = [(s.get("stage"), s.get("status")) for s in report.get("stages") or []]
        said = [(s.get("stage"), s.get("status")) for s in receipt.get("stages") or []]
        if ran != said:
            problems.append(f"its stages {said} are not those of the run's report.json {ran}")
        if report.get("image_id") != image.get("id") or report.get("cell") != receipt.get("cell"):
            problems.append("the run's report.json is for another image or cell")
    return problems


def publish(
    docker: Docker,
    *,
    cell_id: str,
    image: str,
    content_tag: str,
    receipt_path: Path,
    registry: str,
    matrix_digest: str,
    platform: str,
    credentials: Credentials | None = None,
    sign_key: Path | None = None,
    ca_bundle: str | None = None,
    sigstore_bundle: Path | None = None,
) -> PublishResult:
    own = docker.image(content_tag)
    info = docker.image(image)
    if info is None:
        raise InputError(f"{cell_id}: image {image} is not here: build or verify it first")
    if own is None or own.id != info.id:
        raise InputError(
            f"{cell_id}: {image} is not the cell's own image {content_tag}: publish only publishes the image "
            "built from this cell (`stackproof build`), never another one under its name"
        )
    receipt = _read_json(receipt_path, "the receipt")
    if receipt.get("kind") != RECEIPT_KIND or receipt.get("schema_version") != RECEIPT_SCHEMA_VERSION:
        raise InputError(f"{receipt_path}: not a stackproof receipt of schema_version {RECEIPT_SCHEMA_VERSION}")
    report_path = receipt_path.parent / "report.json"
    report = _read_json(report_path, "the run's report") if report_path.is_file() else None
    problems = publishable_problems(
        receipt, report, cell_id=cell_id, image_id=info.id, content_tag=content_tag, matrix_digest=matrix_digest
    )
    if problems:
        raise InputError(f"{receipt_path}: refusing to publish it: " + "; ".join(problems))
    key = attest.load_private_key(sign_key, password=os.environ.get(attest.PASSWORD_ENV)) if sign_key else None
    bundle = _read_bytes(sigstore_bundle, "--sigstore-bundle") if sigstore_bundle else None
    store = docker.image_store()
    host, repo = _repo(registry)
    with RegistryClient(host, credentials=credentials, ca_bundle=ca_bundle) as client:
        client.check()
        candidate = content_ref(registry, cell_id, content_tag)
        pushed = _already_pushed(client, repo, info, f"{host}/{repo}")
        if pushed is not None:
            # A fleet's GPU runner verified the image it pulled by digest from the build runner's
            # push: publish that very manifest (a second push could write another manifest).
            print(f"{cell_id}: {host}/{repo}@{pushed} is already in the registry: not pushed again", file=sys.stderr)
        else:
            docker.tag(image, candidate)
            try:
                pushed = docker.push(candidate, login=_docker_login(credentials))
            finally:
                docker.remove_image(candidate)
        top, manifest = _resolve(client, repo, pushed, platform, where=candidate)
        config = str(manifest.config_digest)
        local = pushed if store == CONTAINERD_STORE else config
        if info.id != local:
            raise CheckFailed(
                f"{candidate}: the registry's image ({pushed}, config {config}) is not the local image {info.id}"
            )
        envelope = (
            attest.sign_receipt(key, name=f"{host}/{repo}", digest=manifest.digest, receipt=receipt) if key else None
        )
        if bundle is not None:
            problems = attest.bundle_statement_problems(bundle, digest=manifest.digest, receipt=receipt)
            if problems:
                raise InputError(f"--sigstore-bundle {sigstore_bundle}: refusing to attach it: " + "; ".join(problems))
        artifact, how = _attach_receipt(client, repo, manifest, receipt, envelope, bundle)
        print(
            f"{cell_id}: receipt ({receipt['status']}) of {repo}@{manifest.digest} is {artifact} ({how})",
            file=sys.stderr,
        )
        moved: tuple[str, ...] = ()
        if receipt["status"] == "PASS":
            _checkpoint("before-tag")
            for human in (f"{cell_id}-verified", cell_id):
                client.put_manifest(repo, human, top.body, top.media_type)
                print(f"{cell_id}: moved {host}/{repo}:{human} -> {pushed}", file=sys.stderr)
            moved = (f"{cell_id}-verified", cell_id)
        else:
            print(
                f"{cell_id}: receipt is {receipt['status']} ({receipt.get('status_reason')}): "
                f"{cell_id} and {cell_id}-verified stay where they were",
                file=sys.stderr,
            )
    return PublishResult(
        reference=f"{host}/{repo}@{pushed}",
        digest=pushed,
        manifest_digest=manifest.digest,
        config_digest=config,
        receipt_status=str(receipt["status"]),
        receipt_digest=artifact,
        referrers=how,
        signed=envelope is not None or bundle is not None,
        moved_tags=moved,
    )


def _already_pushed(client: RegistryClient, repo: str, info: ImageInfo, name: str) -> str | None:
    """The digest of a manifest in `name` this local image was pulled from (its RepoDigests), when
    the registry still has it; None otherwise."""
    for entry in info.repo_digests:
        where, _, digest = entry.rpartition("@")
        if where == name and digest.startswith("sha256:") and client.manifest(repo, digest) is not None:
            return digest
    return None


def _read_bytes(path: Path, what: str) -> bytes:
    return boundedio.read_bytes(path, what, limit=64 * 2**20)


def _read_json(path: Path, what: str) -> dict[str, Any]:
    data: dict[str, Any] = read_json(path, what)
    return data


def _attach_receipt(
    client: RegistryClient,
    repo: str,
    subject: Manifest,
    receipt: dict[str, Any],
    envelope: bytes | None,
    bundle: bytes | None = None,
) -> tuple[str, str]:
    """Push the receipt artifact by digest; list it under the subject (referrers API or tag schema)."""
    body = json.dumps(receipt, indent=2, default=str).encode()
    config_type, config = EMPTY_CONFIG
    layers = [
        {
            "mediaType": RECEIPT_MEDIA_TYPE,
            "digest": client.put_blob(repo, body),
            "size": len(body),
            "annotations": {"org.opencontainers.image.title": "receipt.json"},
        }
    ]
    if envelope is not None:
        layers.append(
            {
                "mediaType": attest.ENVELOPE_MEDIA_TYPE,
                "digest": client.put_blob(repo, envelope),
                "size": len(envelope),
                "annotations": {"org.opencontainers.image.title": "receipt.intoto.dsse.json"},
            }
        )
    if bundle is not None:  # the keyless attestation of the same statement (verify.yml's attest step)
        layers.append(
            {
                "mediaType": attest.SIGSTORE_BUNDLE_MEDIA_TYPE,
                "digest": client.put_blob(repo, bundle),
                "size": len(bundle),
                "annotations": {"org.opencontainers.image.title": "receipt.sigstore.json"},
            }
        )
    annotations = {
        "io.stackproof.status": str(receipt["status"]),
        "io.stackproof.cell": str(receipt["cell"]),
        "io.stackproof.host-key": str((receipt.get("host") or {}).get("key", "")),
        "io.stackproof.host": str((receipt.get("host") or {}).get("summary", "")),
        "io.stackproof.config-digest": str(subject.config_digest),
        "io.stackproof.signed": "true" if envelope is not None or bundle is not None else "false",
        "org.opencontainers.image.created": str(receipt.get("finished_at", "")),
    }
    artifact = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": RECEIPT_MEDIA_TYPE,
        "config": {"mediaType": config_type, "digest": client.put_blob(repo, config), "size": len(config)},
        "layers": layers,
        "subject": {"mediaType": subject.media_type, "digest": subject.digest, "size": len(subject.body)},
        "annotations": annotations,
    }
    artifact_body = json.dumps(artifact, indent=2).encode()
    digest = sha256_digest(artifact_body)
    response = client.put_manifest(repo, digest, artifact_body, OCI_MANIFEST)
    if response.headers.get("OCI-Subject") == subject.digest:
        return digest, "api"  # the registry indexes `subject` itself (OCI 1.1)
    descriptor = {
        "mediaType": OCI_MANIFEST,
        "digest": digest,
        "size": len(artifact_body),
        "artifactType": RECEIPT_MEDIA_TYPE,
        "annotations": annotations,
    }
    tag = referrers_tag(subject.digest)
    return digest, f"tag-schema {tag} ({_list_in_index(client, repo, tag, descriptor)} receipt(s))"


def _list_in_index(client: RegistryClient, repo: str, tag: str, descriptor: dict[str, Any]) -> int:
    """Add `descriptor` to the tag schema's index `tag`, keeping every receipt listed there; the count.

    A registry has no compare-and-swap on a tag, so two publishes at once (one per GPU host) could
    each read the index, and the later PUT drop the earlier one's receipt. So after writing, wait a
    moment, read it back, and when this receipt (or one seen before) is missing, merge and write
    again. This closes the race of writers that overlap within the settle time, not every race."""
    known: dict[str, dict[str, Any]] = {}
    for attempt in range(_INDEX_ATTEMPTS):
        existing = client.manifest(repo, tag, accept=(OCI_INDEX,))
        for entry in existing.json.get("manifests") or [] if existing is not None and existing.is_index else []:
            known.setdefault(str(entry.get("digest")), entry)
        known.pop(str(descriptor["digest"]), None)
        wanted = [*known.values(), descriptor]
        index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": wanted}
        client.put_manifest(repo, tag, json.dumps(index, indent=2).encode(), OCI_INDEX)
        time.sleep(_INDEX_SETTLE_S * (1 + random.random()))  # a concurrent writer's PUT lands meanwhile
        after = client.manifest(repo, tag, accept=(OCI_INDEX,))
        listed = {str(d.get("digest")) for d in (after.json.get("manifests") or [])} if after is not None else set()
        if all(str(d["digest"]) in listed for d in wanted):
            return len(listed)
        print(
            f"note: {tag} was rewritten by another publish meanwhile: merging (attempt {attempt + 2})", file=sys.stderr
        )
    raise InfraError(f"{client.host}/{repo}:{tag}: other publishes kept rewriting the index; publish again")


def _checkpoint(name: str) -> None:
    if os.environ.get(HANG_ENV) == name:
        print(f"stackproof: test hook: holding at {name} until killed", file=sys.stderr, flush=True)
        while True:
            time.sleep(1)


# -- pull -------------------------------------------------------------------------------------------


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
    receipt: dict[str, Any]
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
        key=lambda c: (str((c.receipt.get("host") or {}).get("key")) == here_key, str(c.receipt.get("finished_at")))
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
        return Candidate(artifact=artifact_digest, receipt={}, envelope=None, subject=None, problem="listed but gone")
    layers = artifact.json.get("layers") or []
    receipt_layer = next((la for la in layers if la.get("mediaType") == RECEIPT_MEDIA_TYPE), None)
    signature_type = attest.SIGSTORE_BUNDLE_MEDIA_TYPE if keyless else attest.ENVELOPE_MEDIA_TYPE
    envelope_layer = next((la for la in layers if la.get("mediaType") == signature_type), None)
    subject = (artifact.json.get("subject") or {}).get("digest")
    if receipt_layer is None:
        return Candidate(
            artifact=artifact.digest, receipt={}, envelope=None, subject=subject, problem="no receipt layer"
        )
    try:
        receipt = json.loads(client.get_blob(repo, receipt_layer["digest"]))
        envelope = client.get_blob(repo, envelope_layer["digest"]) if envelope_layer else None
    except (ValueError, InfraError) as exc:
        unreadable = isinstance(exc, InfraError)
        return Candidate(
            artifact=artifact.digest,
            receipt={},
            envelope=None,
            subject=subject,
            problem=str(exc),
            unreadable=unreadable,
        )
    problem = _receipt_problem(receipt, manifest, subject, cell_id, index_digest)
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
            elif verdict.receipt != receipt:
                problem = "signature: the receipt is not the one that was signed (tampered)"
    return Candidate(artifact=artifact.digest, receipt=receipt, envelope=envelope, subject=subject, problem=problem)


def _receipt_problem(
    receipt: Any, manifest: Manifest, subject: str | None, cell_id: str, index_digest: str
) -> str | None:
    """Why this receipt does not vouch for `manifest` (pure), or None."""
    if not isinstance(receipt, dict) or receipt.get("kind") != RECEIPT_KIND:
        return "not a stackproof receipt"
    if subject != manifest.digest:
        return f"its subject names {subject}, not {manifest.digest}"
    image = receipt.get("image") or {}
    binds = image.get("id_is", "config")  # receipts of stackproof 0.1 bind the config digest
    expected = manifest.config_digest if binds == "config" else manifest.digest
    # On the containerd store a multi-platform image's local id is its index: the tag's digest.
    if image.get("id") != expected and not (binds == "manifest" and image.get("id") == index_digest):
        return f"it is for image {image.get('id')} ({binds} digest), but this image's is {expected}"
    if receipt.get("cell") != cell_id:
        return f"it is for cell {receipt.get('cell')!r}, not {cell_id!r}"
    if receipt.get("status") != "PASS":
        return f"it is {receipt.get('status')} ({receipt.get('status_reason')})"
    inconsistent = receipt_problems(receipt)
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
    key: Path | None = None,
    ca_bundle: str | None = None,
    here: HostFingerprint | None = None,
    identity: attest.Identity | None = None,
    trusted_root: Path | None = None,
) -> PullResult:
    if require_signature and key is None and identity is None:
        raise InputError(
            "--require-signature needs --key PUBLIC.pem (the publisher's ECDSA P-256 public key) "
            "or --identity ISSUER/SUBJECT (keyless)"
        )
    public_key = attest.load_public_key(key) if key is not None else None
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
    receipt = chosen.candidate.receipt
    verified = HostFingerprint.parse(receipt.get("host") or {})
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
