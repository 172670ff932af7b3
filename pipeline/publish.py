"""Verified publish and pull through an OCI registry.

Layout in the registry, repository `HOST[:PORT][/NAMESPACE]/stackproof`:
- `CELL-<content tag>`: the image, pushed always (immutable: the content tag names its inputs);
- `sha256-<hex>.receipt`: the receipt of image manifest `sha256:<hex>`, an OCI artifact whose
  `subject` is that manifest (for registries with the referrers API) and whose tag follows the
  referrers tag-schema convention (for those without, e.g. distribution 2.8);
- `CELL` and `CELL-verified`: moved to the manifest digest only after a PASS receipt for that
  image is attached. They are moved by a manifest PUT of the exact digest, last of all, so an
  interrupted publish leaves the previous verified image where it was.

Pull resolves `CELL-verified`, reads the receipt attached to that digest, refuses a missing,
non-PASS or mismatched one, compares the receipt's host with this one, pulls by digest and tags
the image locally as `stackproof/CELL:verified`.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline import cmd
from pipeline.engine import Engine
from pipeline.errors import CheckFailed, InputError
from pipeline.host import HostFingerprint, differences, host_fingerprint
from pipeline.registry import OCI_MANIFEST, RegistryClient, split_registry

__all__ = ["PublishResult", "PullResult", "find_receipt", "publish", "pull", "receipt_tag"]

REPOSITORY = "stackproof"
RECEIPT_MEDIA_TYPE = "application/vnd.stackproof.receipt.v1+json"
EMPTY_CONFIG = ("application/vnd.oci.empty.v1+json", b"{}")
# A test hook: `STACKPROOF_TEST_HANG_AT=before-tag` makes publish stop there until killed, so the
# interrupted-publish test can kill it at exactly that point.
HANG_ENV = "STACKPROOF_TEST_HANG_AT"


def receipt_tag(digest: str) -> str:
    """The referrers tag-schema name for the receipt of `sha256:<hex>`."""
    algorithm, _, hex_digest = digest.partition(":")
    return f"{algorithm}-{hex_digest}.receipt"


def _repo(registry: str) -> tuple[str, str]:
    host, namespace = split_registry(registry)
    return host, f"{namespace}/{REPOSITORY}" if namespace else REPOSITORY


def find_receipt(out_root: Path, cell_id: str, image_id: str) -> Path | None:
    """The newest receipt under `out_root/CELL/*/receipt.json` for this image id."""
    candidates = sorted((out_root / cell_id).glob("*/receipt.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for path in candidates:
        try:
            if json.loads(path.read_text()).get("image", {}).get("id") == image_id:
                return path
        except (OSError, ValueError):
            continue
    return None


@dataclass(frozen=True, kw_only=True)
class PublishResult:
    reference: str  # REPO@sha256:...
    digest: str
    receipt_status: str
    receipt_tag: str
    moved_tags: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "digest": self.digest,
            "receipt_status": self.receipt_status,
            "receipt_tag": self.receipt_tag,
            "moved_tags": list(self.moved_tags),
        }


def publish(
    engine: Engine,
    *,
    cell_id: str,
    image: str,
    content_tag: str,
    receipt_path: Path,
    registry: str,
    ca_bundle: str | None = None,
) -> PublishResult:
    info = engine.image(image)
    if info is None:
        raise InputError(f"{cell_id}: image {image} is not here: build or verify it first")
    receipt = _read_receipt(receipt_path)
    if receipt.get("image", {}).get("id") != info.id:
        raise InputError(
            f"{receipt_path}: the receipt is for image {receipt.get('image', {}).get('id')}, not {image} ({info.id})"
        )
    if receipt.get("cell") != cell_id:
        raise InputError(f"{receipt_path}: the receipt is for cell {receipt.get('cell')!r}, not {cell_id!r}")
    host, repo = _repo(registry)
    with RegistryClient(host, ca_bundle=ca_bundle) as client:
        client.check()
        candidate = f"{host}/{repo}:{cell_id}-{content_tag.rsplit(':', 1)[-1]}"
        digest = _push(engine, image, candidate)
        manifest = client.manifest(repo, digest)
        if manifest is None or manifest.config_digest != info.id:
            raise CheckFailed(f"{candidate}: the registry's manifest {digest} is not image {info.id}")
        tag = _attach_receipt(client, repo, manifest.digest, manifest.media_type, len(manifest.body), receipt)
        print(f"{cell_id}: receipt ({receipt['status']}) attached to {repo}@{digest} as :{tag}", file=sys.stderr)
        moved: tuple[str, ...] = ()
        if receipt["status"] == "PASS":
            _checkpoint("before-tag")
            for human in (f"{cell_id}-verified", cell_id):
                client.put_manifest(repo, human, manifest.body, manifest.media_type)
                print(f"{cell_id}: moved {host}/{repo}:{human} -> {digest}", file=sys.stderr)
            moved = (f"{cell_id}-verified", cell_id)
        else:
            print(
                f"{cell_id}: receipt is {receipt['status']} ({receipt.get('status_reason')}): "
                f"{cell_id} and {cell_id}-verified stay where they were",
                file=sys.stderr,
            )
    return PublishResult(
        reference=f"{host}/{repo}@{digest}",
        digest=digest,
        receipt_status=str(receipt["status"]),
        receipt_tag=tag,
        moved_tags=moved,
    )


def _read_receipt(path: Path) -> dict[str, Any]:
    try:
        receipt: dict[str, Any] = json.loads(path.read_text())
    except OSError as exc:
        raise InputError(f"{path}: cannot read the receipt: {exc.strerror}") from exc
    except ValueError as exc:
        raise InputError(f"{path}: not a receipt (not JSON: {exc})") from exc
    if receipt.get("kind") != "stackproof.receipt" or receipt.get("schema_version") != 1:
        raise InputError(f"{path}: not a stackproof receipt of schema_version 1")
    return receipt


def _push(engine: Engine, image: str, reference: str) -> str:
    """Push `image` as `reference`; return the manifest digest the registry stored. The local alias is removed."""
    engine.docker("tag", image, reference, quiet=True)
    lines: list[str] = []
    try:

        def on_line(line: str) -> None:
            lines.append(line)
            print(f"[push] {line}", file=sys.stderr, flush=True)

        cmd.stream([engine.cli.path, "push", reference], on_line=on_line, timeout=3600)
    finally:
        engine.docker("rmi", reference, check=False, quiet=True)
    match = next((m for line in reversed(lines) if (m := re.search(r"digest: (sha256:[0-9a-f]{64})", line))), None)
    if match is None:
        raise CheckFailed(f"docker push {reference}: no digest in its output")
    return match.group(1)


def _attach_receipt(
    client: RegistryClient, repo: str, digest: str, media_type: str, size: int, receipt: dict[str, Any]
) -> str:
    body = json.dumps(receipt, indent=2, default=str).encode()
    config_type, config = EMPTY_CONFIG
    config_digest = client.put_blob(repo, config)
    layer_digest = client.put_blob(repo, body)
    artifact = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": RECEIPT_MEDIA_TYPE,
        "config": {"mediaType": config_type, "digest": config_digest, "size": len(config)},
        "layers": [
            {
                "mediaType": RECEIPT_MEDIA_TYPE,
                "digest": layer_digest,
                "size": len(body),
                "annotations": {"org.opencontainers.image.title": "receipt.json"},
            }
        ],
        "subject": {"mediaType": media_type, "digest": digest, "size": size},
        "annotations": {
            "io.stackproof.status": str(receipt["status"]),
            "io.stackproof.cell": str(receipt["cell"]),
            "io.stackproof.host-key": str(receipt.get("host", {}).get("key", "")),
            "org.opencontainers.image.created": str(receipt.get("finished_at", "")),
        },
    }
    tag = receipt_tag(digest)
    client.put_manifest(repo, tag, json.dumps(artifact, indent=2).encode(), OCI_MANIFEST)
    return tag


def _checkpoint(name: str) -> None:
    if os.environ.get(HANG_ENV) == name:
        print(f"stackproof: test hook: holding at {name} until killed", file=sys.stderr, flush=True)
        while True:
            time.sleep(1)


# -- pull -------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PullResult:
    reference: str
    digest: str
    local_tag: str
    verified_on: str
    here: str
    host_differences: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "digest": self.digest,
            "local_tag": self.local_tag,
            "verified_on": self.verified_on,
            "here": self.here,
            "host_differences": list(self.host_differences),
        }


def fetch_verified(client: RegistryClient, repo: str, cell_id: str) -> tuple[str, str, dict[str, Any]]:
    """(manifest digest, image config digest, receipt) behind CELL-verified, or CheckFailed saying why not."""
    where = f"{client.host}/{repo}"
    manifest = client.manifest(repo, f"{cell_id}-verified")
    if manifest is None:
        raise CheckFailed(f"{where}:{cell_id}-verified does not exist: no verified image of {cell_id} was published")
    artifact = client.manifest(repo, receipt_tag(manifest.digest))
    if artifact is None:
        raise CheckFailed(f"{where}:{cell_id}-verified -> {manifest.digest} has no receipt attached: refusing it")
    layers = [layer for layer in artifact.json.get("layers", []) if layer.get("mediaType") == RECEIPT_MEDIA_TYPE]
    if not layers:
        raise CheckFailed(f"{where}:{receipt_tag(manifest.digest)} holds no receipt layer: refusing it")
    receipt: dict[str, Any] = json.loads(client.get_blob(repo, layers[0]["digest"]))
    subject = (artifact.json.get("subject") or {}).get("digest")
    if subject != manifest.digest:
        raise CheckFailed(f"the receipt at {receipt_tag(manifest.digest)} names {subject}, not {manifest.digest}")
    if receipt.get("image", {}).get("id") != manifest.config_digest:
        raise CheckFailed(
            f"the receipt is for image {receipt.get('image', {}).get('id')}, but {cell_id}-verified is image "
            f"{manifest.config_digest}: refusing it"
        )
    if receipt.get("cell") != cell_id:
        raise CheckFailed(f"the receipt is for cell {receipt.get('cell')!r}, not {cell_id!r}")
    if receipt.get("status") != "PASS":
        raise CheckFailed(
            f"the receipt of {manifest.digest} is {receipt.get('status')} ({receipt.get('status_reason')}): refusing it"
        )
    return manifest.digest, str(manifest.config_digest), receipt


def pull(
    engine: Engine,
    *,
    cell_id: str,
    registry: str,
    require_same_gpu: bool = False,
    ca_bundle: str | None = None,
    here: HostFingerprint | None = None,
) -> PullResult:
    host, repo = _repo(registry)
    with RegistryClient(host, ca_bundle=ca_bundle) as client:
        client.check()
        digest, image_id, receipt = fetch_verified(client, repo, cell_id)
    verified = HostFingerprint.parse(receipt.get("host") or {})
    here = here or host_fingerprint(engine.cli.path)
    diffs = tuple(differences(verified, here))
    if diffs:
        message = f"{cell_id}: verified on {verified.describe()}, you have {here.describe()} ({'; '.join(diffs)})"
        if require_same_gpu:
            raise CheckFailed(message + ": refusing (--require-same-gpu); nothing was pulled")
        print(f"warning: {message}", file=sys.stderr)
    reference = f"{host}/{repo}@{digest}"
    cmd.stream([engine.cli.path, "pull", reference], on_line=lambda line: print(f"[pull] {line}", file=sys.stderr))
    local = f"stackproof/{cell_id}:verified"
    engine.docker("tag", reference, local, quiet=True)
    info = engine.image(local)
    if info is None or info.id != image_id:
        raise CheckFailed(f"pulled {reference} but its image id is {info.id if info else None}, not {image_id}")
    print(f"{cell_id}: pulled {reference} (verified on {verified.describe()}) as {local}", file=sys.stderr)
    return PullResult(
        reference=reference,
        digest=digest,
        local_tag=local,
        verified_on=verified.describe(),
        here=here.describe(),
        host_differences=diffs,
    )
