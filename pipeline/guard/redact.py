"""What a credential looks like, and how to keep one out of cells, images, argv and messages.

A cell's `env` and `args` end up in a Dockerfile `ENV` (the image config, its history, every
published copy), in `docker inspect`, in `ps` and in server.log (vLLM logs its non-default args).
So no secret-looking value may enter them from any source: `repro` drops such variables and
flags (saying so line by line) and validation refuses them, naming the key. Mirror URLs may carry
credentials too: `redact` removes them from every message the tool prints.
"""

from __future__ import annotations

import errno
import re
import threading
from typing import IO, Any

__all__ = ["REDACTED", "RedactingStream", "neutralise", "redact", "secret_arg", "secret_env"]

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
    r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{8,}+\.[A-Za-z0-9_-]{8,}+\.[A-Za-z0-9_-]*+|"
    r"[Bb]earer\s+[A-Za-z0-9._~+/=-]{8,}"
    r")"
)
# Linear time (issue 43): a scheme is at most 32 characters, so a long run of letters costs each
# start 32 steps, not the rest of the run (`[A-Za-z][A-Za-z0-9+.-]*` was quadratic: 20,000 letters
# took 2.4 s, a 300 kB environment value minutes); a JWT starts only where a run of its alphabet
# starts, and its parts are read possessively (no re-reading of one run from each `-` in it).
_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]{0,31}://)[^/\s@]++@")
# `HF_TOKEN=abc`, `"HF_TOKEN": "abc"`, `api_key: abc`: the value of a credential-named variable,
# whatever it looks like (a short or custom token matches no token pattern). Bounded: no backtracking
# beyond one name and one value.
_NAMED_SECRET = re.compile(
    r"(?P<name>\b[A-Za-z][A-Za-z0-9_.-]{0,80}+)(?P<sep>\"?\s{0,4}[=:]\s{0,4}\"?)(?P<value>[^\s\"',;&]{1,4096})"
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


# Control characters other than tab, newline and carriage return (a progress bar's redraw): an escape
# sequence from an environment value, a server's answer or a reporter's file would otherwise drive
# the reader's terminal (retitle it, hide text, rewrite earlier lines). Shown as `\x1b`, visibly.
_CONTROLS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def neutralise(text: str) -> str:
    """`text` with every control character but tab, newline and CR written out as `\\xNN`."""
    return _CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


class RedactingStream:
    """A text stream that passes every line through `redact` before it leaves the process.

    The CLI installs one over stdout and stderr, so every line any command prints (progress, errors,
    JSON documents, a tool's echoed output) is redacted once, at the edge, instead of at each print.
    Text is held until a line ends (`\n` or `\r`, progress lines) or the stream is flushed, so a
    secret written in two pieces is still one string to redact.

    One safe output stream (issue 43): control characters are neutralised (`neutralise`; the
    console's own cursor moves go through `write_control`), and a stream that is closed (None: the
    process started with the descriptor closed), full (/dev/full, a full disk) or gone bad stops
    taking output instead of raising from every print: `failed` says why, and the CLI turns a
    failed stdout into exit 3. A reader that went away (EPIPE) still raises BrokenPipeError, which
    the CLI ends quietly as 141."""

    def __init__(self, stream: IO[str] | None, secrets: tuple[str, ...] = ()) -> None:
        self.stream = stream
        self.secrets = secrets
        self.failed: OSError | None = None
        self._pending = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            self._pending += text
            cut = max(self._pending.rfind("\n"), self._pending.rfind("\r"))
            if cut >= 0:
                ready, self._pending = self._pending[: cut + 1], self._pending[cut + 1 :]
                self._emit(neutralise(redact(ready, self.secrets)))
            if len(self._pending) > 65536:  # a line without end: redact it in pieces rather than hold it
                self._emit(neutralise(redact(self._pending, self.secrets)))
                self._pending = ""
        return len(text)

    def write_control(self, sequence: str) -> None:
        """The console's own cursor moves (its live block), written as they are, after what is held."""
        with self._lock:
            if self._pending:
                self._emit(neutralise(redact(self._pending, self.secrets)))
                self._pending = ""
            self._emit(sequence)

    def flush(self) -> None:
        with self._lock:
            if self._pending:
                self._emit(neutralise(redact(self._pending, self.secrets)))
                self._pending = ""
            self._emit(None)

    def _emit(self, text: str | None) -> None:
        if self.failed is not None:
            return
        if self.stream is None:
            if text:
                self.failed = OSError(errno.EBADF, "the stream is closed")
            return
        try:
            if text is None:
                self.stream.flush()
            else:
                self.stream.write(text)
        except BrokenPipeError:
            raise
        except (OSError, ValueError) as exc:  # full, closed under us, an I/O error
            self.failed = exc if isinstance(exc, OSError) else OSError(errno.EBADF, str(exc))

    def isatty(self) -> bool:
        try:
            return self.stream is not None and self.failed is None and self.stream.isatty()
        except (AttributeError, ValueError, OSError):
            return False

    def __getattr__(self, name: str) -> Any:  # fileno, encoding, buffer...
        if self.stream is None:
            raise AttributeError(name)
        return getattr(self.stream, name)
