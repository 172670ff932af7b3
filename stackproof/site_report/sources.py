"""Where receipts come from: run directories on disk, or a registry. The only I/O of the report.

A run directory gives the receipt and what the run left beside it (requests.jsonl, scrapes.jsonl,
the server log, JUnit, the summary); a registry gives the receipt alone, and the pages then say
"not available" where they would show the raw series.
"""

from __future__ import annotations

import json
import re
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import InputError
from pipeline.guard.boundedio import iter_lines, open_input, read_bytes
from pipeline.receipt import Receipt
from stackproof.site_report.model import (
    ORIGIN_REGISTRY,
    ORIGIN_RUN_DIR,
    LoadRaw,
    Shown,
    load_raw,
    parse_receipt,
    show,
)

__all__ = ["Fixtures", "read_fixtures", "receipts_from_dirs", "receipts_from_registry"]

# A server log is linked from the cell page; a soak's can be hundreds of MB, so only its tail is copied.
LOG_TAIL_BYTES = 2_000_000
# junit.xml and summary.md are copied whole up to this; a larger one is rendered from the receipt.
COPY_LIMIT_BYTES = 8 * 2**20
RECEIPT_LIMIT_BYTES = 64 * 2**20


def receipts_from_dirs(roots: Sequence[Path], origin: str = ORIGIN_RUN_DIR) -> list[Shown]:
    """Every receipt.json under each root (a run directory, a cell's, or a whole --out tree)."""
    receipts = []
    for root in roots:
        if not root.exists():
            raise InputError(f"--receipts {root}: no such directory")
        files = [root] if root.is_file() else sorted(root.rglob("receipt.json"))
        if not files:
            raise InputError(f"--receipts {root}: no receipt.json under it (write them with `stackproof run CELL`)")
        receipts += [_read_run(path, origin) for path in files]
    return receipts


def _read_run(path: Path, origin: str) -> Shown:
    document = _read_json(path)
    receipt = Receipt.parse(document, source=str(path))
    run_dir = path.parent
    artifacts = {(s.stage, name): where for s in receipt.stages for name, where in s.artifacts.items()}
    raw = _raw(artifacts, run_dir, path)
    files: dict[str, bytes] = {}
    for name in ("junit.xml", "summary.md"):
        beside = _inside(run_dir / name, run_dir)
        if beside is not None and beside.stat().st_size <= COPY_LIMIT_BYTES:
            files[name] = read_bytes(beside, name, limit=COPY_LIMIT_BYTES)
    log = _local(artifacts.get(("load", "server_log")) or artifacts.get(("startup", "server_log")), run_dir)
    if log is not None:
        files["server.log"] = _tail(log)
    return show(receipt, document, source=str(path), origin=origin, raw=raw, files=files)


def _read_json(path: Path) -> Any:
    data = read_bytes(path, "receipt", limit=RECEIPT_LIMIT_BYTES)
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not text (byte {exc.start})") from exc
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{exc.lineno}:{exc.colno}: not JSON: {exc.msg}") from exc
    except RecursionError:
        raise InputError(f"{path}: nested too deeply to be a receipt") from None


def _local(artifact: str | None, run_dir: Path) -> Path | None:
    """The artifact inside the scanned run directory: receipts record paths on the verifying host,
    and a run directory that was copied (a CI artifact, a fixture) lives somewhere else. Only a
    file inside the run directory is ever read: no `..`, no symlink out (`_inside`)."""
    if not artifact:
        return None
    parts = Path(artifact).parts
    if ".." in parts:
        return None
    if run_dir.name in parts:
        found = _inside(run_dir.joinpath(*parts[parts.index(run_dir.name) + 1 :]), run_dir)
        if found is not None:
            return found
    return _inside(Path(artifact), run_dir)


def _inside(path: Path, run_dir: Path) -> Path | None:
    """`path` when it is a regular file under `run_dir` with no symlink on the way; else None."""
    root = run_dir.resolve()
    try:
        relative = path.absolute().relative_to(run_dir.absolute())
    except ValueError:
        return None
    current = run_dir
    for part in relative.parts:
        current = current / part
        if part == ".." or current.is_symlink():
            return None
    try:
        info = current.stat()
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode) or root not in current.resolve().parents:
        return None
    return current


def _raw(artifacts: dict[tuple[str, str], str], run_dir: Path, receipt: Path) -> LoadRaw | None:
    requests = _local(artifacts.get(("load", "requests")), run_dir)
    scrapes = _local(artifacts.get(("load", "scrapes")), run_dir)
    if requests is None or scrapes is None:
        return None
    return load_raw(_jsonl(requests), _jsonl(scrapes))


def _jsonl(path: Path) -> Iterator[dict[str, Any]]:
    for number, line in iter_lines(path, "load record file"):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InputError(f"{path}:{number}: not JSON: {getattr(exc, 'msg', exc)}") from exc
        except RecursionError:
            raise InputError(f"{path}:{number}: nested too deeply to be a record") from None
        if isinstance(record, dict):
            yield record


