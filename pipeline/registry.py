"""A small OCI distribution client: manifests, blobs and tags, over httpx. No docker involved.

Enough to attach a receipt to an image digest and to move tags to exact digests: `docker push`
only pushes tags, and a tag moved by re-pushing could land on whatever the local tag points at
by then; a manifest PUT by digest cannot. Loopback registries are spoken to over plain HTTP (as
docker does), others over HTTPS with the site's CA bundle. Credentials, when set
(STACKPROOF_REGISTRY_USER / STACKPROOF_REGISTRY_PASSWORD), go in the Authorization header only.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

import httpx

from pipeline.errors import InfraError, InputError

__all__ = ["MANIFEST_TYPES", "Manifest", "RegistryClient", "split_registry"]

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MANIFEST_TYPES = (
    OCI_MANIFEST,
    DOCKER_MANIFEST,
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
_LOOPBACK = ("127.0.0.1", "localhost", "[::1]")


def split_registry(text: str) -> tuple[str, str]:
    """`host[:port][/namespace]` -> (host[:port], namespace or '')."""
    text = text.strip().removeprefix("http://").removeprefix("https://").rstrip("/")
    host, _, namespace = text.partition("/")
    if not host or " " in text:
        raise InputError(f"--registry {text!r}: write HOST[:PORT][/NAMESPACE], e.g. 127.0.0.1:5000")
    return host, namespace


@dataclass(frozen=True, kw_only=True)
class Manifest:
    digest: str
    media_type: str
    body: bytes

    @property
    def json(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.body)
        return data

    @property
    def config_digest(self) -> str | None:
        config = self.json.get("config") or {}
        return config.get("digest")


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class RegistryClient:
    def __init__(self, host: str, *, ca_bundle: str | None = None, timeout: float = 60) -> None:
        self.host = host
        loopback = host.split(":")[0] in _LOOPBACK or host.startswith("[::1]")
        self.base = f"{'http' if loopback else 'https'}://{host}"
        user, password = os.environ.get("STACKPROOF_REGISTRY_USER"), os.environ.get("STACKPROOF_REGISTRY_PASSWORD")
        auth = httpx.BasicAuth(user, password) if user and password else None
        self.client = httpx.Client(base_url=self.base, timeout=timeout, auth=auth, verify=ca_bundle or True)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        try:
            return self.client.request(method, url, **kwargs)
        except httpx.HTTPError as exc:
            raise InfraError(f"registry {self.host} unreachable ({type(exc).__name__}: {exc}); is it running?") from exc

    def check(self) -> None:
        response = self._request("GET", "/v2/")
        if response.status_code == 401:
            raise InfraError(
                f"registry {self.host} wants credentials: set STACKPROOF_REGISTRY_USER and STACKPROOF_REGISTRY_PASSWORD"
            )
        if response.status_code != 200:
            raise InfraError(f"registry {self.host}: GET /v2/ answered HTTP {response.status_code}")

    def manifest(self, repo: str, reference: str) -> Manifest | None:
        response = self._request(
            "GET", f"/v2/{repo}/manifests/{reference}", headers={"Accept": ", ".join(MANIFEST_TYPES)}
        )
        if response.status_code == 404:
            return None
        self._ok(response, f"GET manifest {repo}:{reference}")
        body = response.content
        digest = response.headers.get("Docker-Content-Digest") or sha256_digest(body)
        if sha256_digest(body) != digest:
            raise InfraError(f"registry {self.host}: manifest {repo}:{reference} does not match its digest {digest}")
        media_type = response.headers.get("Content-Type", "").split(";")[0] or json.loads(body).get("mediaType", "")
        return Manifest(digest=digest, media_type=media_type, body=body)

    def put_manifest(self, repo: str, reference: str, body: bytes, media_type: str) -> str:
        response = self._request(
            "PUT", f"/v2/{repo}/manifests/{reference}", content=body, headers={"Content-Type": media_type}
        )
        self._ok(response, f"PUT manifest {repo}:{reference}")
        return response.headers.get("Docker-Content-Digest") or sha256_digest(body)

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
        response = self._request("GET", f"/v2/{repo}/blobs/{digest}", follow_redirects=True)
        self._ok(response, f"GET blob {repo}@{digest}")
        if sha256_digest(response.content) != digest:
            raise InfraError(f"registry {self.host}: blob {digest} does not match its digest")
        return response.content

    def _ok(self, response: httpx.Response, what: str) -> None:
        if response.status_code >= 300:
            raise InfraError(
                f"registry {self.host}: {what} answered HTTP {response.status_code}: {response.text[:300]}"
            )
