"""A local package index on 127.0.0.1 (stdlib http.server over a folder: each project a directory
whose listing is its PEP 503 page), and stand-in release wheels whose METADATA is all pip reads.
Used by tests/unit/test_release_watch.py and tests/integration/test_release_watch.py."""

from __future__ import annotations

import functools
import threading
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

__all__ = ["local_index", "release_wheel"]

MACHINES = ("x86_64", "aarch64")


def release_wheel(root: Path, name: str, version: str, requires: list[str], *, tag: str = "cp38-abi3") -> list[Path]:
    """`name==version` wheels (manylinux_2_28, both machines) with these Requires-Dist, under root/name/."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    dist = f"{name.replace('-', '_')}-{version}"
    out = []
    for machine in MACHINES:
        path = folder / f"{dist}-{tag}-manylinux_2_28_{machine}.whl"
        metadata = "".join(f"Requires-Dist: {r}\n" for r in requires)
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr(f"{name.split('-')[0]}/__init__.py", f'__version__ = "{version}"\n')
            archive.writestr(
                f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{metadata}"
            )
            archive.writestr(
                f"{dist}.dist-info/WHEEL", f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {tag}\n"
            )
            archive.writestr(f"{dist}.dist-info/RECORD", "")
        out.append(path)
    return out


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # no access log on stderr
        pass


@contextmanager
def local_index(root: Path) -> Iterator[str]:
    """Serve `root` on 127.0.0.1 (a free port) while the block runs; yields the index URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
