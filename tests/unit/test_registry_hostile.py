"""The registry client against a hostile registry (issue 27, classes 3 and 4): a blob without end,
a dribbling answer, a tag list without end. Fake-backed unit tests (an httpx.MockTransport whose
bodies are generators, read lazily as a socket's would be), not integration tests; each is proven
the other way by an honest answer of the same shape. The server is tests/hostile_registry.py, the
one the integration tier serves over a real socket to the CLI (tests/integration/test_publish_hostile.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from pipeline.errors import InfraError
from pipeline.guard.httppolicy import HttpPolicy
from pipeline.registry.oci import RegistryClient, sha256_digest
from tests.hostile_registry import GOOD_BLOB, handler

POLICY = HttpPolicy(read_s=5, total_s=2.0, max_body=1 << 20, max_items=100)


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
    with pytest.raises(InfraError, match="longer than 2s in all"):
        client.tags("dribble")
    assert time.monotonic() - started < POLICY.total_s + 2


def test_a_tag_list_past_the_item_cap_is_refused_never_truncated(client: RegistryClient) -> None:
    with pytest.raises(InfraError, match="more than 100 items"):
        client.tags("many")
    assert client.tags("few") == ["a", "b"]
