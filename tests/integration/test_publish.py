"""Verified publish and pull through real registries, on both Dockers: each registry kind and its auth.

Every test runs on Debian 12's Docker 20.10 (classic image store: `.Id` is the config digest) and
on Debian 13's Docker 26 with the containerd image store (`.Id` is the manifest digest). The
combination test runs each registry kind: anonymous, Basic auth (htpasswd) and token auth
(distribution's `auth: token` with a token issuer started by the test); then refused credentials,
a registry that is down, token reuse and refresh, and a docker credential helper. The registry
password is a canary: no output of any command may contain it. What publish refuses and pull checks
of the receipts is in test_publish_receipts.py; the bench both use is publish_bench.py.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.registry.oci import Credentials, RegistryClient
from pipeline.registry.publish import referrers_tag
from tests.integration.conftest import IMAGES, Daemon
from tests.integration.publish_bench import CELL, REPO_NAME, Bench, _bench, _mkdir
from tests.integration.registries import USER, Registry

pytestmark = pytest.mark.integration


@pytest.fixture(params=["anonymous", "basic", "token"])
def any_registry(
    request: pytest.FixtureRequest, daemon: Daemon, tmp_path: Path, docker_config: Path, canary: str
) -> Iterator[Bench]:
    yield from _bench(daemon, request.param, tmp_path, docker_config, canary)


@pytest.fixture
def token_bench(daemon: Daemon, tmp_path: Path, docker_config: Path, canary: str) -> Iterator[Bench]:
    yield from _bench(daemon, "token", tmp_path, docker_config, canary)


# -- every combination ---------------------------------------------------------------------------------


def test_publish_then_pull(any_registry: Bench) -> None:
    """Publish then pull on this registry kind and this Docker; the password never shows."""
    b = any_registry
    version = b.version("a")
    if b.registry.kind == "token":
        b.docker_login()  # docker's own login: config.json auths, read by stackproof too
        published = b.publish(version, b.receipt(version), login=False)
    else:
        published = b.publish(version, b.receipt(version), login=b.registry.kind == "basic")
    assert published.returncode == 0, published.stderr[-3000:]
    result = published.json()
    tags = b.tags()
    assert tags[f"{CELL}-verified"] == tags[CELL] == result["digest"]
    assert result["moved_tags"] == [f"{CELL}-verified", CELL]
    assert referrers_tag(result["manifest_digest"]) in tags and result["referrers"].startswith("tag-schema")
    if b.daemon.store == "containerd":
        assert result["digest"] == version.image_id  # .Id is the manifest digest there
    else:
        assert result["config_digest"] == version.image_id  # and the config digest here
    # publish removed its registry-qualified alias again
    assert b.registry.address not in b.daemon.docker("images", "--format", "{{.Repository}}")

    b.daemon.docker("rmi", version.tag)  # pull must bring it back from the registry
    b.docker_logout()  # a user with no login: the token registry lets anyone pull (an anonymous token)
    pulled = b.pull("--json", login=b.registry.kind == "basic")
    assert pulled.returncode == 0, pulled.stderr[-3000:]
    document = pulled.json()
    assert document["digest"] == result["manifest_digest"] and document["host_differences"] == []
    assert document["signature"] == "unsigned" and b.pulled_id() == version.image_id
    if b.registry.issuer is not None:
        asked = b.registry.issuer.requests
        assert any(r["user"] == USER for r in asked) and any(r["user"] is None for r in asked)
        assert not any(r["refused"] for r in asked)


def test_auth_refused_and_registry_down_exit_3(
    daemon: Daemon, tmp_path: Path, docker_config: Path, canary: str
) -> None:
    for kind in ("basic", "token"):
        for b in _bench(daemon, kind, tmp_path / kind, docker_config, canary):
            version = b.version(f"refused-{kind}")
            wrong = b.run(
                ["publish", CELL, "--matrix", str(version.matrix), "--images", str(IMAGES),
                 "--receipt", str(b.receipt(version)), "--registry", b.registry.address],
                login=True,
                password="wrong-" + canary,
            )  # fmt: skip
            assert wrong.returncode == 3, wrong.stderr[-2000:]
            assert "refused" in wrong.stderr and "STACKPROOF_REGISTRY_USER" in wrong.stderr
            assert "Traceback" not in wrong.stderr and canary not in wrong.stderr + wrong.stdout
            anonymous = b.pull()
            if kind == "basic":
                assert anonymous.returncode == 3 and "wants credentials" in anonymous.stderr, anonymous.stderr[-2000:]
            assert b.tags() == {}
    down = Bench(daemon, Registry("anonymous", "127.0.0.1:9", None, None, tmp_path / "none"), docker_config, tmp_path)
    gone = down.pull()
    assert gone.returncode == 3 and "unreachable" in gone.stderr and "Traceback" not in gone.stderr


def test_token_reuse_and_refresh_after_expiry(token_bench: Bench) -> None:
    """One client through a real token registry: tokens are reused per scope, refetched for a new scope
    (pull -> push) and after the registry refuses an expired one."""
    b = token_bench
    assert b.registry.issuer is not None and b.registry.password is not None
    # Tokens the issuer says last an hour but the registry stops taking within seconds (it allows
    # 60 s of clock skew past `exp`): only a refresh on 401 gets past that.
    b.registry.issuer.lifetime, b.registry.issuer.claimed_lifetime = -56, 3600
    creds = Credentials(username=USER, secret=b.registry.password, source="test")
    with RegistryClient(b.registry.address, credentials=creds, trusted_realms=b._realms()) as client:
        client.check()
        client.manifest(REPO_NAME, "nothing")  # pull scope
        client.manifest(REPO_NAME, "still-nothing")  # reused
        pull_tokens = client.token_requests
        assert pull_tokens == 2  # /v2/ (no scope), then repository:stackproof:pull
        client.put_blob(REPO_NAME, b"{}")  # push scope: one more token
        assert client.token_requests == pull_tokens + 1
        client.manifest(REPO_NAME, "again")  # the pull,push token still serves a pull
        assert client.token_requests == pull_tokens + 1
        time.sleep(6)  # the registry now refuses those tokens: a 401, a fresh token, the retry passes
        b.registry.issuer.lifetime = 300
        assert client.manifest(REPO_NAME, "after-expiry") is None
        assert client.token_requests == pull_tokens + 2


def test_credential_helper_feeds_stackproof_and_docker(token_bench: Bench, tmp_path: Path) -> None:
    """docker's config names a credential helper for the registry: `docker-credential-NAME get` answers both."""
    b = token_bench
    helper_dir = _mkdir(tmp_path / "helpers")
    helper = helper_dir / "docker-credential-stackprooftest"
    answer = json.dumps({"ServerURL": b.registry.address, "Username": USER, "Secret": b.registry.password})
    helper.write_text(f"#!/bin/sh\n[ \"$1\" = get ] || exit 1\ncat >/dev/null\nprintf '%s' '{answer}'\n")
    helper.chmod(0o700)
    config = json.loads((b.config / "config.json").read_text())
    config["credHelpers"] = {b.registry.address: "stackprooftest"}
    (b.config / "config.json").write_text(json.dumps(config))
    version = b.version("helper")
    path = f"{helper_dir}:{b.daemon.env.get('PATH', os.environ['PATH'])}"
    published = b.run(
        ["publish", CELL, "--matrix", str(version.matrix), "--images", str(IMAGES),
         "--receipt", str(b.receipt(version)), "--registry", b.registry.address, "--json"],
        env={"PATH": path},
    )  # fmt: skip
    assert published.returncode == 0, published.stderr[-3000:]
    assert b.registry.issuer is not None and any(r["user"] == USER for r in b.registry.issuer.requests)
