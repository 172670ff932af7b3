"""The host model store: `hf:` models at their pinned commit, fetched once, served offline.

Without it every server start (startup, autotune, each arm) downloaded the model inside its
container, 15-23 GB for the GPU cells, inside the readiness timeout. Now `stackproof model fetch
CELL` (or `run`/`verify`, before anything starts) fills a store on the host once, and every server
container gets that store mounted read-only with the hub switched off, so `readiness_timeout`
covers only the start.

The store is the hub's own cache layout (`models--ORG--NAME/{blobs,snapshots,refs}`), written and
read by huggingface_hub itself (`snapshot_download`), never parsed here: whatever vLLM inside the
image does to find `ORG/NAME` at `--revision` in `HF_HUB_CACHE` offline finds it. The store is
`$STACKPROOF_MODEL_STORE`, else `models/` in the tool's cache directory.

A token reaches the hub as the library reads it (`HF_TOKEN` in the environment) and reaches a
container only as `--env HF_TOKEN`: the name, with docker taking the value from its own
environment, so the value is in no argv, echo, log or report of ours.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
import re
import shutil
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from pipeline.cache import cache_dir
from pipeline.errors import InfraError, InputError
from pipeline.guard import httppolicy
from pipeline.matrix.model import ModelSource, ServeSpec

__all__ = [
    "CONTAINER_STORE",
    "STORE_ENV",
    "TOKEN_ENV",
    "FetchResult",
    "ModelMounts",
    "ensure_model",
    "fetch",
    "model_mounts",
    "snapshot_in_store",
    "store_dir",
]

STORE_ENV = "STACKPROOF_MODEL_STORE"
TOKEN_ENV = "HF_TOKEN"
ENDPOINT_ENV = "HF_ENDPOINT"  # huggingface_hub's own setting: a mirror or an internal hub
CONTAINER_STORE = "/stackproof/models"  # fixed, so a server's argv does not depend on the host's paths
# Seconds without a byte before a download is given up (the library retries a few times, resuming).
# The library's own HF_HUB_DOWNLOAD_TIMEOUT, when set, wins.
STALL_TIMEOUT_S = 60
# Downloads land here first (inside the store: one filesystem, so promotion is a rename); the store
# proper gets a snapshot only after its commit and every file's hash check out.
INCOMING = ".incoming"
MAX_FILES = 10_000  # a model repository lists tens of files; a listing of more is refused
_COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True, kw_only=True)
class FetchResult:
    """One `hf:` model at one commit in the store; `bytes_downloaded` is what this call added."""

    repo_id: str
    revision: str
    store: Path
    snapshot: Path
    files: int
    bytes_in_store: int  # the repo's blobs, all revisions
    bytes_downloaded: int
    seconds: float
    already_present: bool


@dataclass(frozen=True, kw_only=True)
class ModelMounts:
    """What a server container needs to serve its `hf:` model from the store, offline."""

    volumes: tuple[tuple[Path, str], ...] = ()  # (host, container), always read-only
    env: tuple[tuple[str, str], ...] = ()
    env_names: tuple[str, ...] = ()  # passed by name only: docker copies the value from its own environment


def store_dir(environ: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    explicit = environ.get(STORE_ENV)
    return Path(explicit) if explicit else cache_dir() / "models"


def model_mounts(
    serve: ServeSpec, *, store: Path | None = None, environ: Mapping[str, str] | None = None
) -> ModelMounts:
    """The store read-only at CONTAINER_STORE, the hub off, and HF_TOKEN by name when this host has one.

    Only HF_HUB_CACHE points into the read-only mount: HF_HOME (the modules cache, xet's cache, a
    token file) stays the image's writable default, so nothing inside needs to write to the store.
    `path:` models are in the image and get nothing.
    """
    if serve.model.kind != "hf":
        return ModelMounts()
    environ = os.environ if environ is None else environ
    host = (store or store_dir(environ)).resolve()
    return ModelMounts(
        volumes=((host, CONTAINER_STORE),),
        env=(("HF_HUB_CACHE", CONTAINER_STORE), ("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1")),
        env_names=(TOKEN_ENV,) if environ.get(TOKEN_ENV) else (),
    )


def ensure_model(
    model: ModelSource, *, where: str, store: Path | None = None, allow_fetch: bool = True
) -> FetchResult | None:
    """Make sure the store holds `model` at its revision before any server starts; None for `path:` models.

    `where` locates the cell (`FILE:LINE: cells[ID].serve.model`) in the messages. With
    `allow_fetch=False` a missing model is an infrastructure problem (exit 3), and the hub is never asked.
    """
    if model.kind != "hf":
        return None
    store = store or store_dir()
    present = snapshot_in_store(model, store)
    if present is not None:
        result = _result(model, store, present, downloaded=0, seconds=0.0, already=True)
        print(f"model {model.location}@{model.revision}: in the store ({present})", file=sys.stderr)
        return result
    if not allow_fetch:
        raise InfraError(
            f"{where}: {model.location}@{model.revision} is not in the model store {store} and fetching is off: "
            f"run `stackproof model fetch` for this cell where the hub is reachable ({ENDPOINT_ENV}), "
            f"or point {STORE_ENV} at a store that has it"
        )
    print(f"model {model.location}@{model.revision}: not in the store {store}; fetching it first", file=sys.stderr)
    return fetch(model, store=store, where=where)


def snapshot_in_store(model: ModelSource, store: Path) -> Path | None:
    """The complete snapshot of `model` at its revision in `store`, or None (missing or cut short).

    huggingface_hub decides, from its own cached file listing of that commit, never the network.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    if not store.is_dir():
        return None
    try:
        path = snapshot_download(model.location, revision=model.revision, cache_dir=store, local_files_only=True)
    except LocalEntryNotFoundError:  # also IncompleteSnapshotError, its subclass
        return None
    return Path(path)


