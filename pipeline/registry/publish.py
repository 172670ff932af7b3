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

Pull is pipeline/registry/pull.py: it reads this layout back and trusts only a receipt that holds.
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
from pipeline.receipt import Receipt, ReceiptError, receipt_problems
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
from pipeline.registry.rundir import RunDir, run_problems

__all__ = [
    "REPOSITORY",
    "PublishResult",
    "find_receipt",
    "legacy_receipt_tag",
    "publish",
    "publishable_problems",
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
            if Receipt.read(path).image.id == image_id:
                return path
        except InputError:
            continue  # not a receipt this tool reads: never the one to publish
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
    run: RunDir,
    *,
    cell_id: str,
    image_id: str,
    content_tag: str,
    matrix_digest: str,
) -> list[str]:
    """Why this receipt may not be published as the cell's image (pure). Empty: it may.

    A receipt must be one this tool wrote for this cell's own content-tagged image under this
    matrix: its image id and ref, cell and matrix digest must be those, its status must follow
    from its own stages, and it must be the output of a run: the directory `run` it sits in holds
    what that run wrote beside it, and agrees with it (pipeline.registry.rundir)."""
    try:
        parsed = Receipt.parse(receipt)
    except ReceiptError as exc:
        return [str(exc)]
    problems: list[str] = []
    image = parsed.image
    if parsed.cell != cell_id:
        problems.append(f"it is for cell {parsed.cell!r}, not {cell_id!r}")
    if image.id != image_id:
        problems.append(f"it is for image {image.id}, not {content_tag} ({image_id})")
    if image.ref != content_tag:
        problems.append(f"it verified {image.ref!r}, not the cell's content tag {content_tag}")
    if parsed.matrix_digest != matrix_digest:
        problems.append(f"it was made under matrix {parsed.matrix_digest}, not this matrix.yaml ({matrix_digest})")
    if parsed.tool_name != "stackproof":
        problems.append("it was not written by stackproof")
    if image.id_is not in ("config", "manifest"):
        problems.append(f"image.id_is {image.id_is!r} is neither config nor manifest")
    problems += receipt_problems(receipt)
    problems += run_problems(parsed, run)
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
    info, receipt, document = _gate(
        docker, cell_id=cell_id, image=image, content_tag=content_tag, receipt_path=receipt_path,
        matrix_digest=matrix_digest,
    )  # fmt: skip
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
            attest.sign_receipt(key, name=f"{host}/{repo}", digest=manifest.digest, receipt=document) if key else None
        )
        if bundle is not None:
            problems = attest.bundle_statement_problems(bundle, digest=manifest.digest, receipt=document)
            if problems:
                raise InputError(f"--sigstore-bundle {sigstore_bundle}: refusing to attach it: " + "; ".join(problems))
        artifact, how = _attach_receipt(client, repo, manifest, receipt, envelope, bundle, document=document)
        print(
            f"{cell_id}: receipt ({receipt.status}) of {repo}@{manifest.digest} is {artifact} ({how})",
            file=sys.stderr,
        )
        moved = _move_tags(client, repo, top, receipt, cell_id=cell_id, where=f"{host}/{repo}", pushed=pushed)
    return PublishResult(
        reference=f"{host}/{repo}@{pushed}",
        digest=pushed,
        manifest_digest=manifest.digest,
        config_digest=config,
        receipt_status=receipt.status,
        receipt_digest=artifact,
        referrers=how,
        signed=envelope is not None or bundle is not None,
        moved_tags=moved,
    )


def _gate(
    docker: Docker, *, cell_id: str, image: str, content_tag: str, receipt_path: Path, matrix_digest: str
) -> tuple[ImageInfo, Receipt, dict[str, Any]]:
    """The local image, the receipt and its document as written, when publish may go on; else InputError."""
    own = docker.image(content_tag)
    info = docker.image(image)
    if info is None:
        raise InputError(f"{cell_id}: image {image} is not here: build or verify it first")
    if own is None or own.id != info.id:
        raise InputError(
            f"{cell_id}: {image} is not the cell's own image {content_tag}: publish only publishes the image "
            "built from this cell (`stackproof build`), never another one under its name"
        )
    # The document as written is what is pushed and signed (a sigstore bundle states those very
    # bytes' JSON); everything read from it is read through the typed model.
    document = _read_json(receipt_path, "the receipt")
    receipt = Receipt.parse(document, source=str(receipt_path))
    problems = publishable_problems(
        document,
        RunDir.read(receipt_path.parent),
        cell_id=cell_id,
        image_id=info.id,
        content_tag=content_tag,
        matrix_digest=matrix_digest,
    )
    if problems:
        raise InputError(f"{receipt_path}: refusing to publish it: " + "; ".join(problems))
    return info, receipt, document


def _move_tags(
    client: RegistryClient, repo: str, top: Manifest, receipt: Receipt, *, cell_id: str, where: str, pushed: str
) -> tuple[str, ...]:
    """CELL-verified and CELL to the pushed digest, last of all, and only for a PASS receipt."""
    if receipt.status != "PASS":
        print(
            f"{cell_id}: receipt is {receipt.status} ({receipt.status_reason}): "
            f"{cell_id} and {cell_id}-verified stay where they were",
            file=sys.stderr,
        )
        return ()
    _checkpoint("before-tag")
    for human in (f"{cell_id}-verified", cell_id):
        client.put_manifest(repo, human, top.body, top.media_type)
        print(f"{cell_id}: moved {where}:{human} -> {pushed}", file=sys.stderr)
    return (f"{cell_id}-verified", cell_id)


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
    receipt: Receipt,
    envelope: bytes | None,
    bundle: bytes | None = None,
    *,
    document: dict[str, Any] | None = None,
) -> tuple[str, str]:
    """Push the receipt artifact by digest; list it under the subject (referrers API or tag schema).
    `document`: the receipt's JSON as read from its file (default: the model's own serialisation)."""
    body = json.dumps(document if document is not None else receipt.to_json(), indent=2, default=str).encode()
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
        "io.stackproof.status": receipt.status,
        "io.stackproof.cell": receipt.cell,
        "io.stackproof.host-key": receipt.host.key,
        "io.stackproof.host": receipt.host.describe(),
        "io.stackproof.config-digest": str(subject.config_digest),
        "io.stackproof.signed": "true" if envelope is not None or bundle is not None else "false",
        "org.opencontainers.image.created": receipt.finished_at,
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
