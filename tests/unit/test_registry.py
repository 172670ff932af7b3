"""The registry client's auth (challenges, tokens, credentials), the publish gate and signed receipts,
without a registry: an httpx.MockTransport plays the registry and its token service. The real
registries (anonymous, Basic, token) are in tests/integration/test_publish.py."""

from __future__ import annotations

import base64
import json
import shutil
import stat
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from pipeline.docker.client import _docker_config
from pipeline.errors import InfraError, InputError
from pipeline.receipt import Receipt, receipt_problems
from pipeline.receiptrender import render_markdown, write_all
from pipeline.registry import attest
from pipeline.registry.oci import Credentials, RegistryClient, find_credentials, parse_challenge, platform_manifest
from pipeline.registry.publish import publish, publishable_problems
from pipeline.registry.rundir import RENDERINGS, RunDir, run_problems
from pipeline.result import Status
from tests.unit.test_receipt import CPU, _report
from verify.stages.receipt import build_receipt

CANARY = "CANARY-s3cret-pw"
HOST = "127.0.0.1:5000"
DIGEST = "sha256:" + "ab" * 32
RUN_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures/receipts/cpu-tiny-pass/cpu-tiny/run-20261201T181931"


# -- challenges and credentials ----------------------------------------------------------------------


def test_parse_challenge() -> None:
    bearer = parse_challenge(
        'Bearer realm="http://127.0.0.1:1/token",service="reg",scope="repository:a/b:pull,push",error="insufficient_scope"'
    )
    assert bearer is not None and bearer.scheme == "bearer"
    assert bearer.get("realm") == "http://127.0.0.1:1/token" and bearer.get("scope") == "repository:a/b:pull,push"
    basic = parse_challenge('Basic realm="Registry Realm"')
    assert basic is not None and basic.scheme == "basic" and basic.get("realm") == "Registry Realm"
    assert parse_challenge("Negotiate abc") is None and parse_challenge("") is None


def _config(tmp_path: Path, doc: dict[str, Any]) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(doc))
    return tmp_path


def test_credentials_from_env_and_password_stdin(tmp_path: Path) -> None:
    env = {"STACKPROOF_REGISTRY_USER": "u", "HOME": str(tmp_path)}
    found = find_credentials(HOST, env=env, password=CANARY)
    assert found is not None and (found.username, found.secret) == ("u", CANARY)
    assert CANARY not in repr(found) and CANARY not in found.source
    assert find_credentials(HOST, env={**env, "STACKPROOF_REGISTRY_PASSWORD": "p"}) is not None
    with pytest.raises(InputError, match="set STACKPROOF_REGISTRY_USER"):
        find_credentials(HOST, env={"HOME": str(tmp_path)}, password=CANARY)
    assert find_credentials(HOST, env={"HOME": str(tmp_path)}) is None  # nothing anywhere: anonymous


def test_credentials_from_docker_config(tmp_path: Path) -> None:
    auth = base64.b64encode(f"alice:{CANARY}".encode()).decode()
    config = _config(tmp_path, {"auths": {HOST: {"auth": auth}, "other:1": {"auth": "eDp5"}}})
    found = find_credentials(HOST, env={"DOCKER_CONFIG": str(config)})
    assert found is not None and (found.username, found.secret) == ("alice", CANARY) and "auths" in found.source
    token = _config(tmp_path, {"auths": {f"https://{HOST}": {"identitytoken": "refresh-me"}}})
    found = find_credentials(HOST, env={"DOCKER_CONFIG": str(token)})
    assert found is not None and found.identity_token and found.secret == "refresh-me"
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(InputError, match="does not read as JSON"):
        find_credentials(HOST, env={"DOCKER_CONFIG": str(tmp_path)})


