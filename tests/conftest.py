"""Fixtures shared across the test packages: the fake Kubernetes API server, vLLM's KV-event module (torch-free),
a real redis-server."""

from __future__ import annotations

import types
from collections.abc import AsyncIterator, Iterator

import pytest

from e2e.harness.redis import redis_server
from e2e.vllm_interop import load_kv_events
from tests.fakekube.server import FakeKube


@pytest.fixture
async def kube() -> AsyncIterator[FakeKube]:
    """A running fake API server (list/watch, resourceVersions, selectors, bookmarks, 410)."""
    k = FakeKube()
    await k.start()
    yield k
    await k.stop()


@pytest.fixture(scope="session")
def vllm_kv() -> types.ModuleType:
    kv = load_kv_events()
    # vllm.config.kv_events is only a name in the torch-free loader; the publisher builds one to report
    # its own config, so give it a plain record type.
    kv.KVEventsConfig = types.SimpleNamespace  # type: ignore[attr-defined]
    return kv


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    with redis_server() as url:
        yield url
