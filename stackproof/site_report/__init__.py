"""`stackproof report`: the verified matrix as a static site, rendered from receipts.

model.py (receipts -> a typed site, pure), sources.py (run directories, a registry, fixtures: the
I/O), plots.py (inline SVG), render.py (pages and index.json, pure), templates/ and style.css.
"""

__all__: list[str] = []
