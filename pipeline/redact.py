"""What a credential looks like, and how to keep one out of cells, images, argv and messages.

A cell's `env` and `args` end up in a Dockerfile `ENV` (the image config, its history, every
published copy), in `docker inspect`, in `ps` and in server.log (vLLM logs its non-default args).
So no secret-looking value may enter them from any source: `repro` drops such variables and
flags (saying so line by line) and validation refuses them, naming the key. Mirror URLs may carry
credentials too: `redact` removes them from every message the tool prints.
"""

from __future__ import annotations

import re

__all__ = ["REDACTED", "redact", "secret_arg", "secret_env"]

REDACTED = "***"

# Words in a variable or flag name that say it holds a credential (`HF_TOKEN`, `--api-key`);
# matched as whole words, so `MAX_NUM_BATCHED_TOKENS` is not one.
_SECRET_WORDS = re.compile(
    r"(?:^|[_-])(?:TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|API[_-]?KEY|ACCESS[_-]?KEY|PRIVATE[_-]?KEY|"
    r"CREDENTIALS?|AUTH|AUTHORIZATION|COOKIE|SESSION[_-]?KEY|SIGNING[_-]?KEY)(?:$|[_-])",
    re.IGNORECASE,
)
# Values that are credentials whatever they are called: well-known token prefixes at a token's
# length (`hf_transfer` is not one), a JWT, a URL with `user:password@`, a `Bearer` payload.
_SECRET_VALUE = re.compile(
    r"(?<![A-Za-z0-9])(?:"
    r"sk-[A-Za-z0-9_-]{20,}|hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|"
    r"glpat-[A-Za-z0-9_-]{16,}|xox[abprs]-[A-Za-z0-9-]{8,}|AKIA[0-9A-Z]{16}|"
    r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*|"
    r"[Bb]earer\s+[A-Za-z0-9._~+/=-]{8,}"
    r")"
)
_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@]+@")


def secret_env(name: str, value: str) -> str | None:
    """Why `name=value` must not be copied into a cell (None: it may be)."""
    if _SECRET_WORDS.search(name):
        return f"{name}: the name says it holds a credential"
    return _secret_value(value)


def secret_arg(flag: str, value: str | None) -> str | None:
    """Why a server flag (`--api-key`, `--hf-token`) or its value must not be copied into a cell."""
    if flag.startswith("-") and _SECRET_WORDS.search(flag.lstrip("-").split("=", 1)[0]):
        return f"{flag.split('=', 1)[0]}: the flag passes a credential"
    return _secret_value(flag) or (_secret_value(value) if value is not None else None)


def _secret_value(value: str) -> str | None:
    if _SECRET_VALUE.search(value):
        return "the value looks like an access token"
    if _URL_USERINFO.search(value):
        return "the value is a URL carrying user:password@"
    return None


def redact(text: str, secrets: tuple[str, ...] = ()) -> str:
    """`text` with credentials replaced by `***`: the given strings, URL user info and known tokens."""
    for secret in sorted(filter(None, secrets), key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    text = _URL_USERINFO.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)
    return _SECRET_VALUE.sub(REDACTED, text)
