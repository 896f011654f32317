"""Active-active replicas share the precise producer's speculative entries: a pick one replica makes is known to the
other before the engine's KV event arrives, so the next request of the same prefix sticks to the same pod whichever
replica routes it. Two pipelines (two replicas' worth of index and producer) joined by an in-memory channel here; the
Redis channel is tested in tests/datalayer/plugins/test_redis_cross_replica_syncer.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import yaml

from e2e.harness.redis import redis_server
from epp.config import parse_config
from epp.datalayer.datastore import Datastore
from epp.datalayer.plugins.redis_cross_replica_syncer import RedisCrossReplicaSyncer
from epp.framework import (
    ApiKind,
    CrossReplicaMessenger,
    Endpoint,
    InferenceRequest,
    ProfileResult,
    SchedulingResult,
    Usage,
)
from epp.plugins.producers.precise_prefix_cache_producer import (
    MAX_SHARED_KEYS,
    PRECISE_MATCH,
    PrecisePrefixCacheProducer,
)
from epp.tokenization.qwen import QWEN25_MODEL
from epp.wiring import build_pipeline, plugin_context

BS = 16
LONG = "Summarize the following report. " + " ".join(f"Section {i}: the quarterly numbers improved." for i in range(60))


class Replica:
    def __init__(
        self, extra: list[dict[str, Any]] | None = None, data_layer: dict[str, Any] | None = None, **params: Any
    ) -> None:
        self.ds = Datastore()
        self.eps = [Endpoint(f"pod{i}", f"10.0.0.{i}", 8000) for i in range(3)]
        for ep in self.eps:
            self.ds.upsert(ep)
        spec = {
            "type": "precise-prefix-cache-producer",
            "name": "kv",
            "parameters": {"tokenProcessorConfig": {"blockSize": BS, "hashSeed": "42"}, **params},
        }
        ctx = plugin_context(self.ds)
        raw: dict[str, Any] = {"plugins": [spec, *(extra or [])]}
        if data_layer:
            raw["dataLayer"] = data_layer
        self.pipeline = build_pipeline(parse_config(yaml.safe_dump(raw)), ctx)
        self.background = ctx.background
        plugin = self.pipeline.plugins["kv"]
        assert isinstance(plugin, PrecisePrefixCacheProducer)
        self.kv = plugin
        self.sent: list[Any] = []

    async def blocks(self, text: str, rid: str) -> tuple[InferenceRequest, dict[str, int]]:
        req = request(text, rid)
        for producer in self.pipeline.producers:
            await producer.prepare(req, self.eps)
        return req, dict(req.data.require(PRECISE_MATCH.of("kv")).blocks)

    def pick(self, req: InferenceRequest, pod: int) -> None:
        self.kv.pre_request(req, SchedulingResult({"default": ProfileResult([self.eps[pod]])}, "default"))


def request(text: str, rid: str) -> InferenceRequest:
    return InferenceRequest(rid, "/v1/completions", ApiKind.COMPLETIONS, QWEN25_MODEL, QWEN25_MODEL, {}, prompt=text)


def connect(a: Replica, b: Replica) -> None:
    """What a message-carrying syncer does: each replica's messages reach the other."""
    assert isinstance(a.kv, CrossReplicaMessenger) and a.kv.cross_replica_channel() == "speculative:kv"

    def to(dst: Replica, src: Replica) -> Any:
        def send(message: Any) -> None:
            src.sent.append(message)
            dst.kv.cross_replica_receive(message)

        return send

    a.kv.cross_replica_connect(to(b, a))
    b.kv.cross_replica_connect(to(a, b))


