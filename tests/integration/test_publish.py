"""Verified publish and pull through a real registry (Debian's docker-registry on 127.0.0.1).

Small imported images stand in for cell images here (the receipt gate does not depend on what is
inside); the receipts are made by the real receipt code from verify reports of those images.
The cpu-tiny end-to-end test makes a real receipt from a real run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from pipeline.engine import Engine
from pipeline.host import HostFingerprint, host_fingerprint
from pipeline.model import STAGES
from pipeline.publish import receipt_tag
from pipeline.registry import RegistryClient
from tests.integration.conftest import REPO, docker, stackproof
from verify.receipt import build_receipt, write_all
from verify.result import CheckResult, Outcome, StageResult, Status, VerifyReport

pytestmark = pytest.mark.integration

CELL = "cpu-tiny"
REPO_NAME = "stackproof"


def _receipt(engine: Engine, image: str, out: Path, *, passed: bool, host: HostFingerprint | None = None) -> Path:
    info = engine.image(image)
    assert info is not None
    status = Status.PASS if passed else Status.FAIL
    stages = tuple(
        StageResult.of(stage, [CheckResult(name=stage, status=status, message=f"{stage}: {status}")], 1.0)
        for stage in STAGES
    )
    report = VerifyReport(
        cell=CELL,
        arm=None,
        image=image,
        image_id=info.id,
        stages=stages,
        outcome=Outcome(passed=passed, summary="all stages passed" if passed else "startup FAIL"),
    )
    receipt = build_receipt(
        report,
        matrix_digest="sha256:" + "0" * 64,
        host=host or host_fingerprint(engine.cli.path),
        started_at=time.time() - 1,
        finished_at=time.time(),
    )
    return write_all(receipt, out)["receipt"]


def _publish_argv(image: str, receipt: Path, registry: str) -> list[str]:
    publish = ["publish", CELL, "--registry", registry, "--image", image, "--receipt", str(receipt)]
    return [sys.executable, "-m", "pipeline", *publish]


def _publish(image: str, receipt: Path, registry: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_publish_argv(image, receipt, registry), "--json"], cwd=REPO, capture_output=True, text=True, timeout=600
    )


def _tags(registry: str) -> dict[str, str]:
    """Tag -> manifest digest, read back from the registry's API."""
    with RegistryClient(registry) as client:
        listed = client.client.get(f"/v2/{REPO_NAME}/tags/list").json().get("tags") or []
        return {tag: m.digest for tag in listed if (m := client.manifest(REPO_NAME, tag)) is not None}


def test_publish_pass_then_pull_by_digest(
    engine: Engine, tiny_images: tuple[str, str], registry: str, tmp_path: Path
) -> None:
    image, _ = tiny_images
    published = _publish(image, _receipt(engine, image, tmp_path, passed=True), registry)
    assert published.returncode == 0, published.stderr[-3000:]
    result = json.loads(published.stdout)
    digest = result["digest"]
    tags = _tags(registry)
    assert tags[f"{CELL}-verified"] == tags[CELL] == digest
    assert receipt_tag(digest) in tags and result["moved_tags"] == [f"{CELL}-verified", CELL]
    # publish removed its registry-qualified alias again
    assert not [r for r in docker("images", "--format", "{{.Repository}}").split() if r.startswith(registry)]

    pulled = stackproof(["pull", CELL, "--registry", registry, "--json"])
    assert pulled.returncode == 0, pulled.stderr[-3000:]
    document = pulled.json()
    assert document["digest"] == digest and document["host_differences"] == []
    local = engine.image(f"stackproof/{CELL}:verified")
    original = engine.image(image)
    assert local is not None and original is not None and local.id == original.id
    docker("rmi", f"stackproof/{CELL}:verified")


def test_a_fail_receipt_leaves_the_verified_tag_where_it_was(
    engine: Engine, tiny_images: tuple[str, str], registry: str, tmp_path: Path
) -> None:
    good, bad = tiny_images
    first = _publish(good, _receipt(engine, good, tmp_path / "good", passed=True), registry)
    assert first.returncode == 0, first.stderr[-3000:]
    verified = _tags(registry)[f"{CELL}-verified"]

    second = _publish(bad, _receipt(engine, bad, tmp_path / "bad", passed=False), registry)
    assert second.returncode == 1, second.stderr[-3000:]
    result = json.loads(second.stdout)
    assert result["receipt_status"] == "FAIL" and result["moved_tags"] == []
    tags = _tags(registry)
    assert tags[f"{CELL}-verified"] == tags[CELL] == verified != result["digest"]
    assert receipt_tag(result["digest"]) in tags  # the failing receipt is there to read, by digest


