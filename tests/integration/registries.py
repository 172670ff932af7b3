"""Real registries and a second real Docker for the publish/pull tier, all on 127.0.0.1.

- `start_registry(kind)`: Debian's docker-registry (distribution 2.8) anonymous, with Basic auth
  (htpasswd, bcrypt), or with `auth: token` trusting `TokenIssuer`, a small token service started
  here: it answers `GET /token?service=&scope=` anonymously (pull only) or with Basic credentials
  (pull and push) with an ES256 JWT whose `x5c` header carries its self-signed certificate, the
  one the registry's `rootcertbundle` names. It counts what it was asked, so tests can see tokens
  reused and refreshed.
- `Docker26`: Debian 13's dockerd 26 from .ci/setup's prefix, with the containerd image store, on its
  own socket, data-root, exec-root and pidfile; stopped by its pid.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import bcrypt
import httpx
import jwt
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.integration.fake_cdi import write_fake_cdi_spec

DOCKER26_PREFIX = Path(os.environ.get("STACKPROOF_DOCKER26", "/opt/stackproof/docker26"))
SERVICE = "stackproof-test-registry"
ISSUER = "stackproof-test-issuer"
USER = "publisher"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(what: str, check: Any, *, timeout: float = 30, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: exited with {proc.returncode}")
        try:
            if check():
                return
        except (httpx.TransportError, OSError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not ready within {timeout:.0f} s")
        time.sleep(0.2)


# -- the token service -------------------------------------------------------------------------------


@dataclass
class TokenIssuer:
    users: dict[str, str]
    lifetime: float = 300  # what the JWT's exp says
    claimed_lifetime: int | None = None  # what the answer's expires_in says (lie to force a 401 refresh)
    requests: list[dict[str, Any]] = field(default_factory=list)
    key: ec.EllipticCurvePrivateKey = field(default_factory=lambda: ec.generate_private_key(ec.SECP256R1()))
    port: int = 0
    certificate_der: bytes = b""
    _server: ThreadingHTTPServer | None = None

    def certificate(self) -> x509.Certificate:
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ISSUER)])
        now = datetime.datetime.now(datetime.UTC)
        return (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .sign(self.key, hashes.SHA256())
        )

    @property
    def realm(self) -> str:
        return f"http://127.0.0.1:{self.port}/token"

    def grant(self, user: str | None, scopes: list[str]) -> list[dict[str, Any]]:
        access = []
        for scope in scopes:
            kind, _, rest = scope.partition(":")
            name, _, actions = rest.rpartition(":")
            allowed = {"pull", "push"} if user else {"pull"}
            granted = [a for a in actions.split(",") if a in allowed]
            if kind == "repository" and granted:
                access.append({"type": kind, "name": name, "actions": granted})
        return access

    def token(self, user: str | None, scopes: list[str]) -> str:
        now = int(time.time())
        claims = {
            "iss": ISSUER,
            "sub": user or "",
            "aud": SERVICE,
            "iat": now,
            "nbf": now - 5,
            "exp": now + int(self.lifetime),
            "jti": uuid.uuid4().hex,
            "access": self.grant(user, scopes),
        }
        der = self.certificate_der
        return jwt.encode(claims, self.key, algorithm="ES256", headers={"x5c": [base64.b64encode(der).decode()]})

    @contextmanager
    def serve(self) -> Iterator[TokenIssuer]:
        self.certificate_der = self.certificate().public_bytes(serialization.Encoding.DER)
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                """docker's classic pusher: GET with Basic credentials (or none)."""
                query = parse_qs(urlparse(self.path).query)
                header = self.headers.get("Authorization", "")
                name = password = None
                if header.startswith("Basic "):
                    name, _, password = base64.b64decode(header[6:]).decode().partition(":")
                self.answer(name, password, query.get("scope", []), "token")

            def do_POST(self) -> None:
                """The OAuth2 form containerd's resolver (Docker 26's containerd store) posts first."""
                length = int(self.headers.get("Content-Length", "0"))
                form = parse_qs(self.rfile.read(length).decode())
                scopes = [s for scope in form.get("scope", []) for s in scope.split(" ") if s]
                if form.get("grant_type") != ["password"]:
                    self.send_response(400)
                    self.end_headers()
                    return
                self.answer(form.get("username", [""])[0], form.get("password", [""])[0], scopes, "access_token")

            def answer(self, name: str | None, password: str | None, scopes: list[str], key: str) -> None:
                if name is not None and issuer.users.get(name) != password:
                    issuer.requests.append({"user": name, "refused": True, "scope": scopes})
                    self.send_response(401)
                    self.end_headers()
                    return
                issuer.requests.append({"user": name, "refused": False, "scope": scopes})
                body = {key: issuer.token(name, scopes), "expires_in": issuer.claimed_lifetime or int(issuer.lifetime)}
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()
            thread.join(timeout=10)


