"""The registry client against a hostile registry (issue 27, classes 3 and 4): a blob without end,
a dribbling answer, a tag list without end. Fake-backed unit tests (an httpx.MockTransport whose
bodies are generators, read lazily as a socket's would be), not integration tests; each is proven
the other way by an honest answer of the same shape. The server is tests/hostile_registry.py, the
one the integration tier serves over a real socket to the CLI (tests/integration/test_publish_hostile.py)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from pipeline.errors import InfraError, InputError
from pipeline.guard.httppolicy import HttpPolicy
from pipeline.registry.oci import RegistryClient, sha256_digest
from tests.hostile_registry import GOOD_BLOB, handler

POLICY = HttpPolicy(read_s=5, total_s=0.5, max_body=1 << 20, max_items=100)  # a dribble: 1 byte / 0.1 s


@pytest.fixture
def client() -> Iterator[RegistryClient]:
    with RegistryClient("127.0.0.1:5000", policy=POLICY, transport=httpx.MockTransport(handler)) as registry:
        yield registry


def test_a_blob_without_end_is_refused_while_reading(client: RegistryClient) -> None:
    started = time.monotonic()
    with pytest.raises(InfraError, match="larger than 1,048,576 bytes: refused while reading"):
        client.get_blob("r", "sha256:" + "0" * 64)
    assert time.monotonic() - started < 5
    assert client.get_blob("r", sha256_digest(GOOD_BLOB)) == GOOD_BLOB  # the other way


def test_a_dribbling_answer_is_given_up_at_the_total_deadline(client: RegistryClient) -> None:
    started = time.monotonic()
    with pytest.raises(InfraError, match=r"longer than 0\.5s in all"):
        client.tags("dribble")
    assert time.monotonic() - started < POLICY.total_s + 2


def test_a_tag_list_past_the_item_cap_is_refused_never_truncated(client: RegistryClient) -> None:
    with pytest.raises(InfraError, match="more than 100 items"):
        client.tags("many")
    assert client.tags("few") == ["a", "b"]


# -- one command's whole walk (issue 27): a deadline and a manifest cap on the command, not per answer ----------

SLOW_S = 0.05  # each manifest answer: well within the per-answer deadline, slow in the sum
WALK_POLICY = HttpPolicy(read_s=5, total_s=2.0)  # the listing cap of every command (10,000)
TAGS = [f"sha256-{n:064x}" for n in range(400)]  # 400 tags x 0.05 s: 20 s of manifests in a row


def _slow_registry(request: httpx.Request) -> httpx.Response:
    path = request.url.path
    if path == "/v2/":
        return httpx.Response(200, json={})
    if path.endswith("/tags/list"):
        return httpx.Response(200, json={"name": "stackproof", "tags": TAGS})
    if "/manifests/" in path:
        time.sleep(SLOW_S)
        body = b'{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": []}'
        return httpx.Response(200, content=body, headers={"Content-Type": "application/vnd.oci.image.index.v1+json"})
    return httpx.Response(404, json={"errors": [{"code": "NOT_FOUND"}]})


@pytest.fixture
def slow_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """`report --registry`'s walk (stackproof.site_report.sources) against the slow registry."""
    import pipeline.registry.oci as oci

    real = oci.RegistryClient

    def client(host: str, **kwargs: object) -> RegistryClient:
        return real(host, policy=WALK_POLICY, transport=httpx.MockTransport(_slow_registry), **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(oci, "RegistryClient", client)


def test_a_registry_walk_stops_at_the_commands_deadline(slow_registry: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from stackproof.site_report.sources import receipts_from_registry

    monkeypatch.setenv("STACKPROOF_REGISTRY_DEADLINE_S", "0.5")  # 10 manifests' time of the 400
    started = time.monotonic()
    with pytest.raises(InfraError) as exc:
        receipts_from_registry("127.0.0.1:5000/stackproof")
    assert time.monotonic() - started < 0.5 + WALK_POLICY.total_s
    message = str(exc.value)
    assert "deadline of 0.5s" in message and "/manifests/sha256-" in message, message
    assert "STACKPROOF_REGISTRY_DEADLINE_S" in message, message


def test_a_registry_walk_stops_at_the_manifest_cap(slow_registry: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from stackproof.site_report.sources import receipts_from_registry

    monkeypatch.setattr(sys.modules[__name__], "SLOW_S", 0.0)
    monkeypatch.setenv("STACKPROOF_REGISTRY_MAX_MANIFESTS", "50")
    with pytest.raises(InfraError, match=r"more than 50 manifests .*STACKPROOF_REGISTRY_MAX_MANIFESTS"):
        receipts_from_registry("127.0.0.1:5000/stackproof")


def test_the_whole_walk_ends_within_the_limits_the_other_way(
    slow_registry: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stackproof.site_report.sources import receipts_from_registry

    monkeypatch.setattr(sys.modules[__name__], "SLOW_S", 0.0)
    assert receipts_from_registry("127.0.0.1:5000/stackproof") == []


@pytest.mark.parametrize("value", ["0", "-5", "soon", "inf"])
def test_a_limit_that_is_not_a_positive_number_is_bad_input(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("STACKPROOF_REGISTRY_DEADLINE_S", value)
    with pytest.raises(InputError, match="STACKPROOF_REGISTRY_DEADLINE_S"):
        RegistryClient("127.0.0.1:5000")


def test_time_between_requests_is_not_the_walks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Publish and pull run `docker push`/`docker pull` between two requests of one client: gigabytes
    at the network's pace. That time is not the walk's; only the client's own requests count against
    the deadline. Seen failing first: with the deadline counted from the client's construction, a
    1.5 s pause (a push) under a 1 s deadline refused the next request (here: 1 s under 0.5 s)."""
    monkeypatch.setenv("STACKPROOF_REGISTRY_DEADLINE_S", "0.5")
    with RegistryClient("127.0.0.1:5000", policy=WALK_POLICY, transport=httpx.MockTransport(_slow_registry)) as client:
        client.check()
        time.sleep(1.0)  # a push between the client's requests, twice the deadline
        assert client.manifest("stackproof", "sha256-" + "0" * 64) is not None
        assert client.spent_s < 0.5