def test_a_publish_killed_between_push_and_tag_leaves_no_verified_tag(
    engine: Engine, tiny_images: tuple[str, str], registry: str, tmp_path: Path
) -> None:
    image, _ = tiny_images
    receipt = _receipt(engine, image, tmp_path, passed=True)
    proc = subprocess.Popen(
        _publish_argv(image, receipt, registry),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "STACKPROOF_TEST_HANG_AT": "before-tag"},
    )
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
    tags = _tags(registry)
    assert f"{CELL}-verified" not in tags and CELL not in tags
    assert any(tag.endswith(".receipt") for tag in tags)  # it got as far as the receipt
    refused = stackproof(["pull", CELL, "--registry", registry])
    assert refused.returncode == 1 and "does not exist" in refused.stderr


def test_pull_refuses_missing_failing_or_foreign_receipts(
    engine: Engine, tiny_images: tuple[str, str], registry: str, tmp_path: Path
) -> None:
    good, bad = tiny_images
    assert _publish(good, _receipt(engine, good, tmp_path / "good", passed=True), registry).returncode == 0
    failing = _publish(bad, _receipt(engine, bad, tmp_path / "bad", passed=False), registry)
    bad_digest = json.loads(failing.stdout)["digest"]
    tags = _tags(registry)
    good_digest = tags[f"{CELL}-verified"]
    with RegistryClient(registry) as client:
        bad_manifest = client.manifest(REPO_NAME, bad_digest)
        good_receipt = client.manifest(REPO_NAME, receipt_tag(good_digest))
        assert bad_manifest is not None and good_receipt is not None

        # 1. The verified tag moved (by hand) to an image whose receipt is FAIL.
        client.put_manifest(REPO_NAME, f"{CELL}-verified", bad_manifest.body, bad_manifest.media_type)
        refused = stackproof(["pull", CELL, "--registry", registry])
        assert refused.returncode == 1 and "is FAIL" in refused.stderr, refused.stderr[-2000:]

        # 2. ... to an image with a receipt that names another digest (the good image's receipt).
        client.put_manifest(REPO_NAME, receipt_tag(bad_digest), good_receipt.body, good_receipt.media_type)
        refused = stackproof(["pull", CELL, "--registry", registry])
        assert refused.returncode == 1 and f"not {bad_digest}" in refused.stderr, refused.stderr[-2000:]

    # 3. A third image pushed straight to the verified tag, with no receipt at all.
    (tmp_path / "c.txt").write_text("no receipt\n")
    with tarfile.open(tmp_path / "c.tar", "w") as tar:
        tar.add(tmp_path / "c.txt", arcname="c.txt")
    third = f"stackproof-test/tiny:c-{os.getpid()}"
    alias = f"{registry}/{REPO_NAME}:{CELL}-verified"
    docker("import", str(tmp_path / "c.tar"), third)
    try:
        docker("tag", third, alias)
        docker("push", alias)
    finally:
        docker("rmi", alias, check=False)
        docker("rmi", third, check=False)
    refused = stackproof(["pull", CELL, "--registry", registry])
    assert refused.returncode == 1 and "no receipt attached" in refused.stderr, refused.stderr[-2000:]
    assert engine.image(f"stackproof/{CELL}:verified") is None, "nothing may be pulled and tagged on a refusal"


def test_pull_warns_about_another_host_and_refuses_with_require_same_gpu(
    engine: Engine, tiny_images: tuple[str, str], registry: str, tmp_path: Path
) -> None:
    image, _ = tiny_images
    here = host_fingerprint(engine.cli.path)
    elsewhere = HostFingerprint(
        arch="aarch64",
        kernel="6.8.0",
        os="Ubuntu 24.04",
        docker="28.0.0",
        gpus=({"name": "NVIDIA GB10", "compute_capability": "12.1", "memory": "128 GiB"},),
        driver="580.95.05",
        cuda_driver="13.0",
    )
    assert _publish(image, _receipt(engine, image, tmp_path, passed=True, host=elsewhere), registry).returncode == 0
    strict = stackproof(["pull", CELL, "--registry", registry, "--require-same-gpu"])
    assert strict.returncode == 1
    assert f"verified on {elsewhere.describe()}, you have {here.describe()}" in strict.stderr
    assert engine.image(f"stackproof/{CELL}:verified") is None, "nothing pulled under --require-same-gpu"

    relaxed = stackproof(["pull", CELL, "--registry", registry, "--json"])
    assert relaxed.returncode == 0, relaxed.stderr[-2000:]
    assert "warning:" in relaxed.stderr and relaxed.json()["host_differences"]
    docker("rmi", f"stackproof/{CELL}:verified")