def test_credentials_from_helpers_in_docker_order(tmp_path: Path) -> None:
    asked: list[tuple[str, str]] = []

    def helper(name: str, host: str) -> str | None:
        asked.append((name, host))
        if name == "per-host":
            return json.dumps({"Username": "bob", "Secret": CANARY})
        return None

    config = _config(tmp_path, {"credHelpers": {HOST: "per-host"}, "credsStore": "store"})
    found = find_credentials(HOST, env={"DOCKER_CONFIG": str(config)}, helper=helper)
    assert found is not None and found.username == "bob" and found.source == "docker-credential-per-host"
    assert asked == [("per-host", HOST)]
    # The store has nothing for this host: docker's config `auths` is next.
    auth = base64.b64encode(b"carol:pw").decode()
    config = _config(tmp_path, {"credsStore": "store", "auths": {HOST: {"auth": auth}}})
    found = find_credentials(HOST, env={"DOCKER_CONFIG": str(config)}, helper=helper)
    assert found is not None and found.username == "carol"
    with pytest.raises(InfraError, match="not the JSON"):
        find_credentials(HOST, env={"DOCKER_CONFIG": str(config)}, helper=lambda n, h: "oops")


# -- the token flow ------------------------------------------------------------------------------------


class FakeRegistry:
    """A registry wanting a Bearer token of the right scope, and its token service."""

    def __init__(self, *, users: dict[str, str], basic: bool = False, realm: str = f"http://{HOST}/token") -> None:
        self.users, self.basic, self.realm = users, basic, realm
        self.token_calls: list[dict[str, Any]] = []
        self.valid: dict[str, set[str]] = {}  # token -> actions it grants
        self.seen_auth: list[str] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/token":
            return self.token(request)
        header = request.headers.get("Authorization", "")
        self.seen_auth.append(header)
        need = {"pull"} if request.method in ("GET", "HEAD") else {"pull", "push"}
        if self.basic:
            if header != "Basic " + base64.b64encode(f"u:{self.users['u']}".encode()).decode():
                return httpx.Response(401, headers={"WWW-Authenticate": 'Basic realm="r"'})
            return httpx.Response(200, json={})
        granted = self.valid.get(header.removeprefix("Bearer "), set())
        if not header.startswith("Bearer ") or not need <= granted:
            scope = "repository:stackproof:" + ",".join(sorted(need, reverse=True))
            challenge = f'Bearer realm="{self.realm}",service="svc",scope="{scope}"'
            return httpx.Response(401, headers={"WWW-Authenticate": challenge})
        return httpx.Response(200, json={}, headers={"Content-Type": "application/json"})

    def token(self, request: httpx.Request) -> httpx.Response:
        header = request.headers.get("Authorization", "")
        user = None
        if header:
            user, _, password = base64.b64decode(header.removeprefix("Basic ")).decode().partition(":")
            if self.users.get(user) != password:
                return httpx.Response(401)
        scope = request.url.params.get("scope", "")
        self.token_calls.append({"user": user, "scope": scope})
        actions = set(scope.rpartition(":")[2].split(",")) if scope else set()
        token = f"t{len(self.token_calls)}"
        self.valid[token] = actions if user else actions & {"pull"}
        return httpx.Response(200, json={"token": token, "expires_in": 300})


def _client(fake: FakeRegistry, credentials: Credentials | None) -> RegistryClient:
    return RegistryClient(HOST, credentials=credentials, transport=httpx.MockTransport(fake.handler))


def test_bearer_challenge_token_reuse_and_scope_change() -> None:
    fake = FakeRegistry(users={"u": CANARY})
    creds = Credentials(username="u", secret=CANARY, source="test")
    with _client(fake, creds) as client:
        assert client._request("GET", "/v2/stackproof/manifests/a").status_code == 200
        assert client._request("GET", "/v2/stackproof/manifests/b").status_code == 200  # the same token
        assert [c["scope"] for c in fake.token_calls] == ["repository:stackproof:pull"]
        assert client._request("POST", "/v2/stackproof/blobs/uploads/").status_code == 200  # push: a new token
        assert client._request("GET", "/v2/stackproof/manifests/c").status_code == 200  # served by the push token
        assert [c["scope"] for c in fake.token_calls] == [
            "repository:stackproof:pull",
            "repository:stackproof:push,pull",
        ]
        assert all(c["user"] == "u" for c in fake.token_calls)
    assert not any(CANARY in h for h in fake.seen_auth)  # the registry sees tokens, never the password


