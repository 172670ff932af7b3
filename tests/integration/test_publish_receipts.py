"""The receipt gate, through a real registry on both Dockers: what publish refuses to move the
verified tag for, and what pull refuses to take.

A FAIL receipt, a publish killed between push and tag, a verified tag moved to an image with a
failing, foreign or missing receipt, receipts of two hosts side by side, an image index resolved to
this platform, a buildx image with attestations, a receipt tag of stackproof 0.1, edited receipts
and another image, signed receipts (valid, tampered, wrong key), and the matrix site read back from
the registry. Each runs on an anonymous registry (the receipt logic does not depend on the auth:
test_publish.py covers the auth); the bench is publish_bench.py.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from pipeline.host.geometry import host_fingerprint
from pipeline.registry.oci import OCI_INDEX, OCI_MANIFEST
from pipeline.registry.publish import RECEIPT_MEDIA_TYPE, legacy_receipt_tag, referrers_tag
from tests.integration.conftest import IMAGES, REPO, Daemon
from tests.integration.publish_bench import CELL, ELSEWHERE, REPO_NAME, Bench, _bench, _mkdir

pytestmark = pytest.mark.integration


@pytest.fixture
def bench(daemon: Daemon, tmp_path: Path, docker_config: Path, canary: str) -> Iterator[Bench]:
    """An anonymous registry: the receipt logic does not depend on the auth."""
    yield from _bench(daemon, "anonymous", tmp_path, docker_config, canary)


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