def _tail(path: Path) -> bytes:
    size = path.stat().st_size
    with open_input(path, "server log") as f:
        if size <= LOG_TAIL_BYTES:
            return f.read()
        f.seek(size - LOG_TAIL_BYTES)
        return f"[stackproof report: the first {size - LOG_TAIL_BYTES} bytes are cut]\n".encode() + f.read()


# -- a registry ----------------------------------------------------------------------------------------


def receipts_from_registry(registry: str, *, ca_bundle: str | None = None, credentials: Any = None) -> list[Shown]:
    """Every receipt attached in the registry's stackproof repository.

    A thin adapter over pipeline.registry.oci / pipeline.registry.publish (`_repo`, `RECEIPT_MEDIA_TYPE`,
    `RegistryClient.check/manifest/get_blob/tags/referrers`), with the command's credentials.
    It finds receipt artifacts three ways, as pull does: the OCI tag schema's `sha256-<hex>` image
    indexes, the referrers API for image tags without one, and the `sha256-<hex>.receipt` tags of
    stackproof 0.1; then reads each artifact's receipt layer.
    """
    from pipeline.registry.oci import RegistryClient
    from pipeline.registry.publish import RECEIPT_MEDIA_TYPE, _repo

    host, repo = _repo(registry)
    receipts = []
    with RegistryClient(host, ca_bundle=ca_bundle, credentials=credentials) as client:
        client.check()
        tags = sorted(client.tags(repo))
        artifacts: dict[str, str] = {}  # artifact manifest digest -> the tag it was found through
        indexed = set()
        for tag in tags:
            if _TAG_SCHEMA.fullmatch(tag):
                index = client.manifest(repo, tag)
                for d in _dicts(index.json.get("manifests")) if index is not None else []:
                    if d.get("artifactType") == RECEIPT_MEDIA_TYPE and d.get("digest"):
                        artifacts.setdefault(str(d["digest"]), tag)
                indexed.add(tag)
            elif tag.endswith(".receipt") and _TAG_SCHEMA.fullmatch(tag.removesuffix(".receipt")):
                legacy = client.manifest(repo, tag)
                if legacy is not None:
                    artifacts.setdefault(legacy.digest, tag)
        for tag in tags:
            if _TAG_SCHEMA.fullmatch(tag.removesuffix(".receipt")):
                continue
            image = client.manifest(repo, tag)
            if image is None or image.digest.replace(":", "-", 1) in indexed:
                continue
            for d in _dicts(client.referrers(repo, image.digest)):
                if d.get("artifactType") == RECEIPT_MEDIA_TYPE and d.get("digest"):
                    artifacts.setdefault(str(d["digest"]), tag)
        for digest, tag in sorted(artifacts.items()):
            artifact = client.manifest(repo, digest)
            if artifact is None:
                continue
            layers = [x for x in _dicts(artifact.json.get("layers")) if x.get("mediaType") == RECEIPT_MEDIA_TYPE]
            if not layers:
                continue
            where = f"{host}/{repo}@{digest} (via {tag})"
            try:
                document = json.loads(client.get_blob(repo, str(layers[0].get("digest"))))
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise InputError(f"{where}: receipt layer is not JSON: {getattr(exc, 'msg', exc)}") from exc
            except RecursionError:
                raise InputError(f"{where}: receipt layer is nested too deeply to be a receipt") from None
            receipts.append(parse_receipt(document, source=where, origin=ORIGIN_REGISTRY))
    return receipts


_TAG_SCHEMA = re.compile(r"sha256-[0-9a-f]{64}")


def _dicts(value: Any) -> list[dict[str, Any]]:
    """The objects of a registry's list (a hostile registry's other shapes are no descriptors)."""
    return [d for d in value if isinstance(d, dict)] if isinstance(value, list) else []


# -- GPU fixtures (a page of their own, never a square) ------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Fixtures:
    """Autotune caches and NVML samples read from fixture files, each with the file it came from."""

    autotune: tuple[tuple[str, dict[str, str], list[dict[str, Any]]], ...]  # (file, cache metadata, winners)
    nvml: tuple[tuple[str, dict[str, Any]], ...]  # (file, {host, gpu_idle, gpu_busy})


def read_fixtures(root: Path) -> Fixtures:
    from verify.kernels.autotune import read_cache
    from verify.stages.autotune import winners_table

    if not root.is_dir():
        raise InputError(f"--fixtures {root}: no such directory")
    autotune = []
    for path in sorted((root / "autotune").glob("*.json")):
        cache = read_cache(path)
        autotune.append((str(path), cache.metadata, winners_table(cache)))
    nvml = []
    for path in sorted((root / "gpu").glob("*.json")):
        document = _read_json(path)
        if isinstance(document, dict) and "gpu_busy" in document:
            nvml.append((str(path), document))
    return Fixtures(autotune=tuple(autotune), nvml=tuple(nvml))
