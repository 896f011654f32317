"""Fixtures shared by the Kubernetes tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.fakekube.server import FakeKube


@pytest.fixture
async def kube() -> AsyncIterator[FakeKube]:
    """A running fake API server (list/watch, resourceVersions, selectors, bookmarks, 410)."""
    k = FakeKube()
    await k.start()
    yield k
    await k.stop()
