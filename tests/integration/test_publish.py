"""Verified publish and pull through real registries, on both Dockers.

Every test runs on Debian 12's Docker 20.10 (classic image store: `.Id` is the config digest) and
on Debian 13's Docker 26 with the containerd image store (`.Id` is the manifest digest). The
combination test runs each registry kind: anonymous, Basic auth (htpasswd) and token auth
(distribution's `auth: token` with a token issuer started by the test). The registry password is
a canary: no output of any command may contain it.

Small imported images stand in for a cell's image: they are tagged as the content tag of a small
test cell (`pub-tiny`, a copy of the real matrix plus that cell), which is what publish accepts;
the receipts are made by the real receipt code from verify reports of those images, written into
run directories as a run writes them (receipt.json, junit.xml, summary.md).
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from pipeline.build.plan import plan_cell
from pipeline.host.geometry import HostFingerprint, host_fingerprint
from pipeline.matrix.model import STAGES
from pipeline.matrix.read import load_matrix
from pipeline.matrix.site import load_site
from pipeline.receipt import write_all
from pipeline.registry.oci import OCI_INDEX, OCI_MANIFEST, TRUSTED_REALMS_ENV, Credentials, RegistryClient
from pipeline.registry.publish import RECEIPT_MEDIA_TYPE, legacy_receipt_tag, referrers_tag
from pipeline.result import CheckResult, Outcome, StageResult, Status, VerifyReport
from tests.integration.conftest import IMAGES, REPO, Daemon, write_matrix
from tests.integration.registries import USER, Registry, TokenIssuer, start_registry
from verify.stages.receipt import build_receipt

pytestmark = pytest.mark.integration

CELL = "pub-tiny"
REPO_NAME = "stackproof"
ELSEWHERE = HostFingerprint(
    arch="aarch64",
    kernel="6.8.0",
    os="Ubuntu 24.04",
    docker="28.0.0",
    gpus=({"name": "NVIDIA GB10", "compute_capability": "12.1", "memory": "128 GiB"},),
    driver="580.95.05",
    cuda_driver="13.0",
)


@dataclass
class Version:
    """One version of the test cell: its matrix, content tag and image (on the daemon under test)."""

    matrix: Path
    digest: str
    tag: str
    image_id: str


class Bench:
    """A daemon, a registry and a DOCKER_CONFIG; every command's output is checked for the password."""

    def __init__(self, daemon: Daemon, registry: Registry, config: Path, tmp: Path) -> None:
        self.daemon, self.registry, self.config, self.tmp = daemon, registry, config, tmp
        self.outputs: list[str] = []
        self.versions: list[Version] = []

    # -- the cell and its images --------------------------------------------------------------------

    def version(self, name: str) -> Version:
        """A matrix where the test cell's image is `name`, and that image, tagged as its content tag."""
        directory = self.tmp / f"v-{name}"
        directory.mkdir()
        cell = {
            "id": CELL,
            "base": "debian-bookworm",
            "arch": "none",
            "runner": ["self-hosted"],
            "env": {"STACKPROOF_TEST_IMAGE": name},
            "serve": {"model": {"source": "path:/hello.txt"}},
        }
        path = write_matrix(directory / "matrix.yaml", extra_cells=[cell])
        matrix = load_matrix(path, images_dir=IMAGES)
        tag = plan_cell(matrix, matrix.cell(CELL), load_site(matrix), IMAGES).tag
        (directory / "hello.txt").write_text(f"stackproof test image {name} {os.getpid()}\n")
        with tarfile.open(directory / "image.tar", "w") as tar:
            tar.add(directory / "hello.txt", arcname="hello.txt")
        self.daemon.docker("import", "--change", 'CMD ["/hello.txt"]', str(directory / "image.tar"), tag)
        image_id = self.daemon.image_id(tag)
        assert image_id is not None
        version = Version(matrix=path, digest=matrix.digest, tag=tag, image_id=image_id)
        self.versions.append(version)
        return version

    def receipt(self, version: Version, *, passed: bool = True, host: HostFingerprint | None = None) -> Path:
        status = Status.PASS if passed else Status.FAIL
        stages = tuple(
            StageResult.of(stage, [CheckResult(name=stage, status=status, message=f"{stage}: {status}")], 1.0)
            for stage in STAGES
        )
        report = VerifyReport(
            cell=CELL,
            arm=None,
            image=version.tag,
            image_id=version.image_id,
            stages=stages,
            outcome=Outcome(passed=passed, summary="all stages passed" if passed else "startup FAIL"),
        )
        receipt = build_receipt(
            report,
            matrix_digest=version.digest,
            host=host or host_fingerprint(self.daemon.docker("version", "--format", "{{.Server.Version}}").strip()),
            started_at=time.time() - 1,
            finished_at=time.time(),
            image_store=self.daemon.store,
        )
        out = Path(os.path.dirname(version.matrix)) / f"run-{secrets.token_hex(4)}"
        out.mkdir()
        return write_all(receipt, out)["receipt"]

    # -- commands ----------------------------------------------------------------------------------------

    def env(self, **extra: str) -> dict[str, str]:
        # The test token service listens on its own port: another origin, named as the registry's own.
        realms = {TRUSTED_REALMS_ENV: self.registry.issuer.realm} if self.registry.issuer is not None else {}
        return {"DOCKER_CONFIG": str(self.config), **realms, **extra}

    def run(
        self, args: list[str], *, login: bool = False, env: dict[str, str] | None = None, password: str | None = None
    ):  # type: ignore[no-untyped-def]
        """`stackproof ARGS` on this daemon; `login`: STACKPROOF_REGISTRY_USER + --password-stdin."""
        extra = dict(env or {})
        stdin = None
        if login:
            extra["STACKPROOF_REGISTRY_USER"] = USER
            args = [*args, "--password-stdin"]
            stdin = password if password is not None else self.registry.password
        result = self.daemon.stackproof(args, env=self.env(**extra), input_text=stdin)
        self.outputs += [result.stdout, result.stderr]
        return result

    def publish(self, version: Version, receipt: Path, *, login: bool | None = None, extra: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
        login = bool(self.registry.password) if login is None else login
        args = ["publish", CELL, "--matrix", str(version.matrix), "--images", str(IMAGES), "--receipt", str(receipt)]
        return self.run([*args, "--registry", self.registry.address, "--json", *extra], login=login)

    def pull(self, *extra: str, login: bool = False):  # type: ignore[no-untyped-def]
        return self.run(["pull", CELL, "--registry", self.registry.address, "--no-preflight", *extra], login=login)

    def client(self) -> RegistryClient:
        creds = None
        if self.registry.password:
            creds = Credentials(username=USER, secret=self.registry.password, source="test")
        return RegistryClient(self.registry.address, credentials=creds, trusted_realms=self._realms())

    def _realms(self) -> tuple[str, ...]:
        return (self.registry.issuer.realm,) if self.registry.issuer is not None else ()

    def tags(self) -> dict[str, str]:
        with self.client() as client:
            return {tag: m.digest for tag in client.tags(REPO_NAME) if (m := client.manifest(REPO_NAME, tag))}

    def pulled_id(self) -> str | None:
        return self.daemon.image_id(f"stackproof/{CELL}:verified")

    def docker_login(self) -> None:
        """Write docker's own login (config.json `auths`) for the registry, as `docker login` would."""
        config = json.loads((self.config / "config.json").read_text())
        auth = base64.b64encode(f"{USER}:{self.registry.password}".encode()).decode()
        config["auths"] = {self.registry.address: {"auth": auth}}
        (self.config / "config.json").write_text(json.dumps(config))

    def docker_logout(self) -> None:
        config = json.loads((self.config / "config.json").read_text())
        config.pop("auths", None)
        (self.config / "config.json").write_text(json.dumps(config))

    def cleanup(self) -> None:
        for version in self.versions:
            self.daemon.docker("rmi", "--force", version.tag, check=False)
        self.daemon.docker("rmi", "--force", f"stackproof/{CELL}:verified", check=False)
        listed = self.daemon.docker(
            "images", "--digests", "--format", "{{.Repository}} {{.Tag}} {{.Digest}}", check=False
        )
        for repository, tag, digest in (line.split() for line in listed.splitlines() if line.count(" ") == 2):
            if repository.startswith(self.registry.address):
                ref = f"{repository}@{digest}" if tag == "<none>" else f"{repository}:{tag}"
                self.daemon.docker("rmi", "--force", ref, check=False)

    def assert_no_secret(self) -> None:
        """The password is in no command's output, nothing the registry stores (receipts included),
        and no file this test wrote; docker's private login copies are gone."""
        password = self.registry.password
        if not password:
            return
        leaked = [i for i, text in enumerate(self.outputs) if password in text]
        assert not leaked, "the registry password appeared in a command's output"
        for root in (self.registry.log.parent / "storage", *(Path(v.matrix).parent for v in self.versions)):
            for path in root.rglob("*"):
                if path.is_file() and not path.is_symlink():
                    assert password.encode() not in path.read_bytes(), f"the registry password is in {path}"
        assert password not in self.registry.log.read_text()
        import tempfile

        assert not list(Path(tempfile.gettempdir()).glob("stackproof-docker-config-*")), "a login copy was left"


@pytest.fixture
def canary() -> str:
    return f"CANARY-{secrets.token_hex(8)}"


def _bench(daemon: Daemon, kind: str, tmp_path: Path, config: Path, password: str, **issuer: object) -> Iterator[Bench]:
    token_issuer = TokenIssuer(users={USER: password}, **issuer) if kind == "token" else None  # type: ignore[arg-type]
    if token_issuer is None:
        with start_registry(kind, _mkdir(tmp_path / "registry"), password=password) as registry:
            yield from _run_bench(daemon, registry, config, tmp_path)
        return
    with (
        token_issuer.serve(),
        start_registry(kind, _mkdir(tmp_path / "registry"), password=password, issuer=token_issuer) as registry,
    ):
        yield from _run_bench(daemon, registry, config, tmp_path)


def _run_bench(daemon: Daemon, registry: Registry, config: Path, tmp_path: Path) -> Iterator[Bench]:
    bench = Bench(daemon, registry, config, tmp_path)
    try:
        yield bench
        bench.assert_no_secret()
    finally:
        bench.cleanup()


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(params=["anonymous", "basic", "token"])
def any_registry(
    request: pytest.FixtureRequest, daemon: Daemon, tmp_path: Path, docker_config: Path, canary: str
) -> Iterator[Bench]:
    yield from _bench(daemon, request.param, tmp_path, docker_config, canary)


@pytest.fixture
def bench(daemon: Daemon, tmp_path: Path, docker_config: Path, canary: str) -> Iterator[Bench]:
    """An anonymous registry: the receipt logic does not depend on the auth."""
    yield from _bench(daemon, "anonymous", tmp_path, docker_config, canary)


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


# -- the receipt gate ----------------------------------------------------------------------------------


def test_a_fail_receipt_leaves_the_verified_tag_where_it_was(bench: Bench) -> None:
    good, bad = bench.version("good"), bench.version("bad")
    first = bench.publish(good, bench.receipt(good))
    assert first.returncode == 0, first.stderr[-3000:]
    verified = bench.tags()[f"{CELL}-verified"]

    second = bench.publish(bad, bench.receipt(bad, passed=False))
    assert second.returncode == 1, second.stderr[-3000:]
    result = second.json()
    assert result["receipt_status"] == "FAIL" and result["moved_tags"] == []
    tags = bench.tags()
    assert tags[f"{CELL}-verified"] == tags[CELL] == verified != result["digest"]
    assert referrers_tag(result["manifest_digest"]) in tags  # the failing receipt is there to read, by digest


def test_a_publish_killed_between_push_and_tag_leaves_no_verified_tag(bench: Bench) -> None:
    version = bench.version("killed")
    receipt = bench.receipt(version)
    argv = [sys.executable, "-m", "pipeline", "publish", CELL, "--matrix", str(version.matrix), "--images",
            str(IMAGES), "--receipt", str(receipt), "--registry", bench.registry.address]  # fmt: skip
    env = {**os.environ, **bench.daemon.env, **bench.env(), "STACKPROOF_TEST_HANG_AT": "before-tag"}
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 300
        for line in proc.stderr:  # the image and its receipt are pushed, the tags not yet moved
            if "holding at before-tag" in line:
                break
            assert time.monotonic() < deadline, "publish never reached the tagging step"
        else:
            raise AssertionError(f"publish ended before the tagging step: {proc.wait()}")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    tags = bench.tags()
    assert f"{CELL}-verified" not in tags and CELL not in tags
    assert any(tag.startswith("sha256-") for tag in tags)  # it got as far as the receipt
    refused = bench.pull()
    assert refused.returncode == 1 and "does not exist" in refused.stderr


def test_pull_refuses_missing_failing_or_foreign_receipts(bench: Bench, tmp_path: Path) -> None:
    good, bad = bench.version("good"), bench.version("bad")
    assert bench.publish(good, bench.receipt(good)).returncode == 0
    failing = bench.publish(bad, bench.receipt(bad, passed=False))
    bad_digest = failing.json()["manifest_digest"]
    tags = bench.tags()
    good_digest = tags[f"{CELL}-verified"]
    with bench.client() as client:
        bad_manifest = client.manifest(REPO_NAME, bad_digest)
        good_index = client.manifest(REPO_NAME, referrers_tag(good_digest), accept=(OCI_INDEX,))
        assert bad_manifest is not None and good_index is not None

        # 1. The verified tag moved (by hand) to an image whose receipt is FAIL.
        client.put_manifest(REPO_NAME, f"{CELL}-verified", bad_manifest.body, bad_manifest.media_type)
        refused = bench.pull()
        assert refused.returncode == 1 and "it is FAIL" in refused.stderr, refused.stderr[-2000:]

        # 2. ... to an image whose referrers list holds the good image's receipt (subject: another digest).
        client.put_manifest(REPO_NAME, referrers_tag(bad_digest), good_index.body, OCI_INDEX)
        refused = bench.pull()
        assert refused.returncode == 1 and f"not {bad_digest}" in refused.stderr, refused.stderr[-2000:]

    # 3. A third image pushed straight to the verified tag, with no receipt at all.
    third = bench.version("third")
    alias = f"{bench.registry.address}/{REPO_NAME}:{CELL}-verified"
    bench.daemon.docker("tag", third.tag, alias)
    try:
        bench.daemon.docker("push", alias)
    finally:
        bench.daemon.docker("rmi", alias, check=False)
    refused = bench.pull()
    assert refused.returncode == 1 and "no receipt attached" in refused.stderr, refused.stderr[-2000:]
    assert bench.pulled_id() is None, "nothing may be pulled and tagged on a refusal"


def test_two_hosts_receipts_side_by_side_and_require_same_gpu_chooses(bench: Bench) -> None:
    """Receipts of one digest from two hosts are both kept; pull takes this host's; --require-same-gpu
    refuses when only another host's is there."""
    version = bench.version("two-hosts")
    elsewhere = bench.publish(version, bench.receipt(version, host=ELSEWHERE))
    assert elsewhere.returncode == 0, elsewhere.stderr[-3000:]
    digest = elsewhere.json()["manifest_digest"]
    here = host_fingerprint(bench.daemon.docker("version", "--format", "{{.Server.Version}}").strip())

    strict = bench.pull("--require-same-gpu")
    assert strict.returncode == 1
    assert f"verified on {ELSEWHERE.describe()}, you have {here.describe()}" in strict.stderr
    assert bench.pulled_id() is None, "nothing pulled under --require-same-gpu"
    relaxed = bench.pull("--json")
    assert relaxed.returncode == 0 and "warning:" in relaxed.stderr and relaxed.json()["host_differences"]
    bench.daemon.docker("rmi", f"stackproof/{CELL}:verified")

    local = bench.publish(version, bench.receipt(version))
    assert local.returncode == 0, local.stderr[-3000:]
    assert "(2 receipt(s))" in local.json()["referrers"]
    with bench.client() as client:
        index = client.manifest(REPO_NAME, referrers_tag(digest), accept=(OCI_INDEX,))
        assert index is not None
        hosts = {d["annotations"]["io.stackproof.host-key"] for d in index.json["manifests"]}
    assert hosts == {ELSEWHERE.key, here.key}  # both kept
    chosen = bench.pull("--require-same-gpu", "--json")
    assert chosen.returncode == 0, chosen.stderr[-2000:]
    assert chosen.json()["receipts_found"] == 2 and chosen.json()["host_differences"] == []
    assert chosen.json()["receipt_digest"] == local.json()["receipt_digest"]


def test_pull_resolves_an_image_index_to_this_platform(bench: Bench) -> None:
    version = bench.version("index")
    published = bench.publish(version, bench.receipt(version))
    assert published.returncode == 0, published.stderr[-3000:]
    result = published.json()
    with bench.client() as client:
        manifest = client.manifest(REPO_NAME, result["manifest_digest"])
        assert manifest is not None
        # Entries the registry holds (it checks): the receipt artifact stands in for the others.
        other = client.manifest(REPO_NAME, result["receipt_digest"])
        assert other is not None
        attestation = {"mediaType": OCI_MANIFEST, "digest": other.digest, "size": len(other.body),
                       "platform": {"os": "unknown", "architecture": "unknown"},
                       "annotations": {"vnd.docker.reference.type": "attestation-manifest"}}  # fmt: skip
        arm = {"mediaType": OCI_MANIFEST, "digest": other.digest, "size": len(other.body),
               "platform": {"os": "linux", "architecture": "arm64"}}  # fmt: skip
        amd = {"mediaType": manifest.media_type, "digest": manifest.digest, "size": len(manifest.body),
               "platform": {"os": "linux", "architecture": "amd64"}}  # fmt: skip
        index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [attestation, arm, amd]}
        client.put_manifest(REPO_NAME, f"{CELL}-verified", json.dumps(index).encode(), OCI_INDEX)
    pulled = bench.pull("--json", "--platform", "linux/amd64")
    assert pulled.returncode == 0, pulled.stderr[-3000:]
    assert pulled.json()["digest"] == result["manifest_digest"]
    other = bench.pull("--platform", "linux/s390x")
    assert other.returncode == 1 and "has no linux/s390x image" in other.stderr