def _transport_errors() -> tuple[type[Exception], ...]:
    """The HTTP client's connection errors: huggingface_hub 2.x talks through httpx2, 1.x through httpx."""
    errors: list[type[Exception]] = []
    for module in ("httpx2", "httpx"):
        with contextlib.suppress(ImportError, AttributeError):
            errors.append(importlib.import_module(module).TransportError)
    return tuple(errors)


def fetch(model: ModelSource, *, store: Path | None = None, where: str = "") -> FetchResult:
    """Download `model` at its revision into `store` (resuming a cut download), progress on stderr.

    Exit 2 when the hub says the revision or the repository does not exist; exit 3 when the hub
    cannot be reached, stalls, refuses the token, or answers with an error.
    """
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if model.kind != "hf" or not model.revision:
        raise InputError(f"{where or model.source}: only an hf: model with a revision can be fetched")
    store = store or store_dir()
    store.mkdir(parents=True, exist_ok=True)
    present = snapshot_in_store(model, store)
    if present is not None:
        return _result(model, store, present, downloaded=0, seconds=0.0, already=True)
    # Like HF_ENDPOINT, the library reads its stall timeout once at import; set it for this call.
    stall = int(os.environ.get("HF_HUB_DOWNLOAD_TIMEOUT") or STALL_TIMEOUT_S)
    constants.HF_HUB_DOWNLOAD_TIMEOUT = stall
    # The library reads HF_ENDPOINT once, at import; read it at the call so the message and the request agree.
    endpoint = os.environ.get(ENDPOINT_ENV) or constants.ENDPOINT
    name = f"{model.location}@{model.revision}"
    prefix = f"{where}: " if where else ""
    listing = _listing(model, endpoint, stall=stall, prefix=prefix)
    staging = store / INCOMING
    _seed(staging, store, model)  # blobs the store has already are not downloaded again
    before = _blob_bytes(staging, model)
    unreachable: tuple[type[Exception], ...] = (LocalEntryNotFoundError, OSError, *_transport_errors())
    started = time.monotonic()
    try:
        path = snapshot_download(model.location, revision=model.revision, cache_dir=staging, endpoint=endpoint)
    except RevisionNotFoundError as exc:
        raise InputError(
            f"{prefix}revision {model.revision} of {model.location} does not exist at the hub ({endpoint}): "
            "pin a commit the repository has (its commit history lists them)"
        ) from exc
    except GatedRepoError as exc:
        raise InfraError(
            f"{prefix}{model.location} is gated: accept its terms on the hub and set {TOKEN_ENV} to a token "
            f"with access ({exc.response.status_code} from {endpoint})"
        ) from exc
    except RepositoryNotFoundError as exc:
        raise InputError(
            f"{prefix}the hub ({endpoint}) has no repository {model.location} "
            f"(a private one also needs {TOKEN_ENV} set to a token with access)"
        ) from exc
    except HfHubHTTPError as exc:
        raise InfraError(f"{prefix}the hub ({endpoint}) answered an error while fetching {name}: {exc}") from exc
    except unreachable as exc:
        cause = exc.__cause__ or exc  # the library wraps the connection error it gave up on
        raise InfraError(
            f"{prefix}cannot fetch {name}: the hub at {endpoint} is unreachable or stalled "
            f"({type(cause).__name__}: {cause}); check the network or set {ENDPOINT_ENV} to a reachable mirror. "
            "A partial download is kept and resumed by the next fetch."
        ) from exc
    except ValueError as exc:  # the library refuses a hostile answer (a `../` file name) with a plain error
        raise InfraError(f"{prefix}the hub ({endpoint}) answered what cannot be stored for {name}: {exc}") from exc
    seconds = time.monotonic() - started
    downloaded = _blob_bytes(staging, model) - before
    problems = verify_snapshot(model, _repo_dir(staging, model), Path(path), listing)
    if problems:
        shutil.rmtree(_repo_dir(staging, model), ignore_errors=True)  # nothing of an answer that lied is kept
        raise InfraError(
            f"{prefix}the hub ({endpoint}) answered {name} with what is not that commit: {'; '.join(problems[:5])}"
            f"{f' (and {len(problems) - 5} more)' if len(problems) > 5 else ''}; nothing was stored"
        )
    snapshot = _promote(staging, store, model, Path(path).name)
    result = _result(model, store, snapshot, downloaded=downloaded, seconds=seconds)
    print(
        f"model {name}: {result.bytes_downloaded:,} bytes downloaded in {seconds:.1f}s; "
        f"{result.files} files, {result.bytes_in_store:,} bytes in {result.snapshot}",
        file=sys.stderr,
    )
    return result