def test_anonymous_token_and_refused_push_say_what_to_do() -> None:
    fake = FakeRegistry(users={"u": CANARY})
    with _client(fake, None) as client:
        assert client._request("GET", "/v2/stackproof/manifests/a").status_code == 200
        assert fake.token_calls == [{"user": None, "scope": "repository:stackproof:pull"}]
        with pytest.raises(InfraError, match="refused anonymous access") as refused:
            client._request("POST", "/v2/stackproof/blobs/uploads/")
    assert refused.value.exit_code == 3 and "STACKPROOF_REGISTRY_USER" in str(refused.value)
    wrong = Credentials(username="u", secret="not-" + CANARY, source="docker config")
    with _client(fake, wrong) as client, pytest.raises(InfraError, match="token service refused") as bad:
        client._request("GET", "/v2/")
    assert CANARY not in str(bad.value)


def test_credentials_go_only_to_a_token_service_of_the_same_origin() -> None:
    """Before: the Basic credentials went to whatever realm the registry named (another host or port)."""
    for realm in ("http://127.0.0.1:9/token", "http://evil.example:5000/token", "https://127.0.0.1:5000/token"):
        fake = FakeRegistry(users={"u": CANARY}, realm=realm)
        sent: list[str] = []

        def handler(request: httpx.Request, fake: FakeRegistry = fake, sent: list[str] = sent) -> httpx.Response:
            if request.url.path == "/token":
                sent.append(request.headers.get("Authorization", ""))
            return fake.handler(request)

        creds = Credentials(username="u", secret=CANARY, source="test")
        with RegistryClient(HOST, credentials=creds, transport=httpx.MockTransport(handler)) as client:
            assert client._request("GET", "/v2/stackproof/manifests/a").status_code == 200  # an anonymous pull token
            with pytest.raises(InfraError, match=r"not sent to .* another origin") as refused:
                client._request("POST", "/v2/stackproof/blobs/uploads/")
        assert sent and not any(sent), f"credentials sent to {realm}"
        assert "STACKPROOF_REGISTRY_TOKEN_ORIGINS" in str(refused.value)
    # Named by the user's config: that origin gets them.
    fake = FakeRegistry(users={"u": CANARY}, realm="http://127.0.0.1:9/token")
    creds = Credentials(username="u", secret=CANARY, source="test")
    transport = httpx.MockTransport(fake.handler)
    with RegistryClient(HOST, credentials=creds, transport=transport, trusted_realms=("http://127.0.0.1:9",)) as c:
        assert c._request("POST", "/v2/stackproof/blobs/uploads/").status_code == 200
    assert fake.token_calls[-1]["user"] == "u"


def test_basic_challenge() -> None:
    fake = FakeRegistry(users={"u": CANARY}, basic=True)
    with _client(fake, Credentials(username="u", secret=CANARY, source="t")) as client:
        assert client._request("GET", "/v2/").status_code == 200
    with _client(fake, None) as client, pytest.raises(InfraError, match="wants credentials"):
        client._request("GET", "/v2/")
    with (
        _client(fake, Credentials(username="u", secret="bad", source="t")) as client,
        pytest.raises(InfraError, match="refused"),
    ):
        client._request("GET", "/v2/")


def test_unreachable_registry_is_infrastructure() -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    with RegistryClient(HOST, transport=httpx.MockTransport(down)) as client, pytest.raises(InfraError) as exc:
        client.check()
    assert exc.value.exit_code == 3 and "unreachable" in str(exc.value)


def test_docker_cli_login_is_a_private_file_never_argv() -> None:
    creds = Credentials(username="u", secret=CANARY, source="STACKPROOF_REGISTRY_USER + --password-stdin")
    with _docker_config(f"{HOST}/stackproof:x", creds) as env:
        assert env is not None
        path = Path(env["DOCKER_CONFIG"]) / "config.json"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and CANARY not in json.dumps(env)
        auth = json.loads(path.read_text())["auths"][HOST]["auth"]
        assert base64.b64decode(auth).decode() == f"u:{CANARY}"
    assert not path.exists()


# -- identity ------------------------------------------------------------------------------------------