def test_a_buildx_image_with_attestations_on_the_containerd_store(bench: Bench) -> None:
    """buildx on Docker 26 loads an image index (the image + a provenance attestation) into the
    containerd store, whose `.Id` is then the index digest: publish pushes the index, binds the receipt
    to the linux/amd64 manifest in it, and pull takes that manifest."""
    if bench.daemon.store != "containerd":
        pytest.skip("an image index in the local store needs the containerd image store")
    version = bench.version("buildx")
    context = _mkdir(bench.tmp / "buildx")
    (context / "hello.txt").write_text("built by buildx\n")
    (context / "Dockerfile").write_text("FROM scratch\nCOPY hello.txt /hello.txt\n")
    bench.daemon.docker("rmi", version.tag)
    bench.daemon.docker(
        "buildx", "build", "--load", "--platform", "linux/amd64", "--provenance=mode=min", "--tag", version.tag,
        str(context), env=bench.env(),
    )  # fmt: skip
    version.image_id = str(bench.daemon.image_id(version.tag))
    published = bench.publish(version, bench.receipt(version))
    assert published.returncode == 0, published.stderr[-3000:]
    result = published.json()
    assert result["digest"] == version.image_id != result["manifest_digest"]  # an index, resolved
    with bench.client() as client:
        top = client.manifest(REPO_NAME, result["digest"])
        assert top is not None and top.is_index
    bench.daemon.docker("rmi", version.tag)
    pulled = bench.pull("--json")
    assert pulled.returncode == 0, pulled.stderr[-3000:]
    assert pulled.json()["digest"] == result["manifest_digest"] == bench.pulled_id()