def _listing(model: ModelSource, endpoint: str, *, stall: int, prefix: str) -> dict[str, dict[str, Any]] | None:
    """The hub's file listing of the commit under the HTTP policy (a read timeout of `stall`, a body
    cap, at most MAX_FILES files, every page on the hub's own origin): path -> entry. None when the
    hub answers no listing (the library then says why: an unknown revision, a gated repository)."""
    policy = httppolicy.HttpPolicy(read_s=stall, total_s=max(4 * stall, 60), max_items=MAX_FILES, max_body=64 << 20)
    url: str | None = f"{endpoint.rstrip('/')}/api/models/{model.location}/tree/{model.revision}?recursive=true"
    token = os.environ.get(TOKEN_ENV)
    entries: list[Any] = []
    what = f"{prefix}the hub's file listing of {model.location}@{model.revision}"
    with httpx.Client(timeout=policy.timeout(), follow_redirects=False) as client:
        while url is not None:
            headers = {"Authorization": f"Bearer {token}"} if token and httppolicy.same_origin(url, endpoint) else {}
            try:
                response = httppolicy.fetch(
                    client, client.build_request("GET", url, headers=headers), policy=policy, what=what
                )
            except httpx.HTTPError as exc:
                raise InfraError(
                    f"{what}: the hub at {endpoint} is unreachable or stalled ({type(exc).__name__}); "
                    f"check the network or set {ENDPOINT_ENV} to a reachable mirror"
                ) from exc
            if response.status_code != 200:
                return None
            try:
                page = response.json()
            except ValueError as exc:
                raise InfraError(f"{what}: the answer is not JSON") from exc
            if not isinstance(page, list):
                raise InfraError(f"{what}: the answer is not a list of files")
            entries = httppolicy.cap_items([*entries, *page], policy=policy, what=what)
            following = response.links.get("next", {}).get("url")
            url = following if following and httppolicy.same_origin(following, endpoint) else None
    return {str(e["path"]): e for e in entries if isinstance(e, dict) and e.get("type") == "file" and "path" in e}


