"""Inline SVG plots (matplotlib's SVG backend, text kept as text): data in, SVG text out.

Every plot carries a <title> and a <desc> (role="img"), and every page puts a data table beside
it, so the numbers are readable without the picture. Element ids are prefixed per plot because
several SVGs share one HTML document.
"""

from __future__ import annotations

import functools
import io
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pipeline.errors import InfraError

__all__ = ["arms_svg", "heatmap_svg", "latency_svg", "sweep_svg", "timeline_svg"]

# Fixed colours for the runners people look for (cuDNN is the one of vllm#55571); others cycle.
RUNNER_COLOURS = {
    "CublasFp8GemmRunner": "#4c72b0",
    "CudnnFp8GemmRunner": "#dd5b2e",
    "CutlassFp8GemmRunner": "#55a868",
}
CYCLE = ("#8172b2", "#937860", "#da8bc3", "#8c8c8c", "#ccb974", "#64b5cd")
INSTALL_HINT = "stackproof report draws its plots with matplotlib: pip install 'stackproof[report]'"


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise InfraError(INSTALL_HINT) from exc
    matplotlib.use("svg")
    matplotlib.rcParams.update(
        {
            "svg.fonttype": "none",  # text stays text: searchable, scalable, read by screen readers
            # Labels are cell ids, runner names and GPU names from receipts: text, never math. With
            # parsing on, a `$` or `^` in one is mathtext and a receipt's name can end the report.
            "text.parse_math": False,
            "text.usetex": False,
            "svg.hashsalt": "stackproof",  # the same data draws the same SVG, run after run
            "font.size": 8,
            "axes.spines.top": False,
            "axes.spines.right": False,
        }
    )
    from matplotlib.figure import Figure

    return Figure


def _svg(fig: Any, *, title: str, desc: str, prefix: str) -> str:
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
    text = buffer.getvalue()
    text = text[text.index("<svg") :]
    text = re.sub(r'\bid="([^"]+)"', rf'id="{prefix}-\1"', text)
    text = re.sub(r"url\(#([^)]+)\)", rf"url(#{prefix}-\1)", text)
    text = re.sub(r'href="#([^"]+)"', rf'href="#{prefix}-\1"', text)
    head = f'<svg role="img" aria-labelledby="{prefix}-title {prefix}-desc"'
    text = text.replace("<svg", head, 1)
    close = text.index(">", len(head)) + 1
    extra = f'<title id="{prefix}-title">{_xml(title)}</title><desc id="{prefix}-desc">{_xml(desc)}</desc>'
    return text[:close] + extra + text[close:]


