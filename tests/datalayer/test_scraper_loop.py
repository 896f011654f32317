"""The scrape loop's shape: one timer tick for all endpoints, no task per scrape, deadlines on kept-alive GETs, and a
page that did not change is not parsed again (while every scrape still gives a fresh Metrics)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Coroutine, Generator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from e2e.harness.aioserve import serve_app
from epp.datalayer import health
from epp.datalayer.datastore import Datastore
from epp.datalayer.extractor import ENGINE_LABEL, CoreMetricsExtractor
from epp.datalayer.health import HealthPolicy
from epp.datalayer.httpget import KeepAliveGet
from epp.datalayer.scraper import MetricsScraper
from epp.framework import Endpoint, Metrics


def page(waiting: int, kv: float = 0.5) -> str:
    return (
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}.0\n'
        'vllm:num_requests_running{engine="0",model_name="m"} 1.0\n'
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {kv}\n'
        'sglang:num_queue_reqs{model_name="m"} 42\n'
    )


@dataclass
class Server:
    text: str = ""
    hang_after: int = -1  # answer this many GETs, then hold every later one (connection open, no answer)
    gets: int = 0
    arrivals: list[float] = field(default_factory=list)
    port: int = 0
    release: asyncio.Event = field(default_factory=asyncio.Event)


@contextlib.asynccontextmanager
async def servers(n: int) -> AsyncIterator[list[Server]]:
    out = []
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(n):
            s = Server(text=page(1))

            async def handler(request: web.Request, s: Server = s) -> web.Response:
                s.gets += 1
                s.arrivals.append(time.monotonic())
                if 0 <= s.hang_after < s.gets:
                    await s.release.wait()
                return web.Response(text=s.text)

            app = web.Application()
            app.router.add_get("/metrics", handler)
            s.port = await stack.enter_async_context(serve_app(app, access_log=False))
            out.append(s)
        try:
            yield out
        finally:
            for s in out:
                s.release.set()  # held handlers end, so the servers stop at once


class CountingExtractor(CoreMetricsExtractor):
    def __init__(self) -> None:
        super().__init__()
        self.parses = 0

    def extract(self, text: str, endpoint: Endpoint, now: float | None = None) -> Metrics:
        self.parses += 1
        return super().extract(text, endpoint, now)


@contextlib.asynccontextmanager
async def scraping(scraper: MetricsScraper) -> AsyncIterator[MetricsScraper]:
    task = asyncio.create_task(scraper.run())
    try:
        yield scraper
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def wait_for(cond: Any, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.005)


@pytest.fixture
def policy() -> Generator[HealthPolicy, None, None]:
    saved = health.POLICY
    health.POLICY = HealthPolicy(max_scrape_failures=2, stale_after=5.0)
    yield health.POLICY
    health.POLICY = saved


async def test_an_unchanged_page_is_not_parsed_again_and_every_scrape_is_still_fresh() -> None:
    async with servers(1) as (s,):
        ep = Endpoint("a", "127.0.0.1", s.port)
        ds = Datastore()
        ds.replace_all([ep])
        ex = CountingExtractor()
        async with scraping(MetricsScraper(ds, interval=0.01, extractor=ex)) as scraper:
            await wait_for(lambda: s.gets >= 8)
            first = ep.metrics
            await wait_for(lambda: ep.metrics is not first)
            # The same bytes: one parse, yet each scrape swapped in a new Metrics with a later time and equal values.
            assert ex.parses == 1 and scraper.reparses_skipped >= 6
            second = ep.metrics
            assert second.update_time > first.update_time
            assert (second.waiting_queue_size, second.kv_cache_usage_percent) == (1, 0.5)
            assert first.waiting_queue_size == 1  # the old object was not mutated
            # A changed page is parsed.
            s.text = page(7, 0.9)
            await wait_for(lambda: ep.metrics.waiting_queue_size == 7)
            assert ep.metrics.kv_cache_usage_percent == 0.9 and ex.parses == 2
            # Metrics put there by someone else: the same page is parsed again rather than our copy restored.
            ep.metrics = Metrics(waiting_queue_size=99)
            await wait_for(lambda: ep.metrics.waiting_queue_size == 7)
            assert ex.parses == 3
            # Another engine (labels) reads the same bytes differently: parsed again, by the new engine's names.
            ep.labels = {**ep.labels, ENGINE_LABEL: "sglang"}
            await wait_for(lambda: ep.metrics.waiting_queue_size == 42)
            assert ex.parses == 4


async def test_one_tick_starts_every_endpoints_scrape_and_no_task_runs_per_scrape() -> None:
    async with servers(4) as srv:
        ds = Datastore()
        ds.replace_all([Endpoint(f"e{i}", "127.0.0.1", s.port) for i, s in enumerate(srv)])
        scraper = MetricsScraper(ds, interval=0.02)
        ticks = [0]
        tick = scraper._tick

        def counted() -> None:
            ticks[0] += 1
            tick()

        scraper._tick = counted  # type: ignore[method-assign]
        loop = asyncio.get_running_loop()
        tasks: list[str] = []
        factory = loop.get_task_factory()

        def counting_factory(lp: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kw: Any) -> Any:
            task = asyncio.Task(coro, loop=lp, **kw) if factory is None else factory(lp, coro, **kw)
            tasks.append(task.get_name())  # type: ignore[attr-defined,unused-ignore]
            return task

        loop.set_task_factory(counting_factory)  # type: ignore[arg-type,unused-ignore]
        try:
            async with scraping(scraper):
                await wait_for(lambda: all(s.gets >= 3 for s in srv))
                tasks.clear()
                t0, s0 = ticks[0], scraper.scrapes
                await asyncio.sleep(0.4)
                n_ticks, n_scrapes = ticks[0] - t0, scraper.scrapes - s0
        finally:
            loop.set_task_factory(factory)
    assert scraper.failures == 0
    assert not [t for t in tasks if t.startswith("scrape ")]  # kept-alive GETs run from callbacks only
    # ~20 ticks of 4 scrapes (a one-timer-per-endpoint loop would have ~1 scrape per wake-up)
    assert 8 <= n_scrapes / 4 <= 26 and n_scrapes >= 3 * n_ticks
    # and the four GETs of a tick reach the servers together
    last = [s.arrivals[-1] for s in srv]
    assert max(last) - min(last) < 0.015


async def test_a_kept_alive_get_without_answer_fails_at_its_deadline_and_the_next_reconnects(
    policy: HealthPolicy,
) -> None:
    async with servers(1) as (s,):
        ep = Endpoint("a", "127.0.0.1", s.port)
        ds = Datastore()
        ds.replace_all([ep])
        scraper = MetricsScraper(ds, interval=0.02, timeout=0.25, max_backoff=0.05)
        async with scraping(scraper):
            await wait_for(lambda: s.gets >= 3)
            s.hang_after = s.gets  # the GETs from now on are held
            held = time.monotonic()
            await wait_for(lambda: scraper.failures >= 1)
            failed_after = time.monotonic() - held
            assert 0.2 <= failed_after < 0.25 + 0.3  # the timeout, on the tick after the deadline
            assert ep.health.scrape_failures >= 1
            stamp = ep.metrics.update_time
            s.hang_after = -1
            await wait_for(lambda: ep.metrics.update_time > stamp)
            assert ep.health.scrape_failures == 0


async def test_a_scrape_that_cannot_start_fails_alone_and_the_ticks_go_on(
    policy: HealthPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with servers(2) as (sa, sb):
        a, b = Endpoint("a", "127.0.0.1", sa.port), Endpoint("b", "127.0.0.1", sb.port)
        ds = Datastore()
        ds.replace_all([a, b])
        scraper = MetricsScraper(ds, interval=0.02, max_backoff=0.04)
        async with scraping(scraper):
            await wait_for(lambda: sa.gets >= 2 and sb.gets >= 2)
            send = KeepAliveGet.send
            broken = [True]

            def failing_for_a(self: KeepAliveGet, sink: Any) -> bool:
                if broken[0] and self.port == sa.port:
                    raise RuntimeError("boom")
                return send(self, sink)

            monkeypatch.setattr(KeepAliveGet, "send", failing_for_a)
            await wait_for(lambda: a.health.scrape_failures >= 2)
            gets_b = sb.gets
            await wait_for(lambda: sb.gets >= gets_b + 3)  # b is still scraped on the ticks
            broken[0] = False
            await wait_for(lambda: a.health.scrape_failures == 0)  # and a recovers
            # The same for a GET that (re)connects: an unexpected error fails the scrape, the next one runs.
            get = KeepAliveGet.get
            calls = [0]

            async def first_reconnect_fails(self: KeepAliveGet, timeout: float) -> tuple[int, bytes]:
                if self.port == sa.port:
                    calls[0] += 1
                    if calls[0] == 1:
                        raise RuntimeError("boom")
                return await get(self, timeout)

            monkeypatch.setattr(KeepAliveGet, "get", first_reconnect_fails)
            failed = scraper.failures
            assert scraper._targets["a"].client._proto is not None
            scraper._targets["a"].client.abort()  # the connection is gone: the next scrape of a reconnects
            await wait_for(lambda: calls[0] >= 2)
            assert scraper.failures >= failed + 1  # (+1 more if the abort caught a GET in flight: its deadline)
            await wait_for(lambda: a.health.scrape_failures == 0 and a.health.last_ok > 0)
