"""`stackproof publish` and `stackproof pull`: the registry half of the command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline.errors import InputError, MatrixError
from pipeline.matrix.model import Cell, Matrix
from stackproof.cli.common import NO_PREFLIGHT_HELP, Command, arg, registry_credentials

__all__ = ["COMMANDS"]


def _publish(args: argparse.Namespace) -> int:
    """Exit 1 when the receipt is not PASS (the image and receipt are pushed; no tag is moved)."""
    from pipeline.build.plan import plan_cell
    from pipeline.docker.client import Docker
    from pipeline.matrix.site import load_site
    from pipeline.registry.publish import find_receipt, publish
    from stackproof.cli.common import emit as _emit
    from stackproof.cli.common import load as _load

    credentials = registry_credentials(args, args.registry)  # bad input (exit 2) before any docker or registry
    matrix, images = _load(args)
    cell = matrix.cell(args.cell)
    _refuse_host(matrix, cell, args.receipt)
    site = load_site(matrix)
    tag = plan_cell(matrix, cell, site, images).tag
    image = args.image or tag
    docker = Docker.connect()
    info = docker.image(image)
    if info is None:
        raise InputError(f"{cell.id}: image {image} is not built: run `stackproof run {cell.id}` first")
    receipt = args.receipt or find_receipt(args.out, cell.id, info.id)
    if receipt is None:
        raise InputError(
            f"{cell.id}: no receipt for image {info.id} under {args.out}/{cell.id}/: run `stackproof verify {cell.id}` "
            "first (or give --receipt)"
        )
    result = publish(
        docker,
        cell_id=cell.id,
        image=image,
        content_tag=tag,
        receipt_path=receipt,
        registry=args.registry,
        matrix_digest=matrix.digest,
        platform=cell.platform,
        credentials=credentials,
        sign_key=args.sign_key,
        ca_bundle=str(site.ca_bundle) if site.ca_bundle else None,
        sigstore_bundle=args.sigstore_bundle,
    )
    moved = ", ".join(result.moved_tags) or "no tag moved"
    _emit(args, result.to_json(), f"{result.reference} receipt {result.receipt_status}: {moved}")
    return 0 if result.receipt_status == "PASS" else 1


NO_IMAGE = (
    "publish pushes an image by digest and attaches its receipt to it; a host environment has no image to "
    "attach a receipt to (keep the receipt with the run, or verify the cell's docker runtime)"
)


def _refuse_host(matrix: Matrix, cell: Cell, receipt: Path | None) -> None:
    """A host cell, or a receipt of a host run, is exit 2 before docker or a registry is asked."""
    if cell.on_host:
        raise InputError(f"{matrix.file}:{cell.line}: cells[{cell.id}] runs on the host runtime: {NO_IMAGE}")
    if receipt is None:
        return
    from pipeline.receipt import Receipt

    image = Receipt.read(receipt).image  # the one receipt model: no receipt is read by key
    if image.on_host:
        raise InputError(f"--receipt {receipt}: image.runtime: a receipt of a host run ({image.ref}): {NO_IMAGE}")


def _pull(args: argparse.Namespace) -> int:
    from pipeline.docker.client import Docker
    from pipeline.registry.attest import load_public_key, parse_identity
    from pipeline.registry.pull import pull
    from stackproof.cli.common import emit as _emit

    credentials = registry_credentials(args, args.registry)
    identity = parse_identity(args.identity) if args.identity else None
    if args.require_signature and args.key is None and identity is None:
        raise InputError(
            "--require-signature needs --key PUBLIC.pem (the publisher's ECDSA P-256 public key) "
            "or --identity ISSUER/SUBJECT (keyless, verify.yml's attestation)"
        )
    if args.key is not None and identity is not None:
        raise InputError("--key and --identity: give one (a key-signed or a keyless receipt)")
    # Read here, before docker is asked: a bad key file is exit 2, not exit 3 on a host without a daemon.
    public_key = load_public_key(args.key) if args.key is not None else None
    found = _cell_of(args)
    if found is not None and found[1].is_gpu and not args.no_preflight:
        from pipeline.host.preflight import preflight_job

        docker = preflight_job(*found, tag=None)  # the image's size is known only from the registry
    else:
        docker = Docker.connect()
    result = pull(
        docker,
        cell_id=args.cell,
        registry=args.registry,
        platform=args.platform or (found[1].platform if found is not None else None),
        require_same_gpu=args.require_same_gpu,
        credentials=credentials,
        require_signature=args.require_signature,
        public_key=public_key,
        identity=identity,
        trusted_root=args.trusted_root,
    )
    text = f"{result.local_tag} = {result.reference} (verified on {result.verified_on}; receipt {result.signature})"
    if result.host_differences:
        print(f"note: you have {result.here}", file=sys.stderr)
    _emit(args, result.to_json(), text)
    return 0


def _cell_of(args: argparse.Namespace) -> tuple[Matrix, Cell] | None:
    """The cell a pull names, when the local matrix declares it: `pull` works without a matrix too,
    and then has no cell to preflight (said on stderr, never silently)."""
    from stackproof.cli.common import load as _load

    if not args.matrix.is_file():
        print(f"note: {args.matrix}: no matrix here; no preflight of {args.cell}", file=sys.stderr)
        return None
    try:
        matrix, _ = _load(args)
    except MatrixError:
        print(f"note: {args.matrix} does not load (`stackproof matrix validate`); no preflight", file=sys.stderr)
        return None
    cell = next((c for c in matrix.cells if c.id == args.cell), None)
    if cell is None:
        print(f"note: {args.matrix} declares no cell {args.cell!r}; no preflight", file=sys.stderr)
        return None
    return matrix, cell


# Both commands log in alike: the password never comes from argv.
PASSWORD_STDIN = arg(
    "--password-stdin",
    action="store_true",
    help="read the registry password (or token) from stdin, for the user in STACKPROOF_REGISTRY_USER; "
    "without it, docker's own login (config.json auths, credsStore, credHelpers) is used",
)

COMMANDS = (
    Command(
        path=("publish",),
        help="push a cell's image by digest, attach its receipt, move CELL and CELL-verified only after a PASS",
        handler=_publish,
        args=(
            arg("cell"),
            arg("--registry", required=True, help="HOST[:PORT][/NAMESPACE]; the repository is NAMESPACE/stackproof"),
            arg("--receipt", type=Path, default=None, help="default: the newest receipt of this image under --out"),
            arg(
                "--image",
                default=None,
                help="the local image to publish: only accepted when it is the cell's content tag",
            ),
            arg("--out", type=Path, default=Path("stackproof-out"), help="where `run`/`verify` wrote receipts"),
            arg(
                "--sign-key",
                type=Path,
                default=None,
                help="sign the receipt (in-toto statement, DSSE) with this ECDSA P-256 PEM key; an encrypted key "
                "takes its password from STACKPROOF_SIGN_KEY_PASSWORD",
            ),
            arg(
                "--sigstore-bundle",
                type=Path,
                default=None,
                help="attach this keyless attestation of the receipt "
                "(the sigstore bundle verify.yml's attest step wrote)",
            ),
            PASSWORD_STDIN,
        ),
    ),
    Command(
        path=("pull",),
        help="pull CELL-verified by digest after checking its receipt and host",
        handler=_pull,
        args=(
            arg("cell"),
            arg("--registry", required=True, help="HOST[:PORT][/NAMESPACE]"),
            arg(
                "--require-same-gpu", action="store_true", help="refuse when the receipt's GPUs, driver or arch differ"
            ),
            arg(
                "--require-signature",
                action="store_true",
                help="refuse a receipt that is not signed by --key or --identity",
            ),
            arg("--key", type=Path, default=None, help="the publisher's ECDSA P-256 public key (PEM)"),
            arg(
                "--identity",
                default=None,
                help="keyless: ISSUER/SUBJECT that must have signed, e.g. https://token.actions.githubusercontent.com/"
                "https://github.com/ORG/REPO/.github/workflows/verify.yml@refs/heads/main",
            ),
            arg(
                "--trusted-root",
                type=Path,
                default=None,
                help="keyless: verify offline against this sigstore trusted_root.json "
                "(default: the public-good root, via TUF)",
            ),
            arg(
                "--platform", default=None, help="os/arch of the image to pull (default: the cell's, else the daemon's)"
            ),
            arg("--no-preflight", action="store_true", help=NO_PREFLIGHT_HELP),
            PASSWORD_STDIN,
        ),
    ),
)
