"""The workers' feed over a real ipc:// socket: worker 0's scraper and KV subscriptions publish, a fed worker's
apply it as their own and make no scrape and open no subscription; a fed worker that connects late replays the KV
events it missed; the feed going away is said and the fed worker keeps its state."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from epp.datalayer.datastore import Datastore
from epp.datalayer.scraper import MetricsScraper
from epp.framework import Endpoint
from epp.kvcache.config import PoolConfig
from epp.wiring.feed import FeedConsumer, FeedPublisher
from tests.datalayer.support_metrics import vllm_page
from tests.datalayer.test_scraper import FakeVLLMMetrics, metrics_servers, wait_for
from tests.kvcache.conftest import Publishers
from tests.kvcache.test_subscriptions import publish_until
from tests.kvcache.vllm_rig import BS, MODEL, TOKENS, Rig, batch, endpoint, stored, until

__all__ = ["metrics_servers"]  # the fixture, imported


def received(kind: str, outcome: str) -> float:
    return REGISTRY.get_sample_value("pyepp_worker_feed_received_total", {"kind": kind, "outcome": outcome}) or 0.0


class Tasks:
    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[None]] = []

    def start(self, coro: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.create_task(coro)
        self.tasks.append(task)
        return task

    async def stop(self, task: asyncio.Task[None]) -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.fixture
async def tasks() -> AsyncIterator[Tasks]:
    t = Tasks()
    yield t
    for task in reversed(t.tasks):
        await t.stop(task)


@pytest.fixture
def publishers(vllm_kv: Any, tmp_path: Path) -> Iterator[Publishers]:
    pubs = Publishers(vllm_kv, tmp_path)
    yield pubs
    pubs.close()


@pytest.fixture
def feed(tmp_path: Path) -> Iterator[str]:
    yield f"ipc://{tmp_path}/feed.ipc"


async def test_one_scrape_reaches_both_workers(metrics_servers: list[FakeVLLMMetrics], tasks: Tasks, feed: str) -> None:
    s0, s1, _ = metrics_servers
    s0.pages[0], s1.pages[0] = vllm_page(3, 1, 0.25), vllm_page(0, 0, 0.0)

    def pool() -> tuple[Datastore, Endpoint, Endpoint]:
        ds = Datastore()
        a, b = Endpoint("a", "127.0.0.1", s0.port), Endpoint("b", "127.0.0.1", s1.port)
        ds.replace_all([a, b])
        return ds, a, b

    ds0, a0, _ = pool()
    ds1, a1, b1 = pool()
    first, fed = MetricsScraper(ds0, interval=0.02), MetricsScraper(ds1, interval=0.02)
    pub = FeedPublisher(feed)
    first.tap = pub.scrape
    fed.fed = True
    tasks.start(pub.run())
    tasks.start(FeedConsumer(feed, fed, None).run())
    tasks.start(first.run())
    tasks.start(fed.run())
    await wait_for(lambda: a1.metrics.waiting_queue_size == 3 and b1.metrics.update_time > 0)
    assert a1.metrics.kv_cache_usage_percent == 0.25 and a1.metrics is not a0.metrics  # parsed in each worker
    s0.pages[0] = vllm_page(5, 1, 0.5)
    await wait_for(lambda: a1.metrics.waiting_queue_size == 5)
    # every GET the pods served is worker 0's: the fed scraper made none
    assert fed.scrapes == 0 and fed.received > 0
    assert s0.hits.get(0, 0) + s1.hits.get(0, 0) <= first.scrapes
    # a failing pod fails in the fed worker too (its health), and recovers with it
    s0.status[0] = 500
    await wait_for(lambda: a1.health.scrape_failures >= 2)
    s0.status[0] = 200
    await wait_for(lambda: a1.health.scrape_failures == 0)
    # an endpoint the fed worker does not follow (not discovered there yet) is counted and left
    unknown = received("metrics", "unknown_endpoint")
    ds0.upsert(Endpoint("c", "127.0.0.1", s1.port))
    await wait_for(lambda: received("metrics", "unknown_endpoint") > unknown)
    assert "c" not in fed.running()


async def test_kv_events_reach_both_indexes_through_one_subscription(
    vllm_kv: Any, publishers: Publishers, tasks: Tasks, feed: str
) -> None:
    def rig() -> Rig:
        return Rig(PoolConfig(concurrency=2, topic_filter="kv@", default_model=MODEL, replay_idle_timeout=1.0))

    first, fed = rig(), rig()
    pub = publishers.start(topic=f"kv@x@{MODEL}")
    p = FeedPublisher(feed)
    first.pool.subscriptions.tap = p.frames
    fed.pool.subscriptions.fed = True
    pod = "127.0.0.1:8000"
    stores = []
    for r in (first, fed):
        ds = Datastore()
        ds.subscribe(r.pool.subscriptions)
        ds.upsert(endpoint("a", 8000, pub))
        stores.append(ds)
    tasks.start(p.run())
    tasks.start(first.pool.run())
    tasks.start(fed.pool.run())
    await first.pool.started()
    await fed.pool.started()
    # published before the fed worker has a feed: it replays them when it connects
    pub.publish(batch(vllm_kv, stored(vllm_kv, [1, 2, 3, 4], None, TOKENS[: 4 * BS])))
    await until(lambda: first.blocks(TOKENS, pod) == 4)
    consumer = FeedConsumer(feed, None, fed.pool.subscriptions)
    tasks.start(consumer.run())
    await until(lambda: fed.blocks(TOKENS, pod) == 4)
    # then live, through the feed
    pub.publish(batch(vllm_kv, stored(vllm_kv, [5, 6], 4, TOKENS[4 * BS : 6 * BS])))
    await until(lambda: first.blocks(TOKENS, pod) == 6 and fed.blocks(TOKENS, pod) == 6)
    assert first.metric("kv_cache_events_active_subscribers") == 1
    assert fed.metric("kv_cache_events_active_subscribers") == 0  # no socket of its own
    assert fed.pool.subscriptions._subs[pod][2] is None
    # a pod worker 0 follows before this worker does: its events until then are replayed when it follows it
    other, pod2 = publishers.start(topic=f"kv@y@{MODEL}"), "127.0.0.1:8001"
    stores[0].upsert(endpoint("b", 8001, other))
    unknown = received("kv_events", "unknown_endpoint")
    # (published until one goes through worker 0's live subscription, not only its replay on connect)
    await publish_until(
        lambda: received("kv_events", "unknown_endpoint") > unknown,
        other,
        batch(vllm_kv, stored(vllm_kv, [1, 2, 3], None, TOKENS[: 3 * BS])),
    )
    await until(lambda: first.blocks(TOKENS, pod2) == 3)
    assert fed.blocks(TOKENS, pod2) == 0
    stores[1].upsert(endpoint("b", 8001, other))
    await until(lambda: fed.blocks(TOKENS, pod2) == 3)


async def test_feed_gone_is_said_and_the_state_kept(
    metrics_servers: list[FakeVLLMMetrics], tasks: Tasks, feed: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    s0 = metrics_servers[0]
    s0.pages[0] = vllm_page(2, 1, 0.1)
    ds0, ds1 = Datastore(), Datastore()
    ds0.upsert(Endpoint("a", "127.0.0.1", s0.port))
    a1 = Endpoint("a", "127.0.0.1", s0.port)
    ds1.upsert(a1)
    first, fed = MetricsScraper(ds0, interval=0.02), MetricsScraper(ds1, interval=0.02)
    fed.fed = True
    consumer = FeedConsumer(feed, fed, None)
    tasks.start(fed.run())
    tasks.start(consumer.run())

    def start_first() -> tuple[asyncio.Task[None], asyncio.Task[None]]:
        pub = FeedPublisher(feed)
        first.tap = pub.scrape
        return tasks.start(pub.run()), tasks.start(first.run())

    running = start_first()
    await wait_for(lambda: a1.metrics.waiting_queue_size == 2 and consumer.connected)
    for t in running:  # worker 0 dies
        await tasks.stop(t)
    await wait_for(lambda: not consumer.connected)
    assert any("is gone" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    assert a1.metrics.waiting_queue_size == 2  # routing on the last state
    hits = s0.hits.get(0, 0)
    await asyncio.sleep(0.1)
    assert s0.hits.get(0, 0) == hits  # the fed worker does not start scraping
    s0.pages[0] = vllm_page(6, 1, 0.1)
    start_first()  # worker 0 restarted: the feed is back
    await wait_for(lambda: a1.metrics.waiting_queue_size == 6 and consumer.connected, timeout=5.0)
    assert any("is back" in r.getMessage() for r in caplog.records)


async def test_a_worker_started_late_has_the_pages_within_one_interval(
    metrics_servers: list[FakeVLLMMetrics], tasks: Tasks, feed: str
) -> None:
    s0 = metrics_servers[0]
    s0.pages[0] = vllm_page(4, 1, 0.1)
    interval = 0.2
    ds0 = Datastore()
    ds0.upsert(Endpoint("a", "127.0.0.1", s0.port))
    first = MetricsScraper(ds0, interval=interval)
    pub = FeedPublisher(feed)
    first.tap = pub.scrape
    tasks.start(pub.run())
    tasks.start(first.run())
    await wait_for(lambda: first.scrapes >= 3)
    ds1 = Datastore()
    a1 = Endpoint("a", "127.0.0.1", s0.port)
    ds1.upsert(a1)
    fed = MetricsScraper(ds1, interval=interval)
    fed.fed = True
    consumer = FeedConsumer(feed, fed, None)
    tasks.start(fed.run())
    tasks.start(consumer.run())
    await wait_for(lambda: consumer.connected)
    connected = asyncio.get_running_loop().time()
    await wait_for(lambda: a1.metrics.waiting_queue_size == 4)
    assert asyncio.get_running_loop().time() - connected <= interval + 0.1  # the next scrape of worker 0
