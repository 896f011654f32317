"""p2p-source-producer: the KV source peer within one block of the best cache, spread by queue and request id."""

from __future__ import annotations

import random
import time
import uuid
from collections import Counter

import pytest

from epp.framework import (
    PREFIX_CACHE_MATCH_INFO,
    UPSTREAM_HEADERS,
    ApiKind,
    Endpoint,
    InferenceRequest,
    Metrics,
    PluginConfigError,
    PrefixCacheMatchInfo,
    ProfileResult,
    SchedulingResult,
)
from epp.plugins.producers.p2p_source_producer import P2PSourceProducer, fnv1a32
from tests.helpers import build

KEY = PREFIX_CACHE_MATCH_INFO.of("precise-prefix-cache-producer")


def ep(i: int, waiting: int = 0) -> Endpoint:
    e = Endpoint(f"e{i}", f"10.0.0.{i}", 8000)
    e.metrics = Metrics(waiting_queue_size=waiting, update_time=time.monotonic())
    return e


def req(rid: str, matches: dict[str, float]) -> InferenceRequest:
    r = InferenceRequest(rid, "/v1/completions", ApiKind.COMPLETIONS, "m", "m", {})
    r.data.put(KEY, PrefixCacheMatchInfo(total_blocks=100, block_size_tokens=64, matches=matches))
    return r


def producer(**params: object) -> P2PSourceProducer:
    return build(P2PSourceProducer, {"prefixMatchInfoProducerName": "precise-prefix-cache-producer", **params})


def test_fnv1a_matches_go() -> None:
    assert fnv1a32("") == 0x811C9DC5 and fnv1a32("a") == 0xE40C292C


async def test_header_names_a_peer_that_out_caches_the_computing_pod() -> None:
    p = producer(minCachedTokenDelta=2048)
    e1, e2, e3 = ep(1), ep(2), ep(3)
    r = req("r1", {"e1": 50, "e2": 10})  # e1 caches 3200 tokens, e2 640
    await p.prepare(r, [e1, e2, e3])
    p.pre_request(r, SchedulingResult({"default": ProfileResult([e3])}, "default"))
    assert r.data.get(UPSTREAM_HEADERS) == {"x-kv-cache-source-host-port": "10.0.0.1:8000"}
    # the computing pod is the cache holder: no pull
    r2 = req("r2", {"e1": 50})
    await p.prepare(r2, [e1, e3])
    p.pre_request(r2, SchedulingResult({"default": ProfileResult([e1])}, "default"))
    assert r2.data.get(UPSTREAM_HEADERS) is None
    # the computing pod holds almost as much: under minCachedTokenDelta
    r3 = req("r3", {"e1": 50, "e3": 30})
    await p.prepare(r3, [e1, e3])
    p.pre_request(r3, SchedulingResult({"default": ProfileResult([e3])}, "default"))
    assert r3.data.get(UPSTREAM_HEADERS) is None


async def test_the_prefill_pick_is_the_computing_pod() -> None:
    p = producer()
    e1, e2, e3 = ep(1), ep(2), ep(3)
    r = req("r", {"e1": 20, "e2": 20})
    await p.prepare(r, [e1, e2, e3])
    result = SchedulingResult({"decode": ProfileResult([e3]), "prefill": ProfileResult([e2])}, "decode")
    p.pre_request(r, result)
    got = (r.data.get(UPSTREAM_HEADERS) or {}).get("x-kv-cache-source-host-port")
    assert got in (None, "10.0.0.1:8000") and got != "10.0.0.2:8000"


async def test_sampling_spreads_over_the_one_block_band_weighted_by_queue() -> None:
    p = producer()
    idle, busy, behind = ep(1, waiting=0), ep(2, waiting=3), ep(3)
    picks: Counter[str] = Counter()
    rng = random.Random(7)
    for _ in range(2000):
        rid = str(uuid.UUID(int=rng.getrandbits(128), version=4))  # request ids are UUIDs
        r = req(rid, {"e1": 40, "e2": 39.5, "e3": 30})  # e3 is more than a block behind
        await p.prepare(r, [idle, busy, behind])
        p.pre_request(r, SchedulingResult({"d": ProfileResult([ep(9)])}, "d"))
        picks[(r.data.get(UPSTREAM_HEADERS) or {}).get("x-kv-cache-source-host-port", "")] += 1
    assert "10.0.0.3:8000" not in picks
    assert picks["10.0.0.1:8000"] / picks["10.0.0.2:8000"] == pytest.approx(4.0, rel=0.25)  # 1/(1+0) : 1/(1+3)


def test_parameters() -> None:
    with pytest.raises(PluginConfigError, match="minCachedTokenDelta"):
        producer(minCachedTokenDelta=0)
