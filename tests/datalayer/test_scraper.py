"""The metrics scrapers against a real HTTP metrics server: they follow the Datastore, go stale on failures, feed the
pool gauges, and the runtime routes away from a loaded server."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from e2e.harness.aioserve import serve_app
from epp.datalayer import metrics as pool_metrics
from epp.datalayer.datastore import Datastore
from epp.datalayer.extractor import CoreMetricsExtractor
from epp.datalayer.metrics import POOL_AVG_QUEUE, POOL_READY_PODS, PoolMetricsReporter
from epp.datalayer.scraper import MetricsScraper
from epp.framework import ApiKind, Endpoint
from tests.datalayer.support_metrics import vllm_page


@dataclass
class FakeVLLMMetrics:
    """A real HTTP server serving vLLM-format metrics; per-path state so one server can play several pods."""

    pages: dict[int, str] = field(default_factory=dict)
    status: dict[int, int] = field(default_factory=dict)
    hits: dict[int, int] = field(default_factory=dict)
    port: int = 0


@pytest.fixture
async def metrics_servers() -> AsyncIterator[list[FakeVLLMMetrics]]:
    servers: list[FakeVLLMMetrics] = []
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(3):
            state = FakeVLLMMetrics()

            async def handler(request: web.Request, state: FakeVLLMMetrics = state) -> web.Response:
                state.hits[0] = state.hits.get(0, 0) + 1
                code = state.status.get(0, 200)
                if code != 200:
                    return web.Response(status=code, text="down")
                return web.Response(text=state.pages.get(0, ""), content_type="text/plain")

            app = web.Application()
            app.router.add_get("/metrics", handler)
            state.port = await stack.enter_async_context(serve_app(app))
            servers.append(state)
        yield servers


async def wait_for(cond: object, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


async def test_scraper_follows_datastore_and_refreshes(metrics_servers: list[FakeVLLMMetrics]) -> None:
    s0, s1, s2 = metrics_servers
    s0.pages[0] = vllm_page(1, 2, 0.1)
    s1.pages[0] = vllm_page(7, 3, 0.9)
    s2.pages[0] = vllm_page(0, 0, 0.0)
    ds = Datastore()
    a = Endpoint("a", "127.0.0.1", s0.port)
    b = Endpoint("b", "127.0.0.1", s1.port)
    ds.replace_all([a, b])
    scraper = MetricsScraper(ds, interval=0.02)
    task = asyncio.create_task(scraper.run())
    try:
        await wait_for(lambda: a.metrics.update_time > 0 and b.metrics.update_time > 0)
        assert (a.metrics.waiting_queue_size, b.metrics.waiting_queue_size) == (1, 7)
        assert b.metrics.kv_cache_usage_percent == 0.9 and scraper.running() == ["a", "b"]
        old = a.metrics
        s0.pages[0] = vllm_page(4, 2, 0.3)
        await wait_for(lambda: a.metrics.waiting_queue_size == 4)
        assert a.metrics is not old and old.waiting_queue_size == 1  # replaced, never mutated
        # follows the datastore: a new endpoint starts a loop, a removed one stops
        c = Endpoint("c", "127.0.0.1", s2.port)
        ds.upsert(c)
        await wait_for(lambda: c.metrics.update_time > 0)
        ds.remove("a")
        await asyncio.sleep(0.05)
        hits = s0.hits.get(0, 0)
        await asyncio.sleep(0.1)
        assert s0.hits.get(0, 0) == hits and scraper.running() == ["b", "c"]
        # interval: about 1 / 20 ms per endpoint
        before = s1.hits.get(0, 0)
        await asyncio.sleep(0.2)
        assert 4 <= s1.hits.get(0, 0) - before <= 14
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert scraper.running() == []


async def test_failed_scrapes_go_stale(metrics_servers: list[FakeVLLMMetrics]) -> None:
    s0 = metrics_servers[0]
    s0.pages[0] = vllm_page(2, 1, 0.2)
    ds = Datastore()
    a = Endpoint("a", "127.0.0.1", s0.port)
    dead = Endpoint("dead", "127.0.0.1", 9, metrics_port=1)  # nothing listens there
    ds.replace_all([a, dead])
    scraper = MetricsScraper(ds, interval=0.02, timeout=0.2, max_backoff=0.16)
    task = asyncio.create_task(scraper.run())
    try:
        await wait_for(lambda: a.metrics.update_time > 0)
        s0.status[0] = 500
        stamp = a.metrics.update_time
        await asyncio.sleep(0.15)
        assert a.metrics.update_time == stamp and a.metrics.age() >= 0.15  # kept, but aging → stale
        assert a.metrics.waiting_queue_size == 2
        assert dead.metrics.update_time == 0.0 and scraper.failures > 0
        hits = s0.hits.get(0, 0)
        await asyncio.sleep(0.3)
        assert s0.hits.get(0, 0) - hits <= 6  # failing: exponential backoff instead of 15 tries at 20 ms
        s0.status[0] = 200
        await wait_for(lambda: a.metrics.update_time > stamp)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_pool_gauges_count_fresh_endpoints_only() -> None:
    ds = Datastore()
    a, b, stale = Endpoint("a", "10.0.0.1", 1), Endpoint("b", "10.0.0.2", 1), Endpoint("s", "10.0.0.3", 1)
    ds.replace_all([a, b, stale])
    now = time.monotonic()
    ex = CoreMetricsExtractor()
    a.metrics = ex.extract(vllm_page(2, 0, 0.2), a, now)
    b.metrics = ex.extract(vllm_page(4, 0, 0.4), b, now)
    stale.metrics = ex.extract(vllm_page(100, 0, 1.0), stale, now - 10)
    PoolMetricsReporter(ds, "test-pool", staleness=2.0).refresh()
    assert POOL_READY_PODS.labels("test-pool")._value.get() == 2
    assert POOL_AVG_QUEUE.labels("test-pool")._value.get() == 3.0
    # llm-d-router v0.10's names: the same means, and sample standard deviations rounded to 2 decimals
    got = {
        g: getattr(pool_metrics, g).labels("test-pool")._value.get()
        for g in (
            "LLMD_POOL_READY",
            "LLMD_POOL_AVG_QUEUE",
            "LLMD_POOL_STD_QUEUE",
            "LLMD_POOL_AVG_KV",
            "LLMD_POOL_STD_KV",
        )
    }
    assert got == {
        "LLMD_POOL_READY": 2,
        "LLMD_POOL_AVG_QUEUE": 3.0,
        "LLMD_POOL_STD_QUEUE": 1.41,
        "LLMD_POOL_AVG_KV": 0.3,
        "LLMD_POOL_STD_KV": 0.14,
    }


async def test_runtime_routes_away_from_a_loaded_server(metrics_servers: list[FakeVLLMMetrics]) -> None:
    """build_runtime end to end in-process: static discovery + background scrapers + the director."""
    from epp.config import parse_config
    from epp.framework import InferenceRequest
    from epp.wiring.runtime import build_runtime

    for s in metrics_servers:
        s.pages[0] = vllm_page(0, 1, 0.1)
    metrics_servers[0].pages[0] = vllm_page(20, 5, 0.95)  # loaded
    eps = "\n".join(f"- {{name: s{i}, address: 127.0.0.1, port: {s.port}}}" for i, s in enumerate(metrics_servers))
    cfg = parse_config(
        f"endpoints:\n{eps}\nrefreshMetricsInterval: 20ms\n"
        "plugins:\n- type: utilization-detector\n- type: queue-scorer\n- type: kv-cache-utilization-scorer\n"
        "schedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: utilization-detector\n"
        "  - {pluginRef: queue-scorer, weight: 2}\n  - {pluginRef: kv-cache-utilization-scorer, weight: 2}\n"
    )
    rt = build_runtime(cfg)
    tasks = [asyncio.create_task(src.run(rt.datastore)) for src in rt.sources]
    tasks += [asyncio.create_task(bg()) for bg in rt.background]
    try:
        await wait_for(lambda: rt.datastore.synced and all(e.metrics.update_time > 0 for e in rt.datastore.endpoints()))

        async def route(n: int) -> set[str]:
            seen = set()
            for i in range(n):
                r = InferenceRequest(str(i), "/v1/completions", ApiKind.COMPLETIONS, "m", "m", {"prompt": f"p{i}"})
                seen.add((await rt.director.handle_request(r)).endpoints[0].name)
            return seen

        assert await route(30) == {"s1", "s2"}
        # the load moves: s0 drains, s2 fills up; the scrapers pick it up within a few intervals
        metrics_servers[0].pages[0] = vllm_page(0, 1, 0.1)
        metrics_servers[2].pages[0] = vllm_page(30, 5, 0.9)
        s0, s2 = rt.datastore.get("s0"), rt.datastore.get("s2")
        assert s0 is not None and s2 is not None
        await wait_for(lambda: s2.metrics.waiting_queue_size == 30 and s0.metrics.waiting_queue_size == 0)
        assert await route(30) == {"s0", "s1"}
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_tap_sees_every_outcome_and_a_fed_scraper_applies_them_without_a_get(
    metrics_servers: list[FakeVLLMMetrics],
) -> None:
    """`--workers`: worker 0's scraper tells its tap each outcome (the page, or why it failed); another worker's
    `fed` scraper makes no GET and takes those outcomes as its own (metrics, health)."""
    s0 = metrics_servers[0]
    s0.pages[0] = vllm_page(3, 1, 0.2)
    seen: list[tuple[str, int, bytes, str]] = []
    ds, fed_ds = Datastore(), Datastore()
    ds.upsert(Endpoint("a", "127.0.0.1", s0.port))
    a = Endpoint("a", "127.0.0.1", s0.port)
    fed_ds.upsert(a)
    scraper, fed = MetricsScraper(ds, interval=0.02), MetricsScraper(fed_ds, interval=0.02)
    scraper.tap = lambda *outcome: seen.append(outcome)
    fed.fed = True
    tasks = [asyncio.create_task(scraper.run()), asyncio.create_task(fed.run())]
    try:
        await wait_for(lambda: len(seen) >= 2)
        name, status, body, why = seen[-1]
        assert (name, status, why) == ("a", 200, "") and b"num_requests_waiting" in body
        s0.status[0] = 503
        await wait_for(lambda: seen[-1][1] == 503)
        ds.remove("a")
        await asyncio.sleep(0.05)
        assert fed.running() == ["a"] and fed.scrapes == 0 and a.metrics.update_time == 0.0  # no GET of its own
        assert fed.receive("a", 200, body) and a.metrics.waiting_queue_size == 3 and a.health.last_ok > 0
        assert fed.receive("a", 0, b"", "ConnectionRefusedError: refused") and a.health.scrape_failures == 1
        assert not fed.receive("b", 200, body)  # not an endpoint it follows
        assert fed.stats()["received"] == 2
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
