"""stackproof: build container images of LLM serving stacks from a matrix of pinned cells, and prove them."""

__version__ = "0.1.0"
