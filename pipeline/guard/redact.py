"""What a credential looks like, and how to keep one out of cells, images, argv and messages.

A cell's `env` and `args` end up in a Dockerfile `ENV` (the image config, its history, every
published copy), in `docker inspect`, in `ps` and in server.log (vLLM logs its non-default args).
So no secret-looking value may enter them from any source: `repro` drops such variables and
flags (saying so line by line) and validation refuses them, naming the key. Mirror URLs may carry
credentials too: `redact` removes them from every message the tool prints.
"""

from __future__ import annotations

import re
import threading
from typing import IO, Any

__all__ = ["REDACTED", "RedactingStream", "redact", "secret_arg", "secret_env"]

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
# `HF_TOKEN=abc`, `"HF_TOKEN": "abc"`, `api_key: abc`: the value of a credential-named variable,
# whatever it looks like (a short or custom token matches no token pattern). Bounded: no backtracking
# beyond one name and one value.
_NAMED_SECRET = re.compile(
    r"(?P<name>\b[A-Za-z][A-Za-z0-9_.-]{0,80})(?P<sep>\"?\s{0,4}[=:]\s{0,4}\"?)(?P<value>[^\s\"',;&]{1,4096})"
)


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
    """`text` with credentials replaced by `***`: the given strings, URL user info, known tokens and
    the values of credential-named variables (`HF_TOKEN=...`)."""
    for secret in sorted(filter(None, secrets), key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    text = _URL_USERINFO.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)
    text = _NAMED_SECRET.sub(_named, text)
    return _SECRET_VALUE.sub(REDACTED, text)


def _named(match: re.Match[str]) -> str:
    name, sep, value = match.group("name"), match.group("sep"), match.group("value")
    if not _SECRET_NAME_END.search(name) or value == REDACTED or value.startswith(("<", "$", "{")):
        return match.group(0)  # not a credential's name, or a placeholder (`HF_TOKEN=<token>`, `$HF_TOKEN`)
    if ":" in sep and not (sep.startswith('"') or name.isupper()):
        return match.group(0)  # prose ("no credentials: set ..."): only `"key": value` and `KEY: value` are fields
    return f"{name}{match.group('sep')}{REDACTED}"


# A name that ends in a credential word (`HF_TOKEN`, `api_key`, `"password"`), not one that merely
# starts with one (`token_requests` is a count).
_SECRET_NAME_END = re.compile(
    r"(?:^|[_.-])(?:TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|API[_-]?KEY|ACCESS[_-]?KEY|PRIVATE[_-]?KEY|"
    r"CREDENTIALS?|AUTH|AUTHORIZATION|COOKIE|SESSION[_-]?KEY|SIGNING[_-]?KEY)$",
    re.IGNORECASE,
)


class RedactingStream:
    """A text stream that passes every line through `redact` before it leaves the process.

    The CLI installs one over stdout and stderr, so every line any command prints (progress, errors,
    JSON documents, a tool's echoed output) is redacted once, at the edge, instead of at each print.
    Text is held until a line ends (`\n` or `\r`, progress lines) or the stream is flushed, so a
    secret written in two pieces is still one string to redact."""

    def __init__(self, stream: IO[str], secrets: tuple[str, ...] = ()) -> None:
        self.stream = stream
        self.secrets = secrets
        self._pending = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            self._pending += text
            cut = max(self._pending.rfind("\n"), self._pending.rfind("\r"))
            if cut >= 0:
                ready, self._pending = self._pending[: cut + 1], self._pending[cut + 1 :]
                self.stream.write(redact(ready, self.secrets))
            if len(self._pending) > 65536:  # a line without end: redact it in pieces rather than hold it
                self.stream.write(redact(self._pending, self.secrets))
                self._pending = ""
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if self._pending:
                self.stream.write(redact(self._pending, self.secrets))
                self._pending = ""
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, buffer...
        return getattr(self.stream, name)
