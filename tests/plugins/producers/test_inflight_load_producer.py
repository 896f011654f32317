"""inflight-load-producer: booking at PreRequest, release at first chunk / end, uncached discount, the reaper."""

from __future__ import annotations

import pytest

from epp.config.loader import parse_config
from epp.datalayer.datastore import Datastore
from epp.framework import (
    INFLIGHT_LOAD,
    PREFIX_CACHE_MATCH_INFO,
    TOKENIZED_PROMPT,
    UNCACHED_REQUEST_TOKENS,
    ApiKind,
    Endpoint,
    InferenceRequest,
    PluginConfigError,
    PrefixCacheMatchInfo,
    ProfileResult,
    ResponseChunk,
    SchedulingResult,
    TokenizedPrompt,
)
from epp.plugins.producers.inflight_load_producer import InFlightLoadProducer
from epp.wiring import build_pipeline, plugin_context
from tests.helpers import build


def req(rid: str = "r", tokens: int = 100, max_tokens: int | None = None) -> InferenceRequest:
    r = InferenceRequest(rid, "/v1/completions", ApiKind.COMPLETIONS, "m", "m", {}, max_tokens=max_tokens)
    r.data.put(TOKENIZED_PROMPT, TokenizedPrompt(list(range(tokens))))
    return r


def result(**targets: Endpoint) -> SchedulingResult:
    return SchedulingResult({p: ProfileResult([e]) for p, e in targets.items()}, next(iter(targets)))


def chunk(first: bool = False, end: bool = False) -> ResponseChunk:
    return ResponseChunk(b"x", first, end, 0.0)


def pool() -> tuple[Datastore, Endpoint, Endpoint]:
    ds = Datastore()
    a, b = Endpoint("a", "10.0.0.1", 8000), Endpoint("b", "10.0.0.2", 8000)
    ds.upsert(a)
    ds.upsert(b)
    return ds, a, b


async def test_books_uncached_tokens_and_releases_them_at_the_first_chunk() -> None:
    ds, a, b = pool()
    p = build(InFlightLoadProducer, ctx=plugin_context(ds))
    load_a = a.attributes.get(INFLIGHT_LOAD.of("inflight-load-producer"))
    assert load_a is not None and load_a is p.loads["a"]  # the endpoint carries its live counters
    r = req(tokens=100)
    # the approximate producer says a holds 3 of 4 blocks of 16 tokens (64 indexed tokens, 36 past the index)
    r.data.put(PREFIX_CACHE_MATCH_INFO.of("approx-prefix-cache-producer"), PrefixCacheMatchInfo(4, 16, {"a": 3}))
    await p.prepare(r, [a, b])
    assert r.data.get(UNCACHED_REQUEST_TOKENS.of("inflight-load-producer")) == {"a": 16 + 36, "b": 64 + 36}
    p.pre_request(r, result(default=a))
    assert (load_a.requests, load_a.tokens) == (1, 52)
    p.response_chunk(r, chunk(first=True), a)
    assert (load_a.requests, load_a.tokens) == (1, 0)  # prefill done; the request is still running
    p.response_chunk(r, chunk(), a)
    p.response_chunk(r, chunk(end=True), a)
    assert (load_a.requests, load_a.tokens) == (0, 0)
    p.response_complete(r, a, None)  # the end of the stream after the last chunk releases nothing twice
    assert (load_a.requests, load_a.tokens) == (0, 0) and p.tracked_requests() == 0


async def test_estimated_output_stays_until_the_end_and_prefill_target_leaves_at_first_chunk() -> None:
    ds, a, b = pool()
    p = build(
        InFlightLoadProducer,
        {"addEstimatedOutputTokens": True, "outputRatio": 0.5, "maxEstimatedOutputTokens": 40},
        ctx=plugin_context(ds),
    )
    r = req(tokens=100, max_tokens=30)
    await p.prepare(r, [a, b])
    # output = min(round(100*0.5)=50, client max_tokens 30, cap 40) = 30
    assert r.data.get(UNCACHED_REQUEST_TOKENS.of("inflight-load-producer")) == {"a": 130, "b": 130}
    p.pre_request(r, result(decode=a, prefill=b))
    assert (p.loads["a"].requests, p.loads["a"].tokens) == (1, 130)
    assert (p.loads["b"].requests, p.loads["b"].tokens) == (1, 130)
    p.response_chunk(r, chunk(first=True), a)
    assert (p.loads["a"].requests, p.loads["a"].tokens) == (1, 130)  # output estimate held until the end
    assert (p.loads["b"].requests, p.loads["b"].tokens) == (0, 0)  # the prefill pod is done
    p.response_complete(r, a, None)  # stream ended without a final chunk (client went away)
    assert (p.loads["a"].requests, p.loads["a"].tokens) == (0, 0)
    assert p.estimate_output(100, None) == 40 and p.estimate_output(0, None) == 0


