"""The publish bench of the registry group: a daemon, a real registry and a DOCKER_CONFIG, with the
test cell's images and receipts, shared by test_publish.py, test_publish_receipts.py,
test_publish_hostile.py and test_pull_keyless.py.

Small imported images stand in for a cell's image: they are tagged as the content tag of a small
test cell (`pub-tiny`, a copy of the real matrix plus that cell), which is what publish accepts;
the receipts are made by the real receipt code from verify reports of those images, written into
run directories as a run writes them (receipt.json, junit.xml, summary.md). The registry password
is a canary: `Bench.assert_no_secret` checks that no output, stored blob or written file holds it.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pipeline.build.plan import plan_cell
from pipeline.host.geometry import HostFingerprint, host_fingerprint
from pipeline.matrix.model import STAGES
from pipeline.matrix.read import load_matrix
from pipeline.matrix.site import load_site
from pipeline.receiptrender import write_all
from pipeline.registry.oci import TRUSTED_REALMS_ENV, Credentials, RegistryClient
from pipeline.result import CheckResult, Outcome, StageResult, Status, VerifyReport
from tests.integration.conftest import IMAGES, Daemon, write_matrix
from tests.integration.registries import USER, Registry, TokenIssuer, start_registry
from verify.stages.receipt import build_receipt

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
