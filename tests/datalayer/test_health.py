"""Endpoint health from scrapes and responses: a dead or hung server leaves the candidates fast and comes back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import pytest
from aiohttp import web

from epp.datalayer import health
from epp.datalayer.datastore import Datastore
from epp.datalayer.health import HealthPolicy, healthy_candidates, response_status
from epp.datalayer.scraper import MetricsScraper
from epp.framework import Endpoint

PAGE = 'vllm:num_requests_running{model_name="m"} 1.0\nvllm:num_requests_waiting{model_name="m"} 0.0\n'


class MetricsServer:
    """A /metrics page that can die (socket closed: connection refused) or hang (accepts, never answers)."""

    def __init__(self) -> None:
        self.port = 0
        self.hang = False
        self.runner: web.AppRunner | None = None

    async def handler(self, request: web.Request) -> web.Response:
        while self.hang:
            await asyncio.sleep(0.01)
        return web.Response(text=PAGE, content_type="text/plain")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self.handler)
        self.runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", self.port, reuse_address=True)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        assert self.runner is not None
        self.hang = False
        await self.runner.cleanup()


@pytest.fixture
def policy() -> Iterator[HealthPolicy]:
    saved = health.POLICY
    health.POLICY = HealthPolicy(max_scrape_failures=2, stale_after=0.5, max_server_errors=3, ejection=0.3)
    yield health.POLICY
    health.POLICY = saved


@pytest.fixture
async def servers() -> AsyncIterator[list[MetricsServer]]:
    out = [MetricsServer(), MetricsServer()]
    for s in out:
        await s.start()
    yield out
    for s in out:
        if s.runner is not None:
            await s.runner.cleanup()


async def until(cond: object, timeout: float = 5.0) -> float:
    t0 = time.monotonic()
    while not cond():  # type: ignore[operator]
        if time.monotonic() - t0 > timeout:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.005)
    return time.monotonic() - t0


async def test_dead_and_hung_servers_leave_the_candidates_and_come_back(
    policy: HealthPolicy, servers: list[MetricsServer]
) -> None:
    sa, sb = servers
    a, b = Endpoint("a", "127.0.0.1", sa.port), Endpoint("b", "127.0.0.1", sb.port)
    ds = Datastore()
    ds.replace_all([a, b])
    scraper = MetricsScraper(ds, interval=0.02, timeout=0.3, max_backoff=0.2)
    task = asyncio.create_task(scraper.run())
    try:
        await until(lambda: a.health.last_ok > 0 and b.health.last_ok > 0)
        assert healthy_candidates([a, b]) == [a, b]
        # Dead: the port refuses connections. Two failed scrapes, a few tens of ms.
        await sa.stop()
        dead_after = await until(lambda: healthy_candidates([a, b]) == [b])
        assert dead_after < 0.4
        # Back: the first good scrape (within the capped backoff) returns it.
        await sa.start()
        await until(lambda: healthy_candidates([a, b]) == [a, b], timeout=2.0)
        # Hung: connections are accepted but never answered; its metrics go stale after stale_after.
        sb.hang = True
        hung_after = await until(lambda: healthy_candidates([a, b]) == [a])
        assert 0.3 < hung_after < 0.5 + 0.3
        # Every candidate unhealthy: fail open (keep them all) rather than refuse every request.
        sa.hang = True
        await until(lambda: not health.is_healthy(a, time.monotonic(), policy))
        assert healthy_candidates([a, b]) == [a, b]
        sa.hang = sb.hang = False
        await until(lambda: health.is_healthy(a, time.monotonic()) and health.is_healthy(b, time.monotonic()))
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_consecutive_server_errors_eject_for_a_while(policy: HealthPolicy) -> None:
    a, b = Endpoint("a", "10.0.0.1", 8000), Endpoint("b", "10.0.0.2", 8000)
    now = 100.0
    for status in (503, 502, 200, 500, 500):  # a success resets the run
        response_status(a, status, now)
    assert healthy_candidates([a, b], now) == [a, b]
    response_status(a, 504, now)
    assert healthy_candidates([a, b], now) == [b]
    assert healthy_candidates([a, b], now + 0.29) == [b]
    assert healthy_candidates([a, b], now + 0.31) == [a, b]
    for _ in range(3):
        response_status(b, 429, now)  # not a server failure
    assert healthy_candidates([a, b], now) == [b] and b.health.server_errors == 0


def test_never_scraped_endpoints_are_not_stale(policy: HealthPolicy) -> None:
    a = Endpoint("a", "10.0.0.1", 8000)
    assert healthy_candidates([a], 1e9) == [a]  # no scraper (static tests, scraping off): never judged stale
