"""`stackproof pull`, `publish` and `report --registry` end to end against a hostile registry
(issue 27): the server of tests/hostile_registry.py (the unit tier's) behind a real socket on
127.0.0.1, the real CLI in a subprocess. Every refusal is exit 3 (the server is at fault) with a
message and no traceback, in bounded time; the password given on stdin never shows in any output
and never reaches a token service on another origin.

The CLI runs with the registry client's policy shrunk (a 3 s total deadline, a 1 MiB body cap, a
100-item listing cap) so that a dribbling answer is given up in seconds, not the default's minutes;
the rules are the same ones, only the numbers differ.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline.docker.client import Docker
from pipeline.registry.oci import TRUSTED_REALMS_ENV
from tests.hostile_registry import challenging, handler, in_front_of, listing, serve, token_service
from tests.integration.conftest import JOB, REPO, Daemon
from tests.integration.publish_bench import Bench
from tests.integration.registries import Registry, start_registry

pytestmark = pytest.mark.integration

SHRUNK = (
    "import runpy, sys\n"
    "from pipeline.guard.httppolicy import HttpPolicy\n"
    "from pipeline.registry.oci import RegistryClient\n"
    "policy = HttpPolicy(read_s=5, total_s=3, max_body=1 << 20, max_items=100)\n"
    "RegistryClient.__init__.__kwdefaults__['policy'] = policy\n"
    "sys.argv[0] = 'stackproof'\n"
    "runpy.run_module('pipeline', run_name='__main__')\n"
)
BOUND_S = 60  # no command here may take longer, whatever the server does


@dataclass(frozen=True)
class Ran:
    returncode: int
    output: str  # stdout and stderr together: what a user sees
    seconds: float


@pytest.fixture
def canary() -> str:
    return f"CANARY-{secrets.token_hex(8)}"


def cli(args: list[str], tmp_path: Path, *, password: str | None = None, env: dict[str, str] | None = None) -> Ran:
    config = tmp_path / "docker-config"
    config.mkdir(exist_ok=True)
    (config / "config.json").write_text("{}")  # no login of this machine's leaks in
    full = {**os.environ, "STACKPROOF_JOB": JOB, "DOCKER_CONFIG": str(config), **(env or {})}
    if TRUSTED_REALMS_ENV not in (env or {}):
        full.pop(TRUSTED_REALMS_ENV, None)  # only the realms a test names are trusted
    if password is not None:
        full["STACKPROOF_REGISTRY_USER"] = "publisher"
        args = [*args, "--password-stdin"]
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", SHRUNK, *args],
        cwd=REPO, env=full, input=password or "", capture_output=True, text=True, timeout=BOUND_S,
    )  # fmt: skip
    sys.stderr.write(proc.stderr[-5000:])
    return Ran(proc.returncode, proc.stdout + proc.stderr, time.monotonic() - started)


def refused(ran: Ran, *, code: int, says: str, secret: str | None = None) -> None:
    assert ran.returncode == code, ran.output[-2000:]
    assert says in ran.output, ran.output[-2000:]
    assert "Traceback" not in ran.output
    assert secret is None or secret not in ran.output


def test_a_token_realm_on_another_origin_never_gets_the_credentials(
    docker: Docker, tmp_path: Path, canary: str
) -> None:
    with serve(token_service) as realm, serve(challenging(f"{realm.url}/token")) as registry:
        ran = cli(["pull", "hostile", "--registry", registry.address, "--no-preflight"], tmp_path, password=canary)
        refused(ran, code=3, says="were not sent to the token service", secret=canary)
        assert realm.seen, "the token service was never asked (anonymously)"
        assert not any("authorization" in r.headers for r in realm.seen), "credentials went to another origin"
        assert not any(canary in str(r.url) + r.content.decode(errors="replace") for r in realm.seen)

        # The other way: a realm the user names as the registry's own gets them (and the registry,
        # which wants more than any token, still refuses: exit 3, the password still unprinted).
        realm.seen.clear()
        trusted = {TRUSTED_REALMS_ENV: realm.url}
        ran = cli(
            ["pull", "hostile", "--registry", registry.address, "--no-preflight"],
            tmp_path,
            password=canary,
            env=trusted,
        )
        assert ran.returncode == 3 and "Traceback" not in ran.output and canary not in ran.output, ran.output[-2000:]
        sent = [r for r in realm.seen if "authorization" in r.headers or b"password" in r.content]
        assert sent, "a trusted realm should have been asked with the credentials"


def test_a_dribbling_manifest_is_given_up_at_the_total_deadline(docker: Docker, tmp_path: Path) -> None:
    with serve(handler) as registry:
        ran = cli(["pull", "dribble", "--registry", registry.address, "--no-preflight"], tmp_path)
        refused(ran, code=3, says="longer than 3s in all")
        assert ran.seconds < 3 + 20
        # The other way: a prompt answer (no such manifest) is not a deadline: it says what is missing.
        ran = cli(["pull", "absent", "--registry", registry.address, "--no-preflight"], tmp_path)
        assert "longer than" not in ran.output and "Traceback" not in ran.output and ran.returncode != 0
        assert ran.seconds < 20


def test_a_manifest_past_the_cap_is_refused_while_reading(docker: Docker, tmp_path: Path) -> None:
    with serve(handler) as registry:
        ran = cli(["pull", "endless", "--registry", registry.address, "--no-preflight"], tmp_path)
        refused(ran, code=3, says="larger than 1,048,576 bytes: refused while reading")
        assert ran.seconds < 20


def test_a_tag_listing_past_the_cap_is_refused_and_a_small_one_read(docker: Docker, tmp_path: Path) -> None:
    with serve(listing(100_000)) as registry:
        ran = cli(["report", "--registry", registry.address, "--out", str(tmp_path / "site")], tmp_path)
        refused(ran, code=3, says="lists more than 100 items")
    with serve(listing(3)) as registry:
        ran = cli(["report", "--registry", registry.address, "--out", str(tmp_path / "site-small")], tmp_path)
        assert "more than 100 items" not in ran.output and "Traceback" not in ran.output, ran.output[-2000:]


def test_publish_to_a_hostile_registry_exits_3_and_leaks_nothing(docker: Docker, tmp_path: Path, canary: str) -> None:
    """A real publish (an image tagged as the test cell's content tag, a real receipt: test_publish's
    Bench) to a registry whose token realm is elsewhere: exit 3 at the registry, the password unsent."""
    daemon = Daemon(name="docker-20.10", cli=docker.cli.path, env={}, store=docker.image_store())
    config = tmp_path / "publish-config"
    config.mkdir()
    (config / "config.json").write_text("{}")
    with serve(token_service) as realm, serve(challenging(f"{realm.url}/token")) as registry:
        bench = Bench(daemon, Registry("basic", registry.address, canary, None, tmp_path / "log"), config, tmp_path)
        try:
            version = bench.version("hostile")
            ran = bench.publish(version, bench.receipt(version), login=True)
            output = ran.stdout + ran.stderr
            refused(Ran(ran.returncode, output, 0), code=3, says="were not sent to the token service", secret=canary)
            assert registry.seen and not any("authorization" in r.headers for r in realm.seen)
        finally:
            bench.cleanup()


def test_a_blob_past_the_cap_in_front_of_a_real_registry_is_refused(
    docker: Docker, tmp_path: Path, canary: str
) -> None:
    """Publish to a real registry, then pull through a proxy in front of it whose blobs never end:
    the receipt's blob is refused while reading (exit 3: the registry failed; nothing pulled), in
    bounded time; through the registry itself the same pull succeeds (the other way)."""
    daemon = Daemon(name="docker-20.10", cli=docker.cli.path, env={}, store=docker.image_store())
    config = tmp_path / "proxy-config"
    config.mkdir()
    (config / "config.json").write_text("{}")
    (tmp_path / "registry").mkdir()
    with start_registry("anonymous", tmp_path / "registry", password=canary) as real:
        bench = Bench(daemon, real, config, tmp_path)
        try:
            version = bench.version("proxied")
            published = bench.publish(version, bench.receipt(version), login=False)
            assert published.returncode == 0, published.stderr[-3000:]
            daemon.docker("rmi", version.tag)
            with serve(in_front_of(real.address)) as proxy:
                ran = cli(["pull", "pub-tiny", "--registry", proxy.address, "--no-preflight"], tmp_path)
                assert ran.returncode == 3, ran.output[-2000:]  # the registry failed: infrastructure
                assert "larger than 1,048,576 bytes: refused while reading" in ran.output, ran.output[-2000:]
                assert "Traceback" not in ran.output and ran.seconds < 30
                assert bench.pulled_id() is None
            good = cli(["pull", "pub-tiny", "--registry", real.address, "--no-preflight"], tmp_path)
            assert good.returncode == 0, good.output[-2000:]
            assert bench.pulled_id() == version.image_id
        finally:
            bench.cleanup()
