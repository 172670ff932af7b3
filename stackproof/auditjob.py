"""The audit as a job below the command line: `matrix audit` and `matrix propose` (which audits the
cells it writes) and `repro` (which reads release pins) share these, so no command module imports
another.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from pipeline.matrix.model import Cell, Matrix
from pipeline.releases.pins import ReleaseLookup

__all__ = ["audit_cells", "release_lookup"]


def release_lookup(matrix: Matrix, *, online: bool = True) -> ReleaseLookup:
    """The lookup a command shares: the `pypi` index (or its mirror), the site's CA bundle, the
    metadata kept under the cache directory, an unreachable index asked once."""
    from pipeline.cache import cache_dir
    from pipeline.matrix.site import load_site
    from pipeline.releases.pins import fetch_metadata

    site = load_site(matrix)
    index_url, find_links = "https://pypi.org/simple", None
    if any(ix.name == "pypi" for ix in matrix.indexes):
        mirror = site.index_location(matrix, "pypi")
        if mirror.is_local:  # issue 43: the mirror's directory, never the public index in its place
            find_links = mirror.directory
            index_url = mirror.directory.as_uri()  # the cache's key: not the public index's metadata
        else:
            index_url = mirror.location
    fetch = functools.partial(
        fetch_metadata, index_url=index_url, cert=site.ca_bundle, redact=site.secrets(), find_links=find_links
    )
    return ReleaseLookup(online=online, fetch=fetch, cache=cache_dir(), index_url=index_url)


def audit_cells(matrix: Matrix, cells: list[Cell], lookup: Any) -> Any:
    """The audit of `cells` (`matrix audit`, `matrix propose`): wheels from the cells' indexes
    (mirrors applied) into the cache directory, release pins from `lookup`."""
    from pipeline.cache import cache_dir
    from pipeline.matrix.site import load_site
    from verify.audit import Sources, audit_matrix
    from verify.logs.logscan import load_catalog, rulesets_for

    site = load_site(matrix)

    def index_url(name: str) -> tuple[str, Path | None]:
        url = matrix.index(name).url
        mirror = site.mirror(name)
        if mirror is None:
            return url, None
        return (url, mirror.directory) if mirror.is_local else (mirror.location, None)

    def rulesets(facts: Any) -> list[tuple[str, Any]]:
        # Each rule under the set it came from (two sets may hold equal rules, e.g. no-traceback).
        return [(f"logrules.yaml {rs.id}", r) for rs in rulesets_for(facts) for r in rs.rules]

    return audit_matrix(
        matrix,
        cells,
        sources=Sources(root=cache_dir(), index_url=index_url, cert=site.ca_bundle),
        lookup=lookup,
        rulesets=rulesets,
        signatures=load_catalog(),
    )