def verify_snapshot(
    model: ModelSource, repo_dir: Path, snapshot: Path, listing: dict[str, dict[str, Any]] | None
) -> list[str]:
    """Why the downloaded snapshot is not `model` at its pinned commit (empty: it is). Pure but for reads.

    The commit: the library names the snapshot and `refs/` after the commit the hub answered, so a
    hub answering another commit shows as another snapshot or a ref. The files: each one's bytes
    against its blob's name (the ETag the hub announced: the git blob id, or the sha256 of an LFS
    file) and against the listing's oid / LFS sha256."""
    problems = []
    pinned = model.revision or ""
    if _COMMIT.fullmatch(pinned):
        if snapshot.name != pinned:
            problems.append(f"the snapshot is commit {snapshot.name}, not the pinned {pinned}")
        others = sorted(p.name for p in (repo_dir / "snapshots").glob("*") if p.name != pinned)
        if others:
            problems.append(f"the hub answered commit {others[0]} for the pinned {pinned}")
        for ref in sorted((repo_dir / "refs").glob("*")) if (repo_dir / "refs").is_dir() else ():
            if ref.is_file() and ref.read_text(errors="replace").strip() != pinned:
                problems.append(f"refs/{ref.name} names {ref.read_text(errors='replace').strip()[:40]}")
    if not snapshot.is_dir():
        return [*problems, "no snapshot was written"]
    blobs = (repo_dir / "blobs").resolve()
    files = {p.relative_to(snapshot).as_posix(): p for p in snapshot.rglob("*") if not p.is_dir()}
    for relative, link in sorted(files.items()):
        target = link.resolve()
        if blobs not in target.parents or not target.is_file():
            problems.append(f"{relative}: not a file of the repository's blobs")
            continue
        sha256, git = _hashes(target)
        announced = target.name
        if announced not in (sha256, git):
            problems.append(f"{relative}: its bytes do not match the hash the hub announced ({announced[:12]}...)")
        entry = (listing or {}).get(relative)
        if entry is not None:
            lfs = (entry.get("lfs") or {}).get("oid") if isinstance(entry.get("lfs"), dict) else None
            if (lfs or entry.get("oid")) not in (sha256, git):
                problems.append(f"{relative}: its bytes are not the file the listing names")
    if listing is not None:
        missing = sorted(set(listing) - set(files))
        if missing:
            problems.append(f"files of the listing not in the snapshot: {', '.join(missing[:3])}")
    return problems


def _hashes(path: Path) -> tuple[str, str]:
    """(sha256, git blob id) of a file, streamed."""
    size = path.stat().st_size
    sha256, git = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % size)
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            sha256.update(chunk)
            git.update(chunk)
    return sha256.hexdigest(), git.hexdigest()


def _seed(staging: Path, store: Path, model: ModelSource) -> None:
    """Hard links in the staging area to the blobs the store holds (a resumed or repaired fetch
    downloads only what is missing; the store's own files are never written to)."""
    have = _repo_dir(store, model) / "blobs"
    if not have.is_dir():
        return
    into = _repo_dir(staging, model) / "blobs"
    into.mkdir(parents=True, exist_ok=True)
    for blob in have.iterdir():
        if blob.is_file() and not blob.name.endswith(".incomplete") and not (into / blob.name).exists():
            with contextlib.suppress(OSError):
                os.link(blob, into / blob.name)


def _promote(staging: Path, store: Path, model: ModelSource, commit: str) -> Path:
    """Move the verified repository from the staging area into the store: blobs first, then the
    tree listing and refs, the snapshot's links last (so a snapshot in the store is always whole)."""
    source, target = _repo_dir(staging, model), _repo_dir(store, model)
    entries = sorted(
        (p for p in source.rglob("*") if not p.is_dir()), key=lambda p: p.relative_to(source).parts[0] == "snapshots"
    )
    for path in entries:
        destination = target / path.relative_to(source)
        destination.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, destination)
    shutil.rmtree(source, ignore_errors=True)
    return target / "snapshots" / commit


def _repo_dir(store: Path, model: ModelSource) -> Path:
    # The one fact of the layout used here, for a byte count only; huggingface_hub names it the same way.
    return store / ("models--" + model.location.replace("/", "--"))


def _blob_bytes(store: Path, model: ModelSource) -> int:
    """Bytes under the repo's blobs/, partial downloads (`*.incomplete`) included: the difference
    before and after a fetch is what the fetch downloaded, resumed parts counted once."""
    blobs = _repo_dir(store, model) / "blobs"
    if not blobs.is_dir():
        return 0
    return sum(p.stat().st_size for p in blobs.iterdir() if p.is_file())


def _result(
    model: ModelSource, store: Path, snapshot: Path, *, downloaded: int, seconds: float, already: bool = False
) -> FetchResult:
    files = [p for p in snapshot.rglob("*") if p.is_file()]
    return FetchResult(
        repo_id=model.location,
        revision=model.revision or "",
        store=store,
        snapshot=snapshot,
        files=len(files),
        bytes_in_store=_blob_bytes(store, model),
        bytes_downloaded=downloaded,
        seconds=round(seconds, 2),
        already_present=already,
    )