def test_pull_still_reads_a_receipt_tag_of_stackproof_0_1(bench: Bench) -> None:
    """Images published before the referrers layout carry one receipt at `sha256-<hex>.receipt`."""
    version = bench.version("legacy")
    published = bench.publish(version, bench.receipt(version))
    assert published.returncode == 0, published.stderr[-3000:]
    digest = published.json()["manifest_digest"]
    with bench.client() as client:
        artifact = client.manifest(REPO_NAME, published.json()["receipt_digest"])
        assert artifact is not None
        client.put_manifest(REPO_NAME, legacy_receipt_tag(digest), artifact.body, OCI_MANIFEST)
        empty = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}
        client.put_manifest(REPO_NAME, referrers_tag(digest), json.dumps(empty).encode(), OCI_INDEX)
    pulled = bench.pull("--json")
    assert pulled.returncode == 0, pulled.stderr[-3000:]
    assert pulled.json()["receipts_found"] == 1


# -- publish hardening (regression: `publish --image ANY --receipt EDITED` used to be accepted) ---------


def test_publish_refuses_another_image_and_edited_receipts(bench: Bench) -> None:
    version, other = bench.version("own"), bench.version("other")
    receipt = bench.receipt(version)
    base = ["publish", CELL, "--matrix", str(version.matrix), "--images", str(IMAGES), "--registry",
            bench.registry.address]  # fmt: skip

    # Another image under the cell's name, with a receipt made for that image: refused.
    foreign = bench.receipt(other)
    edited = json.loads(foreign.read_text())
    edited["matrix_digest"] = version.digest
    foreign.write_text(json.dumps(edited))
    refused = bench.run([*base, "--image", other.tag, "--receipt", str(foreign)])
    assert refused.returncode == 2 and "not the cell's own image" in refused.stderr, refused.stderr[-2000:]

    def edit(change: dict[str, object], stage_status: str | None = None, *, with_check: bool = False) -> Path:
        """The receipt edited, in a directory of its own beside the run's renderings (copied)."""
        doc = json.loads(receipt.read_text())
        doc.update(change)
        if stage_status:
            doc["stages"][1]["status"] = stage_status
        if stage_status and with_check:  # the stage re-judged consistently: only its run's summary says otherwise
            doc["stages"][1]["checks"][0]["status"] = stage_status
        path = receipt.parent.parent / f"edited-{secrets.token_hex(3)}" / "receipt.json"
        path.parent.mkdir()
        path.write_text(json.dumps(doc))
        for rendering in ("junit.xml", "summary.md"):
            (path.parent / rendering).write_text((receipt.parent / rendering).read_text())
        return path

    failing = bench.receipt(version, passed=False)
    promoted = json.loads(failing.read_text()) | {"status": "PASS"}
    failing.write_text(json.dumps(promoted))
    cases = {
        "a FAIL receipt edited to PASS": (failing, "PASS, but stages imports FAIL"),
        "another matrix": (edit({"matrix_digest": "sha256:" + "0" * 64}), "not this matrix.yaml"),
        "a stage edited": (edit({}, stage_status="SKIP"), "its checks say PASS"),
        "a stage and its check edited": (edit({}, "WARN", with_check=True), "not those its run recorded in summary.md"),
        "not beside its run's files": (edit({}), "no junit.xml or summary.md beside it"),
        "another cell": (edit({"cell": "cpu-tiny"}), "not 'pub-tiny'"),
    }
    for rendering in ("junit.xml", "summary.md"):
        (cases["not beside its run's files"][0].parent / rendering).unlink()
    for name, (path, expected) in cases.items():
        result = bench.run([*base, "--receipt", str(path)])
        assert result.returncode == 2, f"{name}: {result.stderr[-2000:]}"
        assert "refusing to publish" in result.stderr and "Traceback" not in result.stderr, name
        assert expected is None or expected in result.stderr, f"{name}: {result.stderr[-2000:]}"
    assert bench.tags() == {}, "nothing may reach the registry"
    ok = bench.run([*base, "--image", version.tag, "--receipt", str(receipt)])
    assert ok.returncode == 0, ok.stderr[-2000:]


