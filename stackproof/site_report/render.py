"""Site -> files: the HTML pages, index.json, the stylesheet and the receipts they link to.

Pure: `render_site` returns {relative path: bytes}; the command writes them. Templates live in
templates/ (jinja2, autoescaped); plots come from plots.py as inline SVG.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

import jinja2
from markupsafe import Markup

from pipeline.guard.jsonfile import jsonable
from stackproof.site_report import plots
from stackproof.site_report.model import (
    NUMBERS,
    STATUS_LABELS,
    TRIO,
    VERSIONED,
    Compare,
    Shown,
    Site,
    number,
    pin_rows,
    prefer,
    winner_changes,
)
from stackproof.site_report.perfdocs import PerfDocs
from stackproof.site_report.sources import Fixtures

__all__ = ["INDEX_KIND", "render_site"]

INDEX_KIND = "stackproof.report-index"


@dataclass(frozen=True, kw_only=True)
class Links:
    """Where one receipt's files are in the site, relative to the site's root."""

    receipt: str
    summary: str | None
    junit: str | None
    server_log: str | None


def render_site(
    site: Site, *, generated_at: str, fixtures: Fixtures | None = None, perf: PerfDocs | None = None
) -> dict[str, bytes]:
    env = _environment()
    out: dict[str, bytes] = {"style.css": resources.files(__package__).joinpath("style.css").read_bytes()}
    links: dict[str, Links] = {}
    for receipt in site.receipts:
        links[receipt.id] = _receipt_files(receipt, out)
    common = {
        "generated_at": generated_at,
        "labels": STATUS_LABELS,
        "links": links,
        "has_fixtures": bool(fixtures),
        "slug": slug,
    }
    perf = perf or PerfDocs()
    out["index.html"] = _page(env, "index.html.j2", root="", site=site, filters=_filters(site), perf=perf, **common)
    document = jsonable(index_document(site, links, generated_at))  # strict JSON: a NaN is null
    out["index.json"] = (json.dumps(document, indent=1, allow_nan=False) + "\n").encode()
    for cell in site.cells:
        receipts = site.by_cell[cell]
        out[f"cells/{slug(cell)}.html"] = _page(
            env,
            "cell.html.j2",
            root="../",
            site=site,
            cell=cell,
            receipts=receipts,
            heads=_heads(receipts),
            plots=_cell_plots(cell, receipts),
            compares=site.compares[cell],
            sweeps=_sweeps(cell, perf),
            numbers=NUMBERS,
            number=number,
            **common,
        )
        for compare in site.compares[cell]:
            out[f"compare/{slug(cell)}/{compare.id}.html"] = _page(
                env,
                "compare.html.j2",
                root="../../",
                compare=compare,
                pins=pin_rows(compare.a, compare.b),
                winners=winner_changes(compare.a, compare.b),
                numbers=[(name, number(compare.a, p), number(compare.b, p)) for name, p in NUMBERS],
                stages=_stage_pairs(compare),
                **common,
            )
    if fixtures is not None:
        out["fixtures.html"] = _page(
            env, "fixtures.html.j2", root="", fixtures=fixtures, heatmaps=_fixture_plots(fixtures), **common
        )
    return out


def slug(text: str) -> str:
    """A file name for an id, injective: letters, digits and `-` stay, every other character is
    `_XX` (its UTF-8 bytes in hex), so `a.b`, `a_b` and `a b` get three pages, and no id is `..`."""
    return re.sub(r"[^A-Za-z0-9-]", lambda m: "".join(f"_{b:02X}" for b in m.group().encode()), text) or "_"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("stackproof.site_report", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = _num
    env.filters["delta"] = _delta
    env.filters["pct"] = _pct
    return env


def _page(env: jinja2.Environment, template: str, **context: Any) -> bytes:
    return env.get_template(template).render(**context).encode()


def _num(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    if float(value).is_integer() and abs(value) < 1e6:
        return f"{value:,.0f}"  # counts: 80 questions, not 80.000
    return f"{value:,.{digits}f}" if abs(value) < 1e6 else f"{value:,.0f}"


def _pct(value: float | None) -> str:
    """A relative change (+0.104) as the page says it (+10.4%)."""
    return "-" if value is None else f"{value * 100:+.1f}%"


def _delta(pair: tuple[float | None, float | None]) -> str:
    a, b = pair
    if a is None or b is None:
        return ""
    if a == 0:
        return f"{b - a:+.1f}"
    return f"{(b - a) / a * 100:+.1f}%"


def _receipt_files(receipt: Shown, out: dict[str, bytes]) -> Links:
    """The receipt as it was, and what the run left beside it; JUnit and the summary are rendered from
    the receipt when the run directory is not at hand (they are pure functions of it)."""
    from pipeline.receiptrender import render_junit, render_markdown

    base = f"receipts/{receipt.id}"
    document = jsonable(receipt.document)
    out[f"{base}/receipt.json"] = (json.dumps(document, indent=2, default=str, allow_nan=False) + "\n").encode()
    found: dict[str, str | None] = {}
    for name, renderer in (("summary.md", render_markdown), ("junit.xml", render_junit)):
        data = receipt.files.get(name)
        if data is None:
            try:
                data = renderer(receipt.receipt).encode()
            except (KeyError, TypeError, AttributeError, ValueError):
                data = None  # a receipt of another writer may lack a field the renderer needs
        if data is not None:
            out[f"{base}/{name}"] = data
        found[name] = f"{base}/{name}" if data is not None else None
    log = receipt.files.get("server.log")
    if log is not None:
        out[f"{base}/server.log.txt"] = log
    return Links(
        receipt=f"{base}/receipt.json",
        summary=found["summary.md"],
        junit=found["junit.xml"],
        server_log=f"{base}/server.log.txt" if log is not None else None,
    )


def _filters(site: Site) -> dict[str, list[str]]:
    versions = sorted({f"{n}=={v}" for r in site.receipts for n, v in r.versions.items() if n in VERSIONED})
    arches = sorted({a for arch in site.cell_arch.values() for a in arch.split(",")} | {h.arch for h in site.hosts})
    return {"arch": arches, "status": [*STATUS_LABELS, "NOT_VERIFIED"], "version": versions}


def index_document(site: Site, links: Mapping[str, Links], generated_at: str) -> dict[str, Any]:
    squares = []
    for cell in site.cells:
        for host in site.hosts:
            square = site.square(cell, host)
            r = square.receipt
            entry: dict[str, Any] = {"cell": cell, "host": host.key}
            if r is None:
                entry["status"] = "NOT_VERIFIED"
            else:
                entry.update(
                    {
                        "status": r.status,
                        "arm": r.arm,
                        "date": r.started_at,
                        "output_tok_s": r.tok_s,
                        "ttft_p50_ms": r.latency("ttft", "p50"),
                        "versions": {n: r.versions[n] for n in (*TRIO, "torch") if n in r.versions},
                        "image_id": r.image_id,
                        "receipt": links[r.id].receipt,
                        "origin": r.origin,
                        "other_receipts": square.others,
                    }
                )
            squares.append(entry)
    return {
        "schema_version": 1,
        "kind": INDEX_KIND,
        "generated_at": generated_at,
        "cells": [{"id": c, "arch": site.cell_arch[c], "page": f"cells/{slug(c)}.html"} for c in site.cells],
        "hosts": [
            {"key": h.key, "summary": h.summary, "arch": h.arch, "gpus": list(h.gpus), "driver": h.driver}
            for h in site.hosts
        ],
        "squares": squares,
    }


def _heads(receipts: tuple[Shown, ...]) -> list[Shown]:
    """The newest receipt of each (host, arm): the columns of "arms side by side"."""
    seen: dict[tuple[str, str | None], Shown] = {}
    for receipt in prefer(receipts):
        seen.setdefault((receipt.host.key, receipt.arm), receipt)
    return sorted(seen.values(), key=lambda r: (r.host.summary, r.arm or ""))


def _cell_plots(cell: str, receipts: tuple[Shown, ...]) -> dict[str, Any]:
    heads = _heads(receipts)
    out: dict[str, Any] = {"latency": {}, "timeline": {}, "heatmap": {}, "arms": None}
    for r in heads:
        what = f"{r.arm or 'no arm'} on {r.host.summary}, {r.started_at}"
        if r.raw is not None:
            out["latency"][r.id] = Markup(
                plots.latency_svg(r.raw.ttft_ms, r.raw.itl_ms, prefix=f"lat-{r.id}", what=what)
            )
            out["timeline"][r.id] = Markup(plots.timeline_svg(r.raw.timeline, r.events, prefix=f"tl-{r.id}", what=what))
        if r.autotune:
            out["heatmap"][r.id] = Markup(plots.heatmap_svg(r.autotune, prefix=f"hm-{r.id}", what=what))
    measured = [r for r in heads if r.tok_s is not None]
    # Bars compare receipts; one receipt's numbers are the table beside it, not a one-bar chart.
    if len(measured) >= 2:
        rows = [
            (f"{_gpus(r)} [{r.host.key[:6]}] / {r.arm or 'no arm'}", r.tok_s, r.latency("ttft", "p50"))
            for r in measured
        ]
        out["arms"] = Markup(plots.arms_svg(rows, prefix=f"arms-{slug(cell)}", what=cell))
    return out


def _gpus(receipt: Shown) -> str:
    names = receipt.host.gpus
    if not names:
        return "no GPU"
    return f"{len(names)}x {names[0].removeprefix('NVIDIA ')}" if len(set(names)) == 1 else ", ".join(names)


def _stage_pairs(compare: Compare) -> list[tuple[str, str, str]]:
    a = {s: status for s, status, _ in compare.a.stages}
    b = {s: status for s, status, _ in compare.b.stages}
    return [(s, a.get(s, "-"), b.get(s, "-")) for s in dict.fromkeys([*a, *b])]


def _fixture_plots(fixtures: Fixtures) -> list[Markup]:
    return [
        Markup(plots.heatmap_svg(table, prefix=f"fx-{i}", what=f"fixture {path.rsplit('/', 1)[-1]}"))
        for i, (path, _, table) in enumerate(fixtures.autotune)
    ]


def _sweeps(cell: str, perf: PerfDocs) -> list[tuple[str, Any, Markup]]:
    """(source, sweep report, its curve) for each sweep of the cell, in path order."""
    out = []
    for i, (source, report) in enumerate(perf.sweeps_of(cell)):
        points = [(p.value, p.output_tok_s, p.ttft_p99_ms) for p in report.points]
        svg = plots.sweep_svg(
            points,
            limit_ms=report.config.ttft_p99_limit_ms,
            crossed_at=report.crossed_at,
            axis=report.config.axis,
            prefix=f"sw-{i}",
            what=f"{report.target}, {report.config.axis} sweep",
        )
        out.append((source, report, Markup(svg)))
    return out
