"""A small OCI distribution client over httpx: auth, manifests, blobs, tags and referrers. No docker.

Enough to attach receipts to an image digest and to move tags to exact digests: `docker push`
only pushes tags, and a tag moved by re-pushing could land on whatever the local tag points at
by then; a manifest PUT by digest cannot.

Auth follows the registry token flow: a request answered 401 with `WWW-Authenticate: Bearer
realm=...,service=...,scope=...` is retried with a token from the realm (asked anonymously, or
with Basic credentials when there are any); tokens are kept per scope and reused, and a 401 on a
new scope (pull -> push) or after expiry fetches a fresh one. A `Basic` challenge is answered with
the credentials directly. Credentials come from `Credentials` (see `find_credentials`) and go in
an Authorization header only: never in a URL, a log line or an error message.

Loopback registries are spoken to over plain HTTP (as docker does), others over HTTPS with the
site's CA bundle.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from pipeline.errors import InfraError, InputError
from pipeline.guard import boundedio, httppolicy
from pipeline.guard.httppolicy import HttpPolicy

__all__ = [
    "INDEX_TYPES",
    "MANIFEST_TYPES",
    "OCI_INDEX",
    "OCI_MANIFEST",
    "Challenge",
    "Credentials",
    "Manifest",
    "RegistryClient",
    "find_credentials",
    "parse_challenge",
    "platform_manifest",
    "split_registry",
]

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST, *INDEX_TYPES)
_LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
USER_ENV = "STACKPROOF_REGISTRY_USER"
DOCKER_CONFIG_LIMIT = 16 * 2**20  # a config with many auths is a few KB
PASSWORD_ENV = "STACKPROOF_REGISTRY_PASSWORD"
# Token services on another origin than the registry that may receive the user's credentials
# (`https://auth.example.com`, comma-separated). Any other realm is asked anonymously.
TRUSTED_REALMS_ENV = "STACKPROOF_REGISTRY_TOKEN_ORIGINS"
# One command's whole walk of a registry (issue 27): an answer has its own deadline (HttpPolicy.total_s),
# but report --registry, pull and publish fetch a manifest per tag, up to the 10,000-tag listing cap:
# the command as a whole stops at this deadline and this many manifests, exit 3.
DEADLINE_ENV = "STACKPROOF_REGISTRY_DEADLINE_S"
MAX_MANIFESTS_ENV = "STACKPROOF_REGISTRY_MAX_MANIFESTS"
DEFAULT_DEADLINE_S = 600.0
DEFAULT_MAX_MANIFESTS = 20_000  # two per tag of a full listing
_LOGIN_HINT = f"`docker login HOST`, or {USER_ENV} with the password on stdin (--password-stdin)"


def split_registry(text: str) -> tuple[str, str]:
    """`host[:port][/namespace]` -> (host[:port], namespace or '')."""
    text = text.strip().removeprefix("http://").removeprefix("https://").rstrip("/")
    host, _, namespace = text.partition("/")
    if not host or " " in text:
        raise InputError(f"--registry {text!r}: write HOST[:PORT][/NAMESPACE], e.g. 127.0.0.1:5000")
    return host, namespace


# -- credentials -------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Credentials:
    """A user and secret for one registry, and where they came from (for messages; never the secret)."""

    username: str
    secret: str = field(repr=False)
    source: str
    identity_token: bool = False  # the secret is an OAuth2 refresh token (docker's `identitytoken`)

    def basic(self) -> str:
        return "Basic " + base64.b64encode(f"{self.username}:{self.secret}".encode()).decode()


HelperRunner = Callable[[str, str], "str | None"]  # (helper name, registry host) -> helper JSON or None


def find_credentials(
    host: str,
    *,
    env: Mapping[str, str],
    password: str | None = None,
    docker_config: Path | None = None,
    helper: HelperRunner | None = None,
) -> Credentials | None:
    """Credentials for `host`, first found wins:

    1. `STACKPROOF_REGISTRY_USER` with `password` (read from stdin by `--password-stdin`), or with
       `STACKPROOF_REGISTRY_PASSWORD` from the environment;
    2. docker's config (`$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`): `credHelpers[host]`,
       then `credsStore`, through `docker-credential-NAME get`; then `auths[host].auth`.
    """
    user = env.get(USER_ENV)
    secret = password if password is not None else env.get(PASSWORD_ENV)
    if user and secret:
        where = "--password-stdin" if password is not None else PASSWORD_ENV
        return Credentials(username=user, secret=secret, source=f"{USER_ENV} + {where}")
    if password is not None and not user:
        raise InputError(f"--password-stdin: set {USER_ENV} to the user name the password belongs to")
    config_dir = docker_config or Path(env.get("DOCKER_CONFIG") or Path(env.get("HOME", "~")) / ".docker")
    path = config_dir.expanduser() / "config.json"
    # The user's own config, read through the bounded reader: a FIFO, a device or a file past the
    # cap in its place is exit 2 naming it (a 4 GiB file was read whole, issue 27).
    data = boundedio.read_bytes(path, "docker config", limit=DOCKER_CONFIG_LIMIT) if os.path.lexists(path) else b"{}"
    try:
        config: dict[str, Any] = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise InputError(f"{path}: docker's config does not read as JSON ({exc})") from None
    if not isinstance(config, dict):
        raise InputError(f"{path}: docker's config does not read as JSON (not an object)")
    helper = helper or _run_helper
    names = [n for n in ((config.get("credHelpers") or {}).get(host), config.get("credsStore")) if n]
    for name in names:
        answer = helper(name, host)
        if answer is None:
            continue
        try:
            found = json.loads(answer)
            username, secret = str(found["Username"]), str(found["Secret"])
        except (ValueError, KeyError, TypeError) as exc:
            raise InfraError(f"docker-credential-{name} get {host}: not the JSON a credential helper answers") from exc
        token = username == "<token>"  # docker's convention for an identity token from a helper
        return Credentials(username=username, secret=secret, source=f"docker-credential-{name}", identity_token=token)
    for key in (host, f"https://{host}", f"http://{host}", f"https://{host}/v1/"):
        entry = (config.get("auths") or {}).get(key)
        if not entry:
            continue
        if entry.get("identitytoken"):
            return Credentials(
                username=entry.get("username", "<token>"),
                secret=entry["identitytoken"],
                source=f"{path} auths",
                identity_token=True,
            )
        if entry.get("auth"):
            try:
                username, _, secret = base64.b64decode(entry["auth"]).decode().partition(":")
            except ValueError as exc:
                raise InputError(f"{path}: auths[{key!r}].auth is not base64 of user:password") from exc
            return Credentials(username=username, secret=secret, source=f"{path} auths")
    return None


def _run_helper(name: str, host: str) -> str | None:
    """`docker-credential-NAME get` with the host on stdin; None when it has nothing for the host."""
    from pipeline import cmd

    binary = shutil.which(f"docker-credential-{name}")
    if binary is None:
        raise InfraError(
            f"docker's config names the credential helper {name!r}, but docker-credential-{name} is not on PATH"
        )
    result = cmd.run([binary, "get"], input_text=host, check=False, quiet=True, timeout=60)
    if result.returncode != 0:
        if "not found" in (result.stdout + result.stderr).lower():
            return None
        raise InfraError(f"docker-credential-{name} get {host} exited {result.returncode}: fix or log in again")
    return result.stdout


# -- challenges --------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Challenge:
    scheme: str  # "bearer" or "basic"
    params: tuple[tuple[str, str], ...]

    def get(self, name: str) -> str | None:
        return dict(self.params).get(name)


_PARAM = re.compile(r'\s*([A-Za-z][\w-]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]*))\s*,?')


def parse_challenge(header: str) -> Challenge | None:
    """`Bearer realm="...",service="...",scope="..."` -> Challenge; None for anything else."""
    scheme, _, rest = header.strip().partition(" ")
    if scheme.lower() not in ("bearer", "basic"):
        return None
    params = tuple(
        (m.group(1).lower(), m.group(2).replace('\\"', '"') if m.group(2) is not None else m.group(3))
        for m in _PARAM.finditer(rest)
    )
    return Challenge(scheme=scheme.lower(), params=params)


# -- manifests ---------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Manifest:
    digest: str
    media_type: str
    body: bytes

    @property
    def json(self) -> dict[str, Any]:
        """The manifest as a JSON object; a registry's answer that is not one is the registry's fault."""
        try:
            data = json.loads(self.body)
        except (ValueError, RecursionError):
            raise InfraError(f"manifest {self.digest}: the registry's answer is not JSON") from None
        if not isinstance(data, dict):
            raise InfraError(f"manifest {self.digest}: the registry's answer is not a JSON object")
        return data

    @property
    def is_index(self) -> bool:
        return self.media_type in INDEX_TYPES

    @property
    def config_digest(self) -> str | None:
        config = self.json.get("config") or {}
        return config.get("digest")


def platform_manifest(index: dict[str, Any], platform: str) -> dict[str, Any] | None:
    """The descriptor for `os/arch[/variant]` in an image index; attestation manifests never match."""
    os_name, _, rest = platform.partition("/")
    arch, _, variant = rest.partition("/")
    for descriptor in index.get("manifests") or []:
        if (descriptor.get("annotations") or {}).get("vnd.docker.reference.type"):
            continue  # buildx provenance/SBOM attestations sit in the index as `unknown/unknown`
        p = descriptor.get("platform") or {}
        if p.get("os") == os_name and p.get("architecture") == arch and (not variant or p.get("variant") == variant):
            return dict(descriptor)
    return None


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# -- the client --------------------------------------------------------------------------------------


class RegistryClient:
    def __init__(
        self,
        host: str,
        *,
        credentials: Credentials | None = None,
        ca_bundle: str | None = None,
        policy: HttpPolicy = httppolicy.DEFAULT,
        trusted_realms: tuple[str, ...] | None = None,
        transport: httpx.BaseTransport | None = None,  # tests: an httpx.MockTransport
        deadline_s: float | None = None,  # the whole command's walk; None: DEADLINE_ENV, else 600 s
        max_manifests: int | None = None,  # None: MAX_MANIFESTS_ENV, else DEFAULT_MAX_MANIFESTS
    ) -> None:
        self.host = host
        loopback = host.split(":")[0] in _LOOPBACK or host.startswith("[::1]")
        self.base = f"{'http' if loopback else 'https'}://{host}"
        self.credentials = credentials
        self.policy = policy
        if trusted_realms is None:
            trusted_realms = tuple(o.strip() for o in os.environ.get(TRUSTED_REALMS_ENV, "").split(",") if o.strip())
        self.trusted_realms = tuple(httppolicy.origin(o) for o in trusted_realms)
        self.client = httpx.Client(
            base_url=self.base, timeout=policy.timeout(), verify=ca_bundle or True, transport=transport
        )
        self._tokens: dict[str, tuple[str, float]] = {}  # scope -> (token, expires at, monotonic)
        self._last_token: str | None = None
        self._basic = False  # the registry asked for Basic auth
        self.token_requests = 0  # how many times a token was fetched (tests count reuse with it)
        self._withheld = ""  # why the credentials were not sent to a token service, for the refusal message
        self.spent_s = 0.0  # seconds spent in this client's requests, against deadline_s
        self._counted_until = float("-inf")  # the start of the last request counted in spent_s
        self.deadline_s = deadline_s if deadline_s is not None else _env_number(DEADLINE_ENV, DEFAULT_DEADLINE_S)
        self.max_manifests = int(
            max_manifests if max_manifests is not None else _env_number(MAX_MANIFESTS_ENV, DEFAULT_MAX_MANIFESTS)
        )
        self.manifests_fetched = 0

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- auth ------------------------------------------------------------------------------------------

    def _request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        headers = dict(kwargs.pop("headers", None) or {})
        response = self._send(method, url, headers, **kwargs)
        # A 401 is answered at most twice: with a cached token of the challenged scope (when it is
        # not the one just refused), then with a fresh one (the cached one may have expired too).
        for fresh in (False, True):
            if response.status_code != 401:
                return response
            challenge = parse_challenge(response.headers.get("WWW-Authenticate", ""))
            if challenge is None:
                raise InfraError(f"registry {self.host}: {method} {url} answered 401 with no challenge it can answer")
            if challenge.scheme == "basic":
                if self.credentials is None or self.credentials.identity_token:
                    raise InfraError(f"registry {self.host} wants credentials (Basic): {_LOGIN_HINT}")
                if self._basic:
                    break  # these credentials were sent and refused
                self._basic = True
            else:
                refused = self._last_token
                self._last_token = self._token(challenge, refused=refused, fresh=fresh)
            response = self._send(method, url, headers, **kwargs)
            if self._basic:
                break
        if response.status_code == 401:
            who = f"the credentials from {self.credentials.source}" if self.credentials else "anonymous access"
            raise InfraError(
                f"registry {self.host} refused {who} for {method} {url} (HTTP 401): check the user and password, "
                f"or {_LOGIN_HINT}{self._withheld}"
            )
        return response

    def _send(self, method: str, url: str, headers: dict[str, str], **kwargs: Any) -> httpx.Response:
        if self._basic and self.credentials is not None:
            headers["Authorization"] = self.credentials.basic()
        elif self._last_token is not None:
            headers["Authorization"] = f"Bearer {self._last_token}"
        follow = bool(kwargs.pop("follow_redirects", False))
        left = self._time_left(method, url)
        # No answer outlives the command's deadline: its total and its silences are cut to what is left.
        policy = replace(self.policy, total_s=min(self.policy.total_s, left))
        timeout = httpx.Timeout(min(self.policy.read_s, left), connect=min(self.policy.connect_s, left))
        started = time.monotonic()
        try:
            request = self.client.build_request(method, url, headers=headers, timeout=timeout, **kwargs)
            return httppolicy.fetch(
                self.client,
                request,
                policy=policy,
                what=f"registry {self.host}: {method} {url}",
                follow_redirects=follow,
            )
        except httpx.HTTPError as exc:
            self._spend(started)
            self._time_left(method, url)
            raise InfraError(f"registry {self.host} unreachable ({type(exc).__name__}); is it running?") from exc
        except InfraError:
            self._spend(started)
            self._time_left(method, url)
            raise
        finally:
            self._spend(started)

    def _spend(self, started: float) -> None:
        """Count one request's time against the deadline, once (the except arms count it early)."""
        if started > self._counted_until:
            self.spent_s += time.monotonic() - started
            self._counted_until = started

    def _time_left(self, method: str, url: str) -> float:
        """Seconds left of the command's registry deadline; past it, an InfraError naming what was being
        fetched. Only the time spent in this client's own requests counts: a `docker push` or `docker
        pull` between two requests (publish, pull) moves gigabytes at the network's pace, not the walk's."""
        left = self.deadline_s - self.spent_s
        if left <= 0:
            raise InfraError(
                f"registry {self.host}: the command's registry deadline of {self.deadline_s:g}s passed at "
                f"{method} {url} ({self.manifests_fetched} manifests fetched): given up; a slow registry "
                f"or a long walk, raise it with {DEADLINE_ENV}=SECONDS"
            )
        return left

    def _token(self, challenge: Challenge, *, refused: str | None, fresh: bool) -> str:
        """A token for the challenge's scope: a cached one while it lasts (not `refused`), else a fresh one."""
        realm, service, scope = challenge.get("realm"), challenge.get("service"), challenge.get("scope") or ""
        if not realm:
            raise InfraError(f"registry {self.host}: a Bearer challenge without a realm")
        cached = self._tokens.get(scope)
        if not fresh and cached is not None and cached[1] > time.monotonic() and cached[0] != refused:
            return cached[0]  # a token of this scope that was not the one just refused
        params = {"service": service} if service else {}
        if scope:
            params["scope"] = scope
        headers = {}
        # Same origin: the user's credentials go to the registry they were given for, or to a token
        # service the user named; a realm elsewhere (another host, port or scheme) is asked anonymously.
        credentials = self.credentials if self._may_receive_credentials(realm) else None
        if self.credentials is not None and credentials is None:
            self._withheld = (
                f"; the credentials were not sent to the token service {httppolicy.origin(realm)}, another origin "
                f"than {self.base}: name it in {TRUSTED_REALMS_ENV} if it is the registry's own"
            )
        what = f"registry {self.host}: token service {realm}"
        try:
            if credentials is not None and credentials.identity_token:
                data = {"grant_type": "refresh_token", "refresh_token": credentials.secret, **params}
                data["client_id"] = "stackproof"
                request = self.client.build_request("POST", realm, data=data)
            else:
                if credentials is not None:
                    headers["Authorization"] = credentials.basic()
                request = self.client.build_request("GET", realm, params=params, headers=headers)
            response = httppolicy.fetch(self.client, request, policy=self.policy, what=what)
        except httpx.HTTPError as exc:
            raise InfraError(f"registry {self.host}: token service {realm} unreachable ({type(exc).__name__})") from exc
        self.token_requests += 1
        if response.status_code in (401, 403):
            who = f"the credentials from {credentials.source}" if credentials else "anonymous access"
            raise InfraError(
                f"registry {self.host}: the token service refused {who} for {scope or 'the registry'} "
                f"(HTTP {response.status_code}): {_LOGIN_HINT}{self._withheld}"
            )
        if response.status_code != 200:
            raise InfraError(f"registry {self.host}: token service {realm} answered HTTP {response.status_code}")
        try:
            body = response.json()
            token = str(body.get("token") or body["access_token"])
        except (ValueError, KeyError, AttributeError, TypeError) as exc:
            raise InfraError(f"registry {self.host}: token service {realm} answered no token") from exc
        try:
            lifetime = min(max(float(body.get("expires_in") or 60), 1.0), 86_400.0)
        except (TypeError, ValueError):
            lifetime = 60.0
        if lifetime != lifetime:  # NaN
            lifetime = 60.0
        self._tokens[scope] = (token, time.monotonic() + max(lifetime - 5, 1))
        return token

    def _may_receive_credentials(self, realm: str) -> bool:
        return httppolicy.same_origin(realm, self.base) or httppolicy.origin(realm) in self.trusted_realms

    def check(self) -> None:
        """The registry answers /v2/ (after auth, when it asks for it)."""
        response = self._request("GET", "/v2/")
        if response.status_code != 200:
            raise InfraError(f"registry {self.host}: GET /v2/ answered HTTP {response.status_code}")

    # -- manifests and blobs ------------------------------------------------------------------------------

    def manifest(self, repo: str, reference: str, *, accept: tuple[str, ...] = MANIFEST_TYPES) -> Manifest | None:
        if self.manifests_fetched >= self.max_manifests:
            raise InfraError(
                f"registry {self.host}: more than {self.max_manifests:,} manifests fetched by one command "
                f"(next: {repo}:{reference}): given up; raise the cap with {MAX_MANIFESTS_ENV}=N"
            )
        self.manifests_fetched += 1
        response = self._request("GET", f"/v2/{repo}/manifests/{reference}", headers={"Accept": ", ".join(accept)})
        if response.status_code == 404:
            return None
        self._ok(response, f"GET manifest {repo}:{reference}")
        body = response.content
        digest = sha256_digest(body)
        claimed = response.headers.get("Docker-Content-Digest")
        if (claimed and claimed != digest) or (reference.startswith("sha256:") and reference != digest):
            raise InfraError(f"registry {self.host}: manifest {repo}:{reference} does not match its digest")
        found = Manifest(digest=digest, media_type="", body=body)
        media_type = response.headers.get("Content-Type", "").split(";")[0] or str(found.json.get("mediaType", ""))
        return Manifest(digest=digest, media_type=media_type, body=body)

    def put_manifest(self, repo: str, reference: str, body: bytes, media_type: str) -> httpx.Response:
        # Two uploads of one blob at once (two runners publishing receipts of one image share the
        # empty config blob) can leave it unknown for a moment after both uploads were accepted:
        # distribution 2.8 answered MANIFEST_BLOB_UNKNOWN to one of two concurrent publishes (CI,
        # 2026-12-07, test_publish_race). The blob was accepted, so the PUT is asked again, briefly.
        for pause in (0.2, 0.5, 1.0, None):
            response = self._request(
                "PUT", f"/v2/{repo}/manifests/{reference}", content=body, headers={"Content-Type": media_type}
            )
            if pause is None or response.status_code != 400 or "MANIFEST_BLOB_UNKNOWN" not in _errors(response):
                break
            time.sleep(pause)
        self._ok(response, f"PUT manifest {repo}:{reference}")
        return response

    def has_blob(self, repo: str, digest: str) -> bool:
        return self._request("HEAD", f"/v2/{repo}/blobs/{digest}").status_code == 200

    def put_blob(self, repo: str, data: bytes) -> str:
        digest = sha256_digest(data)
        if self.has_blob(repo, digest):
            return digest
        start = self._request("POST", f"/v2/{repo}/blobs/uploads/")
        self._ok(start, f"start blob upload to {repo}")
        location = start.headers["Location"]
        separator = "&" if "?" in location else "?"
        done = self._request(
            "PUT",
            f"{location}{separator}digest={digest}",
            content=data,
            headers={"Content-Type": "application/octet-stream"},
        )
        self._ok(done, f"upload blob {digest} to {repo}")
        return digest

    def get_blob(self, repo: str, digest: str) -> bytes:
        """The blob's bytes, refused while reading past the policy's body cap (`_send` reads under it)."""
        response = self._request("GET", f"/v2/{repo}/blobs/{digest}", follow_redirects=True)
        self._ok(response, f"GET blob {repo}@{digest}")
        if sha256_digest(response.content) != digest:
            raise InfraError(f"registry {self.host}: blob {digest} does not match its digest")
        return response.content

    def tags(self, repo: str) -> list[str]:
        response = self._request("GET", f"/v2/{repo}/tags/list")
        if response.status_code == 404:
            return []
        self._ok(response, f"GET tags of {repo}")
        tags = self._json(response, f"tags of {repo}").get("tags") or []
        if not isinstance(tags, list):
            raise InfraError(f"registry {self.host}: the tags of {repo} are not a list")
        return [str(t) for t in httppolicy.cap_items(tags, policy=self.policy, what=f"registry {self.host}: tags")]

    def referrers(self, repo: str, digest: str) -> list[dict[str, Any]] | None:
        """The OCI 1.1 referrers API: descriptors of the artifacts whose subject is `digest`, or None
        when the registry has no such API (404 or an answer that is not an image index)."""
        response = self._request("GET", f"/v2/{repo}/referrers/{digest}", headers={"Accept": OCI_INDEX})
        if response.status_code != 200 or response.headers.get("Content-Type", "").split(";")[0] != OCI_INDEX:
            return None
        try:
            listed = response.json().get("manifests") or []
        except (ValueError, AttributeError):
            return None
        if not isinstance(listed, list):
            return None
        what = f"registry {self.host}: referrers of {digest}"
        return [d for d in httppolicy.cap_items(listed, policy=self.policy, what=what) if isinstance(d, dict)]

    def _json(self, response: httpx.Response, what: str) -> dict[str, Any]:
        try:
            document = response.json()
        except ValueError as exc:
            raise InfraError(f"registry {self.host}: {what}: the answer is not JSON") from exc
        if not isinstance(document, dict):
            raise InfraError(f"registry {self.host}: {what}: the answer is not a JSON object")
        return document

    def _ok(self, response: httpx.Response, what: str) -> None:
        if response.status_code >= 300:
            raise InfraError(f"registry {self.host}: {what} answered HTTP {response.status_code}: {_errors(response)}")


def _errors(response: httpx.Response) -> str:
    """The registry's error codes and messages (a JSON body per the distribution spec), short."""
    try:
        errors = response.json().get("errors") or []
        return "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors)[:300] or response.text[:300]
    except (ValueError, AttributeError):
        return response.text[:300]


def _env_number(name: str, default: float) -> float:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (value > 0 and value != float("inf")):
        raise InputError(f"{name}={text!r}: a positive number is needed")
    return value


def read_env() -> dict[str, str]:
    """The environment, for `find_credentials` (an explicit argument everywhere else)."""
    return dict(os.environ)