# -- signed receipts -------------------------------------------------------------------------------------


def test_signed_receipts_valid_tampered_and_wrong_key(bench: Bench, tmp_path: Path) -> None:
    def keypair(name: str) -> tuple[Path, Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        private, public = tmp_path / f"{name}.key", tmp_path / f"{name}.pub"
        private.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        public.write_bytes(
            key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )
        return private, public

    (signing, public), (_, stranger) = keypair("publisher"), keypair("stranger")
    version = bench.version("signed")
    published = bench.publish(version, bench.receipt(version), extra=("--sign-key", str(signing)))
    assert published.returncode == 0 and published.json()["signed"], published.stderr[-3000:]

    valid = bench.pull("--require-signature", "--key", str(public), "--json")
    assert valid.returncode == 0, valid.stderr[-2000:]
    assert valid.json()["signature"].startswith("verified")
    bench.daemon.docker("rmi", f"stackproof/{CELL}:verified")

    wrong = bench.pull("--require-signature", "--key", str(stranger))
    assert wrong.returncode == 1 and "no signature in it verifies" in wrong.stderr, wrong.stderr[-2000:]
    no_key = bench.pull("--require-signature")
    assert no_key.returncode == 2 and "--key" in no_key.stderr

    # Tamper with the predicate's twin: the receipt layer says something the signature does not.
    artifact_digest = published.json()["receipt_digest"]
    with bench.client() as client:
        artifact = client.manifest(REPO_NAME, artifact_digest)
        assert artifact is not None
        doc = artifact.json
        layer = next(la for la in doc["layers"] if la["mediaType"] == RECEIPT_MEDIA_TYPE)
        receipt = json.loads(client.get_blob(REPO_NAME, layer["digest"]))
        receipt["host"]["summary"] = "an H200 (edited)"
        body = json.dumps(receipt).encode()
        layer.update(digest=client.put_blob(REPO_NAME, body), size=len(body))
        forged = json.dumps(doc).encode()
        from pipeline.registry.oci import sha256_digest

        client.put_manifest(REPO_NAME, sha256_digest(forged), forged, OCI_MANIFEST)
        index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
            {"mediaType": OCI_MANIFEST, "digest": sha256_digest(forged), "size": len(forged),
             "artifactType": RECEIPT_MEDIA_TYPE}]}  # fmt: skip
        client.put_manifest(
            REPO_NAME, referrers_tag(published.json()["manifest_digest"]), json.dumps(index).encode(), OCI_INDEX
        )
    tampered = bench.pull("--require-signature", "--key", str(public))
    assert tampered.returncode == 1 and "tampered" in tampered.stderr, tampered.stderr[-2000:]
    assert bench.pulled_id() is None


def test_the_matrix_site_from_the_registry_shows_the_published_receipt(bench: Bench) -> None:
    """`stackproof report --registry`: the receipt publish attached is the site's square, read back
    through the same client, credentials and referrers; a receipt alone says its series are missing."""
    version = bench.version("site")
    receipt = bench.receipt(version)
    published = bench.publish(version, receipt)
    assert published.returncode == 0, published.stderr[-3000:]
    site = bench.tmp / "site"
    args = ["report", "--registry", bench.registry.address, "--out", str(site), "--json"]
    done = bench.run(args, login=bool(bench.registry.password))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.json()["receipts"] == 1
    index = json.loads((site / "index.json").read_text())
    [square] = [s for s in index["squares"] if s["cell"] == CELL]
    assert square["status"] == "PASS" and square["origin"] == "registry"
    assert square["image_id"] == json.loads(receipt.read_text())["image"]["id"]
    assert "not available" in (site / "cells" / f"{CELL}.html").read_text()
    bench.assert_no_secret()
