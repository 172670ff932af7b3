"""Checks run against a built image: the server lifecycle now, the verify stages on top of it."""
