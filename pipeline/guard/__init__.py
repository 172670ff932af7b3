"""The guards every edge shares: bounded reads, JSON files written whole, the HTTP policy (timeouts, redirects,
size caps) and secret redaction. Imports nothing else in pipeline/."""