def test_an_index_resolves_to_the_platform_never_to_an_attestation() -> None:
    index = {
        "manifests": [
            {"digest": "sha256:att", "platform": {"os": "unknown", "architecture": "unknown"},
             "annotations": {"vnd.docker.reference.type": "attestation-manifest"}},
            {"digest": "sha256:arm", "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}},
            {"digest": "sha256:amd", "platform": {"os": "linux", "architecture": "amd64"}},
        ]
    }  # fmt: skip
    assert platform_manifest(index, "linux/amd64")["digest"] == "sha256:amd"  # type: ignore[index]
    assert platform_manifest(index, "linux/arm64")["digest"] == "sha256:arm"  # type: ignore[index]
    assert platform_manifest(index, "linux/arm64/v8")["digest"] == "sha256:arm"  # type: ignore[index]
    assert platform_manifest(index, "linux/s390x") is None


# -- the publish gate (pure) -----------------------------------------------------------------------------


def _receipt(status: Status = Status.PASS, *, passed: bool = True) -> dict[str, Any]:
    report = _report(*(status,) * 4, passed=passed)
    return build_receipt(report, matrix_digest="sha256:m", host=CPU, started_at=0, finished_at=1).to_json()


def _run_of(receipt: dict[str, Any], *files: str, name: str = "run-1") -> RunDir:
    """The run directory that wrote `receipt`: its renderings (and `files`) beside it."""
    parsed = Receipt.parse(receipt)
    listed = frozenset({"receipt.json", *RENDERINGS, *files})
    return RunDir(name=name, files=listed, summary=render_markdown(parsed))


def _gate(receipt: dict[str, Any], run: RunDir | None = None, **kw: str) -> list[str]:
    args = {"cell_id": receipt["cell"], "image_id": receipt["image"]["id"], "content_tag": receipt["image"]["ref"]}
    return publishable_problems(receipt, run or _run_of(receipt), matrix_digest="sha256:m", **(args | kw))


def test_publish_gate_accepts_a_real_receipt_and_refuses_edits() -> None:
    good = _receipt()
    assert receipt_problems(good) == [] and _gate(good) == []
    assert good["image"]["id_is"] == "config"
    failing = _receipt(Status.FAIL, passed=False)
    assert _gate(failing) == []  # a FAIL receipt is publishable as what it is (no tag moves)
    promoted = json.loads(json.dumps(failing)) | {"status": "PASS"}
    assert any("PASS, but stages" in p for p in _gate(promoted, _run_of(failing)))
    stage_edited = json.loads(json.dumps(good))
    stage_edited["stages"][0]["status"] = "SKIP"
    assert any("its checks say PASS" in p for p in receipt_problems(stage_edited))
    assert any("not this matrix.yaml" in p for p in _gate(good | {"matrix_digest": "sha256:other"}))
    assert any("not 'x'" in p for p in _gate(good, cell_id="x"))
    assert any("not the cell's content tag" in p for p in _gate(good, content_tag="stackproof/c:other"))
    assert any("for image" in p for p in _gate(good, image_id="sha256:other"))


def test_publish_gate_wants_the_receipt_in_the_run_directory_that_wrote_it() -> None:
    """Each refusal that once cross-checked report.json, now on the receipt and the run that wrote it,
    both ways: the unedited run passes each of them."""
    good, run = _receipt(), _run_of(_receipt())
    assert _gate(good, run) == []
    # no renderings beside it: not the output of a run (was: no report.json beside it)
    bare = RunDir(name="run-1", files=frozenset({"receipt.json"}), summary=None)
    assert _gate(good, bare) == [
        "no junit.xml or summary.md beside it: it is not the output of a `stackproof run`/`verify`"
    ]
    # its stages are not those its run recorded (was: not those of the run's report.json)
    lying = _receipt(Status.FAIL, passed=False)
    assert any("are not those its run recorded in summary.md [imports FAIL" in p for p in _gate(good, _run_of(lying)))
    # the run beside it is for another cell or image (was: the run's report.json is for another image or cell)
    other_cell = json.loads(json.dumps(good)) | {"cell": "cpu-other"}
    assert any("for another cell (cpu-other)" in p for p in _gate(good, _run_of(other_cell)))
    other_image = json.loads(json.dumps(good))
    other_image["image"]["id"] = "sha256:" + "9" * 64
    assert any("for another image" in p for p in _gate(good, _run_of(other_image)))
    assert any("not a stackproof summary" in p for p in _gate(good, RunDir(name="run-1", files=run.files, summary="")))


def test_publish_gate_wants_the_files_the_receipt_names_beside_it() -> None:
    named = json.loads(json.dumps(_receipt()))
    named["stages"][0]["artifacts"] = {"probe": "stackproof-out/cpu-tiny/run-1/imports-probe.json"}
    named["stages"][3]["artifacts"] = {"summary": "/abs/out/cpu-tiny/run-1/load/load.json"}
    assert _gate(named, _run_of(named, "imports-probe.json", "load", "load/load.json")) == []
    missing = _gate(named, _run_of(named, "imports-probe.json"))
    assert missing == ["the files its stages name are not beside it (load summary load/load.json)"]
    moved = _gate(named, _run_of(named, "imports-probe.json", "load/load.json", name="edited-ab12"))
    assert len(moved) == 1 and moved[0].startswith("its stages name another run's files (imports probe stackproof-out/")


def test_a_real_run_directory_holds_together_with_its_receipt(tmp_path: Path) -> None:
    """A run directory a real `stackproof run` wrote (tests/fixtures/receipts): its receipt names
    the files beside it by the paths the run wrote (under /tmp, elsewhere); only the trimmed probe
    is missing, and once it is back nothing is."""
    shutil.copytree(RUN_FIXTURE, tmp_path / RUN_FIXTURE.name)
    run_dir = tmp_path / RUN_FIXTURE.name
    receipt = Receipt.read(run_dir / "receipt.json")
    assert run_problems(receipt, RunDir.read(run_dir)) == [
        "the files its stages name are not beside it (imports probe imports-probe.json)"
    ]
    (run_dir / "imports-probe.json").write_text("{}")
    assert run_problems(receipt, RunDir.read(run_dir)) == []


def test_publish_reads_the_receipt_through_the_model_naming_file_and_field(tmp_path: Path) -> None:
    good = _receipt()

    class _Docker:  # the cell's own image is here: the gate is all that is left before the registry
        def image(self, ref: str) -> Any:
            return type("Info", (), {"id": good["image"]["id"]})()

    path = tmp_path / "run" / "receipt.json"
    path.parent.mkdir()

    def attempt(document: dict[str, Any]) -> str:
        path.write_text(json.dumps(document))
        with pytest.raises(InputError) as caught:
            publish(
                _Docker(),  # type: ignore[arg-type]
                cell_id=good["cell"],
                image="x",
                content_tag=good["image"]["ref"],
                receipt_path=path,
                registry="127.0.0.1:1",
                matrix_digest="sha256:m",
                platform="linux/amd64",
            )
        return str(caught.value)

    broken = json.loads(json.dumps(good))
    broken["stages"][1]["seconds"] = "soon"
    assert attempt(broken).startswith(f"{path}: stages[1].seconds: a str, expected a number")
    # The unedited receipt parses and passes on to the gate, which wants the run's renderings beside it.
    assert "no junit.xml or summary.md beside it" in attempt(good)
    write_all(Receipt.parse(good), path.parent)
    edited = json.loads(path.read_text())
    edited["stages"][1]["checks"][0]["status"] = edited["stages"][1]["status"] = "WARN"
    assert "are not those its run recorded in summary.md" in attempt(edited)


# -- signatures ----------------------------------------------------------------------------------------


def test_signed_receipt_valid_tampered_wrong_key_and_other_digest() -> None:
    key, stranger = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    receipt = _receipt()
    envelope = attest.sign_receipt(key, name=f"{HOST}/stackproof", digest=DIGEST, receipt=receipt)
    verdict = attest.verify_envelope(envelope, key.public_key(), digest=DIGEST)
    assert verdict.ok and verdict.receipt == json.loads(json.dumps(receipt))
    assert not attest.verify_envelope(envelope, stranger.public_key(), digest=DIGEST).ok
    assert "another image" in attest.verify_envelope(envelope, key.public_key(), digest="sha256:" + "cd" * 32).reason
    doc = json.loads(envelope)
    statement = json.loads(base64.b64decode(doc["payload"]))
    statement["predicate"]["status"] = "FAIL"
    doc["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    tampered = attest.verify_envelope(json.dumps(doc).encode(), key.public_key(), digest=DIGEST)
    assert not tampered.ok and "no signature" in tampered.reason
    assert not attest.verify_envelope(b"{}", key.public_key(), digest=DIGEST).ok


def test_signing_keys_must_be_p256(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    other = ec.generate_private_key(ec.SECP384R1())
    path = tmp_path / "k.pem"
    path.write_bytes(
        other.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    with pytest.raises(InputError, match="P-256"):
        attest.load_private_key(path)
    path.write_text("not a key")
    with pytest.raises(InputError, match="not a PEM"):
        attest.load_private_key(path)
    with pytest.raises(InputError, match="cannot read"):
        attest.load_public_key(tmp_path / "missing.pub")


def test_an_identity_token_is_exchanged_by_oauth2_post() -> None:
    """docker's `identitytoken` (or a helper's `<token>` user) is a refresh token: POSTed, never sent as Basic."""
    posted: list[dict[str, list[str]]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/token":
            from urllib.parse import parse_qs

            assert request.method == "POST" and "Authorization" not in request.headers
            posted.append(parse_qs(request.content.decode()))
            return httpx.Response(200, json={"access_token": "at", "expires_in": 60})
        if request.headers.get("Authorization") == "Bearer at":
            return httpx.Response(200, json={})
        challenge = f'Bearer realm="http://{HOST}/token",service="svc",scope="repository:stackproof:pull"'
        return httpx.Response(401, headers={"WWW-Authenticate": challenge})

    creds = Credentials(username="<token>", secret=CANARY, source="docker-credential-x", identity_token=True)
    with RegistryClient(HOST, credentials=creds, transport=httpx.MockTransport(handler)) as client:
        assert client._request("GET", "/v2/stackproof/manifests/a").status_code == 200
    assert posted[0]["grant_type"] == ["refresh_token"] and posted[0]["refresh_token"] == [CANARY]
    assert posted[0]["scope"] == ["repository:stackproof:pull"] and posted[0]["service"] == ["svc"]


def test_cli_password_stdin_and_signature_flags_are_bad_input(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import io

    from stackproof.cli import main

    monkeypatch.delenv("STACKPROOF_REGISTRY_USER", raising=False)
    pull = ["pull", "cpu-tiny", "--registry", "127.0.0.1:1", "--no-preflight"]
    monkeypatch.setattr("sys.stdin", io.StringIO(CANARY))
    assert main([*pull, "--password-stdin"]) == 2
    assert "set STACKPROOF_REGISTRY_USER" in capsys.readouterr().err
    monkeypatch.setenv("STACKPROOF_REGISTRY_USER", "u")
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert main([*pull, "--password-stdin"]) == 2
    assert "stdin was empty" in capsys.readouterr().err
    assert main([*pull, "--require-signature"]) == 2
    err = capsys.readouterr().err
    assert "--key" in err and CANARY not in err


def _manifest_puts(answers: list[int]) -> tuple[RegistryClient, list[int]]:
    """A registry whose manifest PUTs answer MANIFEST_BLOB_UNKNOWN (400) or 201 in `answers`' order."""
    seen: list[int] = []
    unknown = {"errors": [{"code": "MANIFEST_BLOB_UNKNOWN", "message": "blob unknown to registry"}]}

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.method == "PUT"
        seen.append(answers[len(seen)])
        return httpx.Response(seen[-1], json=unknown if seen[-1] == 400 else {})

    return RegistryClient(HOST, transport=httpx.MockTransport(handler)), seen


def test_a_manifest_put_racing_a_concurrent_upload_of_its_blob_is_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("pipeline.registry.oci.time.sleep", lambda _s: None)
    client, seen = _manifest_puts([400, 201])
    with client:
        assert client.put_manifest("stackproof", "a", b"{}", "application/json").status_code == 201
    assert seen == [400, 201]
    # A blob that stays unknown is the registry's answer: four tries, then the error names it.
    client, seen = _manifest_puts([400] * 4)
    with client, pytest.raises(InfraError, match="MANIFEST_BLOB_UNKNOWN"):
        client.put_manifest("stackproof", "a", b"{}", "application/json")
    assert len(seen) == 4