def _xml(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def _short(text: str, limit: int = 28) -> str:
    """A tick label that fits the fixed margin; the full text is in the table beside the plot."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _quantiles(values: Sequence[float], points: int = 300) -> tuple[list[float], list[float]]:
    """An ECDF drawn from at most `points` quantiles: a soak's million ITLs draw as fast as 80."""
    data = sorted(values)
    if len(data) <= points:
        return data, [(i + 1) / len(data) for i in range(len(data))]
    xs = [data[min(len(data) - 1, round(q * (len(data) - 1) / (points - 1)))] for q in range(points)]
    return xs, [(q + 1) / points for q in range(points)]


def latency_svg(ttft_ms: Sequence[float], itl_ms: Sequence[float], *, prefix: str, what: str) -> str:
    figure = _pyplot()
    fig = figure(figsize=(7.2, 2.6))
    fig.subplots_adjust(left=0.09, right=0.98, bottom=0.18, top=0.9, wspace=0.28)  # fixed: no layout engine
    axes = fig.subplots(1, 2)
    for ax, values, name in ((axes[0], ttft_ms, "TTFT"), (axes[1], itl_ms, "ITL")):
        if values:
            xs, ys = _quantiles(values)
            ax.step(xs, ys, where="post", color="#4c72b0")
            for q, style in ((0.5, "--"), (0.99, ":")):
                ax.axvline(xs[min(len(xs) - 1, int(q * len(xs)))], color="#666", linestyle=style, linewidth=0.8)
            # A linear axis cut at 1.2 x p99: the tail's shape is in the table beside (max), and a log
            # axis costs three times the drawing time of the whole figure.
            ax.set_xlim(0, 1.2 * xs[min(len(xs) - 1, int(0.99 * len(xs)))] or 1.0)
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("fraction of requests" if name == "TTFT" else "fraction of tokens")
        ax.set_title(f"{name}, {len(values)} samples", fontsize=8)
        ax.grid(alpha=0.3)
    desc = (
        f"Cumulative distributions of TTFT ({len(ttft_ms)} requests) and ITL ({len(itl_ms)} gaps); "
        "dashed p50, dotted p99"
    )
    return _svg(fig, title=f"Latency distributions: {what}", desc=desc, prefix=prefix)


def timeline_svg(
    timeline: Sequence[tuple[float, float, int]], events: Sequence[Mapping[str, Any]], *, prefix: str, what: str
) -> str:
    figure = _pyplot()
    fig = figure(figsize=(7.2, 2.6))
    fig.subplots_adjust(left=0.1, right=0.9, bottom=0.18, top=0.95)  # fixed: no layout engine
    ax = fig.subplots()
    times = [t for t, _, _ in timeline]
    ax.plot(times, [rate for _, rate, _ in timeline], color="#4c72b0", marker=".", label="output tokens/s")
    ax.set_xlabel("seconds since the load started")
    ax.set_ylabel("output tokens/s (from /metrics)")
    ax.set_ylim(bottom=0)
    right = ax.twinx()
    in_flight = [n for _, _, n in timeline]
    right.step(times, in_flight, where="post", color="#dd8452", label="requests in flight")
    right.set_ylim(*in_flight_limits(in_flight))
    right.yaxis.get_major_locator().set_params(integer=True)  # requests are whole
    right.set_ylabel("requests in flight")
    right.spines["right"].set_visible(True)
    for event in events:
        at = event.get("at")
        if isinstance(at, int | float):
            ax.axvline(at, color="#c44e52", linewidth=1.2)
            ax.annotate(
                str(event.get("type", "event")),
                (at, 0),
                xytext=(2, 2),
                textcoords="offset points",
                color="#c44e52",
                fontsize=7,
            )
    ax.grid(alpha=0.3)
    lines = ax.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    ax.legend(lines, [str(line.get_label()) for line in lines], loc="upper right", fontsize=7, frameon=False)
    verdicts = ", ".join(f"{e.get('type')} at {e.get('at')}s" for e in events) or "no stall verdict"
    desc = f"{len(timeline)} /metrics scrapes over {max(times, default=0):.0f}s; {verdicts}"
    return _svg(fig, title=f"Engine progress: {what}", desc=desc, prefix=prefix)


def in_flight_limits(in_flight: Sequence[int]) -> tuple[float, float]:
    """The in-flight axis from zero: auto-scaled to 6..7, one request less looked like none at all."""
    return 0.0, max(in_flight, default=0) + 1.0


def heatmap_svg(tables: Sequence[Mapping[str, Any]], *, prefix: str, what: str) -> str:
    """Winners per (op, N, K) row and M bucket column; the colour names the runner (legend)."""
    svg = _heatmap(json.dumps(list(tables), sort_keys=True, default=str))
    return svg.replace("@@P@@", prefix).replace("@@WHAT@@", _xml(what))


@functools.lru_cache(maxsize=512)
def _heatmap(tables_json: str) -> str:
    # Memoised on the table itself: cells verified on one GPU with one model tune to the same winners,
    # and a site of many cells draws each distinct table once.
    tables = json.loads(tables_json)
    buckets = sorted({int(r["m_bucket"]) for t in tables for r in t.get("rows", ())})
    runners = sorted({str(r["runner"]) for t in tables for r in t.get("rows", ())})
    colours = {name: RUNNER_COLOURS.get(name) or CYCLE[i % len(CYCLE)] for i, name in enumerate(runners)}
    figure = _pyplot()
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    width, height = min(9.0, max(5.0, 3.2 + 0.3 * len(buckets))), max(1.8, 1.0 + 0.28 * len(tables))
    fig = figure(figsize=(width, height))
    # Fixed margins in inches (shape labels left, legend right, rotated buckets below): a layout
    # engine would double the drawing time of every plot.
    fig.subplots_adjust(left=1.55 / width, right=1 - 1.75 / width, bottom=0.8 / height, top=1 - 0.1 / height)
    ax = fig.subplots()
    grid = [[float("nan")] * len(buckets) for _ in tables]
    for i, table in enumerate(tables):
        for row in table.get("rows", ()):
            grid[i][buckets.index(int(row["m_bucket"]))] = runners.index(str(row["runner"]))
    cmap = ListedColormap([colours[name] for name in runners] or ["#ffffff"]).with_extremes(bad="#ffffff")
    ax.imshow(grid, aspect="auto", cmap=cmap, vmin=-0.5, vmax=max(0.5, len(runners) - 0.5), interpolation="nearest")
    ax.set_xticks(range(len(buckets)), [str(b) for b in buckets], rotation=90, fontsize=7)
    ax.set_yticks(
        range(len(tables)), [_short(f"{t.get('op')} N={t.get('n')} K={t.get('k')}") for t in tables], fontsize=7
    )
    ax.set_xlabel("M bucket (tokens)")
    ax.legend(
        handles=[Patch(color=colours[name], label=name) for name in runners],
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=7,
        frameon=False,
    )
    counts = {name: sum(1 for t in tables for r in t.get("rows", ()) if r["runner"] == name) for name in runners}
    desc = "Winning runner per M bucket: " + "; ".join(f"{name} wins {n} bucket(s)" for name, n in counts.items())
    return _svg(fig, title="Autotune winners: @@WHAT@@", desc=desc, prefix="@@P@@")


def arms_svg(rows: Sequence[tuple[str, float | None, float | None]], *, prefix: str, what: str) -> str:
    """Output tok/s and TTFT p50 per receipt (label, tok/s, TTFT p50 ms), from the receipts' summaries."""
    figure = _pyplot()
    height = 0.9 + 0.3 * len(rows)
    fig = figure(figsize=(7.2, height))
    # Fixed margins (the labels' room is known): a layout engine would double the drawing time.
    fig.subplots_adjust(left=0.36, right=0.98, bottom=0.5 / height, top=1 - 0.1 / height, wspace=0.08)
    left, right = fig.subplots(1, 2, sharey=True)
    labels = [label for label, _, _ in rows]
    positions = list(range(len(rows)))
    left.barh(positions, [tok or 0 for _, tok, _ in rows], color="#4c72b0")
    right.barh(positions, [ttft or 0 for _, _, ttft in rows], color="#dd8452")
    left.set_yticks(positions, [_short(label, 44) for label in labels], fontsize=7)
    left.invert_yaxis()
    left.set_xlabel("output tokens/s")
    right.set_xlabel("TTFT p50 (ms)")
    for ax in (left, right):
        ax.grid(axis="x", alpha=0.3)
    desc = "; ".join(f"{label}: {tok} tok/s, TTFT p50 {ttft} ms" for label, tok, ttft in rows)
    return _svg(fig, title=f"Throughput and TTFT: {what}", desc=desc, prefix=prefix)


def sweep_svg(
    points: Sequence[tuple[float, float | None, float | None]],
    *,
    limit_ms: float,
    crossed_at: float | None,
    axis: str,
    prefix: str,
    what: str,
) -> str:
    """A sweep's throughput-latency curve: output tok/s (x) against TTFT p99 (y), one marker per load
    point (value, tok/s, TTFT p99 ms), the declared limit as a line and the crossing point ringed.
    A point that measured nothing has no place on the curve; the table beside it lists it."""
    figure = _pyplot()
    fig = figure(figsize=(6.4, 3.2))
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.16, top=0.95)
    ax = fig.subplots()
    drawn = [(v, tok, ttft) for v, tok, ttft in points if tok is not None and ttft is not None]
    ax.plot([tok for _, tok, _ in drawn], [ttft for _, _, ttft in drawn], marker="o", color="#4c72b0")
    for v, tok, ttft in drawn:
        ax.annotate(f"{v:g}", (tok, ttft), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.axhline(limit_ms, color="#c44e52", linestyle="--", linewidth=1)
    ax.annotate(f"TTFT p99 limit {limit_ms:g} ms", (0, limit_ms), xycoords=("axes fraction", "data"),
                textcoords="offset points", xytext=(2, 3), fontsize=7, color="#c44e52")  # fmt: skip
    crossing = [(tok, ttft) for v, tok, ttft in drawn if v == crossed_at]
    if crossing:
        ax.plot(*crossing[0], marker="o", markersize=12, fillstyle="none", color="#c44e52")
    ax.set_xlabel("output tokens/s")
    ax.set_ylabel("TTFT p99 (ms)")
    ax.grid(alpha=0.3)
    where = "no point crosses" if crossed_at is None else f"crosses at {axis} {crossed_at:g}"
    desc = f"{where}; " + "; ".join(f"{axis} {v:g}: {tok} tok/s, TTFT p99 {ttft} ms" for v, tok, ttft in points)
    return _svg(fig, title=f"Throughput against TTFT p99: {what}", desc=desc, prefix=prefix)