async def test_the_other_replica_sees_a_pick_before_the_engine_event() -> None:
    a, b = Replica(), Replica()
    connect(a, b)
    first, blocks = await a.blocks(LONG, "r1")
    assert blocks == {}  # nothing cached anywhere yet
    a.pick(first, 2)
    n = len(first.data.require(PRECISE_MATCH.of("kv")).keys)
    assert n >= 10 and len(a.sent) == 1
    pod, ttl_ms, keys = a.sent[0]
    assert (pod, ttl_ms, len(keys)) == ("10.0.0.2:8000", 2000, n)
    # replica b never routed it, yet its index says pod2 is computing the whole prompt
    second, blocks_b = await b.blocks(LONG + " And one more question.", "r2")
    assert blocks_b.get("10.0.0.2:8000") == n and set(blocks_b) == {"10.0.0.2:8000"}
    assert b.kv.received == 1 and b.kv.refused == 0
    # and b's hit there rests on speculation: the delivered-hits loop does not count it against pod2
    reports: list[str] = []
    b.kv.index.report_delivered = lambda pod, *rest: reports.append(pod)  # type: ignore[method-assign]
    b.kv.response_complete(second, b.eps[2], Usage(prompt_tokens=n * BS, cached_tokens=0, cached_tokens_reported=True))
    assert reports == []


async def test_without_sharing_the_other_replica_does_not_know() -> None:
    a, b = Replica(syncCrossReplicaState=False), Replica(syncCrossReplicaState=False)
    assert a.kv.cross_replica_channel() is None  # the builder connects no syncer to it
    first, _ = await a.blocks(LONG, "r1")
    a.pick(first, 2)
    _, blocks_a = await a.blocks(LONG, "r2")
    _, blocks_b = await b.blocks(LONG, "r2")
    assert blocks_a.get("10.0.0.2:8000", 0) > 0 and blocks_b == {}


async def test_speculation_off_shares_nothing() -> None:
    a = Replica(speculativeIndexing=False)
    assert a.kv.cross_replica_channel() is None


async def test_bad_or_foreign_entries_are_refused() -> None:
    b = Replica()
    good_keys = [1, 2, 3]
    for bad in (
        None,
        "x",
        ["10.0.0.2:8000", 2000],
        ["10.0.0.9:8000", 2000, good_keys],  # not a pod of this pool
        ["10.0.0.2:8000", 0, good_keys],
        ["10.0.0.2:8000", True, good_keys],
        ["10.0.0.2:8000", 2000, []],
        ["10.0.0.2:8000", 2000, [1, "2"]],
        ["10.0.0.2:8000", 2000, [1, -2]],
        ["10.0.0.2:8000", 2000, [1 << 64]],
        ["10.0.0.2:8000", 2000, list(range(MAX_SHARED_KEYS + 1))],
    ):
        b.kv.cross_replica_receive(bad)
    assert (b.kv.received, b.kv.refused) == (0, 11)
    b.kv.cross_replica_receive(["10.0.0.2:8000", 10**9, good_keys])  # TTL capped, applied
    assert b.kv.received == 1
    matches = await b.kv.index.match(good_keys, ["10.0.0.2:8000"])
    assert matches["10.0.0.2:8000"].blocks == 3


async def test_through_redis_as_configured() -> None:
    """The config seam: the builder hands the producer to the redis-cross-replica-syncer, whose channel carries a
    pick from one replica's pipeline to the other's index well before a sync round (10 s here) would."""
    with redis_server() as url:
        xr = {"type": "redis-cross-replica-syncer", "name": "xr", "parameters": {"address": url, "ttl": "30s"}}
        data_layer = {"crossReplicaSyncerPluginRef": "xr", "crossReplicaSyncInterval": "10s"}
        a, b = Replica(extra=[xr], data_layer=data_layer), Replica(extra=[xr], data_layer=data_layer)
        syncer = a.pipeline.plugins["xr"]
        assert isinstance(syncer, RedisCrossReplicaSyncer) and list(syncer.messengers.values()) == [a.kv]
        tasks = [asyncio.create_task(t()) for t in (*a.background, *b.background)]
        try:
            await asyncio.sleep(0.5)  # both subscribed
            first, _ = await a.blocks(LONG, "r1")
            a.pick(first, 1)
            await wait_until(lambda: b.kv.received == 1)
            _, blocks_b = await b.blocks(LONG, "r2")
            assert set(blocks_b) == {"10.0.0.1:8000"}
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def wait_until(cond: Callable[[], bool], timeout: float = 3.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)