async def test_without_prefix_info_the_whole_prompt_counts_and_text_is_estimated() -> None:
    ds, a, _ = pool()
    p = build(InFlightLoadProducer, ctx=plugin_context(ds))
    r = InferenceRequest("t", "/v1/completions", ApiKind.COMPLETIONS, "m", "m", {}, prompt="x" * 400)
    await p.prepare(r, [a])
    assert r.data.get(UNCACHED_REQUEST_TOKENS.of("inflight-load-producer")) == {"a": 100}


async def test_a_lost_completion_is_reaped_after_the_staleness_timeout() -> None:
    ds, a, _ = pool()
    now = [1000.0]
    p = InFlightLoadProducer("ifl", stale_after=300.0, clock=lambda: now[0])
    ds.subscribe(p)
    lost, live = req("lost"), req("live")
    p.pre_request(lost, result(default=a))
    now[0] += 200
    p.pre_request(live, result(default=a))
    assert (p.loads["a"].requests, p.loads["a"].tokens) == (2, 200)
    now[0] += 150
    p.response_chunk(live, chunk(), a)  # activity keeps the live one
    assert p.sweep() == 1  # the lost one is 350 s old
    assert (p.loads["a"].requests, p.loads["a"].tokens) == (1, 100)
    p.response_complete(lost, a, None)  # a late completion of the reaped request is a no-op
    assert (p.loads["a"].requests, p.loads["a"].tokens) == (1, 100)


async def test_an_endpoint_that_left_and_returned_is_not_decremented_for_its_earlier_life() -> None:
    ds, a, _ = pool()
    p = build(InFlightLoadProducer, ctx=plugin_context(ds))
    old = req("old")
    p.pre_request(old, result(default=a))
    ds.remove("a")
    a2 = Endpoint("a", "10.0.0.1", 8000)
    ds.upsert(a2)
    new = req("new")
    p.pre_request(new, result(default=a2))
    p.response_complete(old, a, None)
    assert (p.loads["a"].requests, p.loads["a"].tokens) == (1, 100)


async def test_cross_replica_state_adds_the_other_replicas_and_can_be_disabled() -> None:
    ds, a, _ = pool()
    p = build(InFlightLoadProducer, ctx=plugin_context(ds))
    p.pre_request(req(), result(default=a))
    assert p.cross_replica_key() == "inflight:inflight-load-producer"
    assert p.cross_replica_snapshot() == {"a": [1, 100], "b": [0, 0]}
    p.cross_replica_update({"a": [2, 500]})
    assert (p.loads["a"].total_requests, p.loads["a"].total_tokens) == (3, 600)
    assert (p.loads["b"].total_requests, p.loads["b"].total_tokens) == (0, 0)
    off = build(InFlightLoadProducer, {"syncCrossReplicaState": False}, ctx=plugin_context(ds))
    assert off.cross_replica_key() is None


def test_parameters_are_checked() -> None:
    with pytest.raises(PluginConfigError, match="outputRatio"):
        build(InFlightLoadProducer, {"outputRatio": -1})
    with pytest.raises(PluginConfigError, match="maxEstimatedOutputTokens"):
        build(InFlightLoadProducer, {"maxEstimatedOutputTokens": -5})


def test_runs_after_the_prefix_and_token_producers_whatever_the_order_in_the_file() -> None:
    cfg = parse_config(
        "plugins:\n- {type: inflight-load-producer}\n- {type: token-load-scorer}\n"
        "- {type: approx-prefix-cache-producer}\n"
    )
    pipeline = build_pipeline(cfg, plugin_context(Datastore()))
    assert [p.name for p in pipeline.producers] == ["approx-prefix-cache-producer", "inflight-load-producer"]
    assert [h.name for h in pipeline.response_streaming] == ["inflight-load-producer"]
