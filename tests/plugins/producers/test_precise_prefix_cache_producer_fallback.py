"""precise-prefix-cache-producer's `approximateFallback` (pyepp's default config turns it on): an endpoint whose KV
events have stored nothing is matched from the EPP's routing history (GIE's approximate producer) until its events
arrive; a request the index cannot key is matched from the history for every endpoint."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from epp.config import ConfigError
from epp.framework import (
    PREFIX_CACHE_MATCH_INFO,
    CycleState,
    Endpoint,
    InferenceRequest,
    Metrics,
    ProfileResult,
    SchedulingResult,
)
from epp.plugins.producers.precise_prefix_cache_producer import PrecisePrefixCacheProducer
from epp.plugins.scorers.precise_prefix_cache_scorer import PrecisePrefixCacheScorer
from tests.plugins.producers.test_precise_prefix_cache_producer import (
    BS,
    LONG,
    PARAMS,
    Rig,
    chat_request,
    store_tokens,
    tokens,
)

FALLBACK = {**PARAMS, "approximateFallback": True}


def endpoints() -> list[Endpoint]:
    eps = [Endpoint(f"pod{i}", f"10.0.1.{i}", 8000) for i in range(3)]
    for ep in eps:
        ep.metrics = Metrics(cache_block_size=BS)
    return eps


def producer(params: dict[str, Any]) -> tuple[PrecisePrefixCacheProducer, Rig]:
    rig = Rig([{"type": "precise-prefix-cache-producer", "name": "p", "parameters": params}])
    p = rig.pipeline.plugins["p"]
    assert isinstance(p, PrecisePrefixCacheProducer)
    return p, rig


def matches(rig: Rig, req: InferenceRequest) -> dict[str, float]:
    return dict(req.data.require(PREFIX_CACHE_MATCH_INFO.of("p")).matches)


async def pick(p: PrecisePrefixCacheProducer, req: InferenceRequest, ep: Endpoint) -> None:
    p.pre_request(req, SchedulingResult({"default": ProfileResult([ep])}, "default"))
    await asyncio.sleep(0)  # the history records the pick right after the decision


async def test_endpoints_without_events_are_matched_from_the_routing_history(vllm_kv: Any) -> None:
    p, rig = producer(FALLBACK)
    eps = endpoints()
    first = chat_request(LONG, "r1")
    await rig.prepare(first, eps)
    n = len(tokens(first)) // BS
    assert matches(rig, first) == {}
    await pick(p, first, eps[1])  # no events anywhere: pod1 is remembered as holding the prompt
    # pod0 publishes and holds half the prompt; pod1 publishes nothing (the speculative entry has expired)
    store_tokens(vllm_kv, rig.svc, eps[0].hostport, tokens(first), n // 2, 1000)
    rig.svc.index.clear_pod(eps[1].hostport)
    again = chat_request(LONG, "r2")
    await rig.prepare(again, eps)
    m = matches(rig, again)
    assert m["pod0"] == pytest.approx(n // 2)  # the index, for the pod that publishes
    assert m["pod1"] >= 0.9 * n  # the history, scaled to the index's blocks
    assert "pod2" not in m
    # pod1's events arrive: from now on the index alone speaks for it, and its history is dropped
    store_tokens(vllm_kv, rig.svc, eps[1].hostport, tokens(first), 2, 2000)
    later = chat_request(LONG, "r3")
    await rig.prepare(later, eps)
    assert matches(rig, later)["pod1"] == pytest.approx(2)
    assert p.fallback is not None and p.fallback.index.size("pod1") == 0


async def test_without_the_fallback_an_endpoint_without_events_has_no_match(vllm_kv: Any) -> None:
    p, rig = producer({**PARAMS, "speculativeTTL": "1ms"})
    eps = endpoints()
    first = chat_request(LONG, "r1")
    await rig.prepare(first, eps)
    await pick(p, first, eps[1])
    rig.svc.index.clear_pod(eps[1].hostport)  # the speculative entry, gone
    again = chat_request(LONG, "r2")
    await rig.prepare(again, eps)
    assert matches(rig, again) == {}  # llm-d's behaviour, kept for explicit configs


async def test_a_prompt_longer_than_the_history_is_not_credited_past_it() -> None:
    p, rig = producer(FALLBACK)
    eps = endpoints()
    long = " ".join(f"Paragraph {i}: the committee reviewed the figures and approved them." for i in range(600))
    first = chat_request(long, "r1")
    await rig.prepare(first, eps)
    assert p.fallback is not None and len(long) > 2 * p.fallback.max_blocks * 4 * BS  # twice what it hashes
    await pick(p, first, eps[0])
    again = chat_request(long, "r2")
    await rig.prepare(again, eps)
    info = again.data.require(PREFIX_CACHE_MATCH_INFO.of("p"))
    # the history vouches for its 256 blocks of 16 tokens (4 characters a token), not for the whole prompt
    assert info.matches["pod0"] == pytest.approx(p.fallback.max_blocks)
    assert info.matches["pod0"] < 0.6 * info.total_blocks


async def test_a_request_the_index_cannot_key_is_matched_from_the_history() -> None:
    # no block size configured, learned or scraped: the index cannot key the prompt
    p, rig = producer({**FALLBACK, "tokenProcessorConfig": {"hashSeed": "42"}})
    eps = [Endpoint(f"pod{i}", f"10.0.2.{i}", 8000) for i in range(2)]
    first = chat_request(LONG, "r1")
    await rig.prepare(first, eps)
    assert p.match_key not in first.data
    await pick(p, first, eps[0])
    again = chat_request(LONG, "r2")
    await rig.prepare(again, eps)
    info = again.data.require(PREFIX_CACHE_MATCH_INFO.of("p"))
    assert info.total_blocks > 0 and info.matches == {"pod0": info.total_blocks}
    # an endpoint that leaves the pool takes its history with it
    rig.ds.upsert(eps[0])
    rig.ds.remove(eps[0].name)
    assert p.fallback is not None and p.fallback.index.size("pod0") == 0


async def test_the_legacy_scorer_scores_the_merged_match() -> None:
    rig = Rig([{"type": "precise-prefix-cache-scorer", "name": "p", "parameters": FALLBACK}])
    scorer = rig.pipeline.plugins["p"]
    assert isinstance(scorer, PrecisePrefixCacheScorer)
    eps = [Endpoint(f"pod{i}", f"10.0.3.{i}", 8000) for i in range(2)]
    first = chat_request(LONG, "r1")
    await rig.prepare(first, eps)
    await pick(scorer, first, eps[1])
    again = chat_request(LONG, "r2")
    await rig.prepare(again, eps)
    assert scorer.score(CycleState(), again, eps) == [0.0, 1.0]


def test_approximate_fallback_must_be_a_boolean() -> None:
    with pytest.raises(ConfigError, match="approximateFallback"):
        Rig([{"type": "precise-prefix-cache-producer", "name": "p", "parameters": {"approximateFallback": "yes"}}])