# -- the registries ----------------------------------------------------------------------------------


@dataclass
class Registry:
    kind: str  # anonymous, basic, token
    address: str
    password: str | None
    issuer: TokenIssuer | None
    log: Path
    user: str = USER


@contextmanager
def start_registry(
    kind: str, directory: Path, *, password: str, issuer: TokenIssuer | None = None
) -> Iterator[Registry]:
    binary = shutil.which("docker-registry")
    assert binary is not None
    port = free_port()
    config: dict[str, Any] = {
        "version": 0.1,
        "log": {"level": "warn"},
        "storage": {"filesystem": {"rootdirectory": str(directory / "storage")}, "delete": {"enabled": True}},
        "http": {"addr": f"127.0.0.1:{port}"},
    }
    if kind == "basic":
        htpasswd = directory / "htpasswd"
        htpasswd.write_text(f"{USER}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()}\n")
        config["auth"] = {"htpasswd": {"realm": "stackproof-test", "path": str(htpasswd)}}
    elif kind == "token":
        assert issuer is not None
        bundle = directory / "issuer.pem"  # the certificate serve() put in every token's x5c header
        bundle.write_bytes(
            x509.load_der_x509_certificate(issuer.certificate_der).public_bytes(serialization.Encoding.PEM)
        )
        config["auth"] = {
            "token": {"realm": issuer.realm, "service": SERVICE, "issuer": ISSUER, "rootcertbundle": str(bundle)}
        }
    (directory / "registry.yml").write_text(yaml.safe_dump(config))
    log_path = directory / "registry.log"
    log = log_path.open("w")
    proc = subprocess.Popen([binary, "serve", str(directory / "registry.yml")], stdout=log, stderr=subprocess.STDOUT)
    address = f"127.0.0.1:{port}"
    try:
        wait_until(
            f"docker-registry ({kind})",
            lambda: httpx.get(f"http://{address}/v2/", timeout=2).status_code in (200, 401),
            proc=proc,  # type: ignore[arg-type]
        )
        yield Registry(
            kind=kind,
            address=address,
            password=password if kind != "anonymous" else None,
            issuer=issuer,
            log=log_path,
        )
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


# -- Docker 26 ---------------------------------------------------------------------------------------


@dataclass
class Docker26:
    """dockerd 26 with the containerd image store, on its own socket; `stop()` ends it by its pid."""

    state: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def socket(self) -> Path:
        return self.state / "docker.sock"

    @property
    def cli(self) -> str:
        return str(DOCKER26_PREFIX / "usr" / "bin" / "docker")

    @property
    def plugins(self) -> str:
        return str(DOCKER26_PREFIX / "usr" / "libexec" / "docker" / "cli-plugins")

    def env(self) -> dict[str, str]:
        return {
            "DOCKER_HOST": f"unix://{self.socket}",
            "PATH": f"{DOCKER26_PREFIX / 'usr' / 'bin'}:{os.environ.get('PATH', '')}",
        }

    def start(self) -> None:
        for sub in ("data", "exec"):
            (self.state / sub).mkdir(parents=True, exist_ok=True)
        # CDI on, reading a spec for a fake device kind (tests/integration/fake_cdi.py): the CPU proof of
        # the CDI GPU path (pipeline/docker/gpuaccess.py).
        cdi = write_fake_cdi_spec(self.state / "cdi")
        config = {"features": {"containerd-snapshotter": True, "cdi": True}, "cdi-spec-dirs": [str(cdi)]}
        (self.state / "daemon.json").write_text(json.dumps(config))
        path = f"{DOCKER26_PREFIX / 'usr' / 'bin'}:{DOCKER26_PREFIX / 'usr' / 'sbin'}:/usr/sbin:/usr/bin:/sbin:/bin"
        log = (self.state / "dockerd.log").open("w")
        argv = [
            str(DOCKER26_PREFIX / "usr" / "sbin" / "dockerd"),
            "--config-file", str(self.state / "daemon.json"),
            "--data-root", str(self.state / "data"),
            "--exec-root", str(self.state / "exec"),
            "--pidfile", str(self.state / "dockerd.pid"),
            "-H", f"unix://{self.socket}",
            "--bridge=none", "--iptables=false", "--ip6tables=false",
        ]  # fmt: skip
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PATH": path})
        log.close()
        try:
            wait_until(
                "dockerd 26",
                lambda: (
                    subprocess.run(
                        [self.cli, "info"], env={**os.environ, **self.env()}, capture_output=True, timeout=10
                    ).returncode
                    == 0
                ),
                timeout=60,
                proc=self.proc,
            )
        except AssertionError:
            self.stop()
            raise AssertionError(
                f"dockerd 26 did not start: {(self.state / 'dockerd.log').read_text()[-2000:]}"
            ) from None

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None
