"""prefix-cache-affinity-filter: sticky set, fall-through, exploration, the TTFT load gate (both sources)."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from epp.config.loader import ConfigError, parse_config
from epp.datalayer.datastore import Datastore
from epp.framework import (
    INFLIGHT_LOAD,
    LATENCY_PREDICTION_INFO,
    PREFIX_CACHE_MATCH_INFO,
    ApiKind,
    CycleState,
    Endpoint,
    InferenceRequest,
    InFlightLoad,
    LatencyPrediction,
    LatencyPredictionInfo,
    Metrics,
    PluginConfigError,
    PrefixCacheMatchInfo,
    ProfileResult,
    ResponseChunk,
    SchedulingResult,
)
from epp.plugins.filters.prefix_cache_affinity_filter import PrefixCacheAffinityFilter
from epp.plugins.producers.approx_prefix_cache_producer import ApproxPrefixCacheProducer
from epp.plugins.producers.inflight_load_producer import InFlightLoadProducer
from epp.plugins.producers.predicted_latency_producer import PredictedLatencyProducer
from epp.wiring import build_pipeline, plugin_context
from tests.helpers import build

S = CycleState()
PREFIX = PREFIX_CACHE_MATCH_INFO.of("approx-prefix-cache-producer")
LOAD = INFLIGHT_LOAD.of("inflight-load-producer")


def eps(*loads: int) -> list[Endpoint]:
    out = []
    for i, tokens in enumerate(loads):
        e = Endpoint("abcdef"[i], f"10.0.0.{i + 1}", 8000)
        e.attributes.put(LOAD, InFlightLoad(tokens=tokens))
        out.append(e)
    return out


def req(matches: dict[str, float], total: int = 10) -> InferenceRequest:
    r = InferenceRequest("r", "/v1/completions", ApiKind.COMPLETIONS, "m", "m", {})
    r.data.put(PREFIX, PrefixCacheMatchInfo(total, 16, matches))
    return r


def names(endpoints: list[Endpoint]) -> list[str]:
    return [e.name for e in endpoints]


def test_keeps_the_endpoints_at_or_above_the_threshold() -> None:
    f = build(PrefixCacheAffinityFilter)
    a, b, c = eps(0, 0, 0)
    assert names(f.filter(S, req({"a": 8, "b": 7, "c": 10}), [a, b, c])) == ["a", "c"]  # 0.8 passes, 0.7 not
    assert names(f.filter(S, req({"a": 5}), [a, b, c])) == ["a", "b", "c"]  # nobody sticky → everyone
    assert names(f.filter(S, InferenceRequest("x", "/", ApiKind.OTHER, "m", "m", {}), [a, b])) == ["a", "b"]
    assert names(build(PrefixCacheAffinityFilter, {"affinityThreshold": 0}).filter(S, req({"a": 10}), [a, b])) == [
        "a",
        "b",
    ]


def test_ttft_gate_breaks_stickiness_when_the_sticky_pods_are_too_loaded() -> None:
    f = build(PrefixCacheAffinityFilter, {"maxTTFTPenaltyMs": 1000, "peakPrefillThroughput": 10000})
    r = req({"a": 10})
    a, b = eps(10000, 0)  # a: 1000 ms of queued prefill, b idle: penalty exactly 1000 → still sticky
    assert names(f.filter(S, r, [a, b])) == ["a"]
    a, b = eps(10001, 0)  # just over
    assert names(f.filter(S, r, [a, b])) == ["a", "b"] and f.gate_breaks == 1
    a, b = eps(20000, 15000)  # 2000 vs 1500 ms: within the penalty
    assert names(f.filter(S, r, [a, b])) == ["a"]
    a.attributes.get(LOAD).remote_tokens = 20000  # type: ignore[union-attr]  # other replicas' load counts
    assert names(f.filter(S, r, [a, b])) == ["a", "b"]
    always = build(PrefixCacheAffinityFilter, {"maxTTFTPenaltyMs": 0})
    assert names(always.filter(S, r, eps(10**9, 0))) == ["a"]  # 0 = always stick


def test_each_decision_is_logged_at_debug_as_llm_ds_filter_logs_it(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    f = build(PrefixCacheAffinityFilter, {"maxTTFTPenaltyMs": 1000, "peakPrefillThroughput": 10000})
    a, b = eps(0, 0)
    f.filter(S, req({"a": 10}), [a, b])  # INFO: not logged
    caplog.set_level(logging.DEBUG, logger="epp.plugins.filters.prefix_cache_affinity_filter")
    f.filter(S, req({"a": 9}), [a, b])
    f.filter(S, req({"a": 1}), [a, b])
    f.filter(S, req({"a": 10}), eps(20001, 0))
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "request r: prefix-cache-affinity-filter: narrowed to sticky a of 2 (matched blocks {'a': 9, 'b': 0} of 10)",
        "request r: prefix-cache-affinity-filter: no sticky endpoints (total 2)",
        "request r: prefix-cache-affinity-filter: TTFT load gate broken (best sticky 2000 ms, other 0 ms)",
    ]


def predicted(ttfts: dict[str, float]) -> LatencyPredictionInfo:
    return LatencyPredictionInfo({n: LatencyPrediction(t, 0.0, True, True, -t, 0.0) for n, t in ttfts.items()})


def test_ttft_gate_from_the_latency_predictor() -> None:
    f = build(PrefixCacheAffinityFilter, {"ttftSource": "latencyPredictor", "maxTTFTPenaltyMs": 100})
    a, b, c = eps(0, 0, 0)
    r = req({"a": 10})
    r.data.put(LATENCY_INFO, predicted({"a": 350.0, "b": 200.0}))
    assert names(f.filter(S, r, [a, b, c])) == ["a", "b", "c"]  # 150 ms worse than b; c has no prediction
    r.data.put(LATENCY_INFO, predicted({"a": 250.0, "b": 200.0}))
    assert names(f.filter(S, r, [a, b, c])) == ["a"]
    r.data.put(LATENCY_INFO, predicted({"b": 200.0}))  # the sticky pod has no prediction: never the fastest
    assert names(f.filter(S, r, [a, b, c])) == ["a", "b", "c"]
    r.data.put(LATENCY_INFO, predicted({}))  # no predictions (a cold model): no signal, stickiness holds
    assert names(f.filter(S, r, [a, b, c])) == ["a"]


LATENCY_INFO = LATENCY_PREDICTION_INFO.of("predicted-latency-producer")
PREDICTOR_CONFIG = """
plugins:
- type: predicted-latency-producer
  parameters: {minSamples: 8}
- type: prefix-cache-affinity-filter
  parameters: {ttftSource: latencyPredictor, maxTTFTPenaltyMs: 100}
"""


def test_the_gate_uses_the_predicted_latency_producers_ttft_and_holds_while_it_is_cold() -> None:
    """The anchors' wiring: the producer's LATENCY_PREDICTION_INFO reaches the filter through the typed key. The
    producer learns e2e latency = 50 ms + 40 ms per waiting request + 100 ms per 1000 uncached tokens."""
    pipeline = build_pipeline(parse_config(PREDICTOR_CONFIG), plugin_context(Datastore()))
    prod = pipeline.plugins["predicted-latency-producer"]
    f = pipeline.plugins["prefix-cache-affinity-filter"]
    assert isinstance(prod, PredictedLatencyProducer) and isinstance(f, PrefixCacheAffinityFilter)
    assert LATENCY_INFO in f.consumes() and LATENCY_INFO in prod.produces()
    clock = [1000.0]
    prod.clock = lambda: clock[0]
    a, b = Endpoint("a", "10.0.0.1", 8000), Endpoint("b", "10.0.0.2", 8000)

    def request(rid: str, cached_on_a: bool) -> InferenceRequest:
        r = InferenceRequest(rid, "/v1/completions", ApiKind.COMPLETIONS, "m", "m", {})
        r.data.put(PREFIX, PrefixCacheMatchInfo(64, 16, {"a": 64} if cached_on_a else {}))  # 1024 tokens
        return r

    def set_waiting(wa: int, wb: int) -> None:
        a.metrics = Metrics(waiting_queue_size=wa, update_time=time.monotonic())
        b.metrics = Metrics(waiting_queue_size=wb, update_time=time.monotonic())

    set_waiting(10, 0)  # a is far slower than b, but nothing is learned yet
    cold = request("cold", True)
    asyncio.run(prod.prepare(cold, [a, b]))
    assert cold.data.require(LATENCY_INFO).predictions == {}
    assert names(f.filter(S, cold, [a, b])) == ["a"] and f.gate_breaks == 0

    rng = random.Random(4)
    for i in range(60):  # one request at a time, to either pod, cached or not, at random queue depths
        set_waiting(rng.randint(0, 10), rng.randint(0, 10))
        ep = rng.choice([a, b])
        r = request(f"t{i}", rng.random() < 0.5)
        asyncio.run(prod.prepare(r, [a, b]))
        prod.pre_request(r, SchedulingResult({"default": ProfileResult([ep])}, "default"))
        uncached = 0 if r.data.require(PREFIX).matches.get(ep.name) else 1024
        clock[0] += (50 + 40 * ep.metrics.waiting_queue_size + 100 * uncached / 1000) / 1000
        prod.response_chunk(r, ResponseChunk(b"{}", True, True, clock[0]), ep)
        prod.response_complete(r, ep, None)
        clock[0] += 1

    set_waiting(10, 0)  # a: 50 + 400 = 450 ms (cached); b: 50 + 102 = 152 ms: 298 ms > the 100 ms penalty
    warm = request("warm", True)
    asyncio.run(prod.prepare(warm, [a, b]))
    preds = warm.data.require(LATENCY_INFO).predictions
    assert preds["a"].ttft_ms == pytest.approx(450, rel=0.05) and preds["b"].ttft_ms == pytest.approx(152.4, rel=0.05)
    assert names(f.filter(S, warm, [a, b])) == ["a", "b"] and f.gate_breaks == 1
    set_waiting(3, 0)  # a: 170 ms, b: 152 ms: within the penalty, the cache wins
    near = request("near", True)
    asyncio.run(prod.prepare(near, [a, b]))
    assert names(f.filter(S, near, [a, b])) == ["a"] and f.gate_breaks == 1


def test_exploration_skips_the_gate_with_its_probability() -> None:
    f = build(PrefixCacheAffinityFilter, {"explorationProbability": 0.25})
    a, b = eps(0, 0)
    rolls = iter([0.1, 0.3])
    f.rng = lambda: next(rolls)
    assert names(f.filter(S, req({"a": 10}), [a, b])) == ["a", "b"]
    assert names(f.filter(S, req({"a": 10}), [a, b])) == ["a"]


def test_parameters_and_producers() -> None:
    with pytest.raises(PluginConfigError, match="affinityThreshold"):
        build(PrefixCacheAffinityFilter, {"affinityThreshold": 1.5})
    with pytest.raises(PluginConfigError, match="explorationProbability"):
        build(PrefixCacheAffinityFilter, {"explorationProbability": 2})
    with pytest.raises(PluginConfigError, match="ttftSource"):
        build(PrefixCacheAffinityFilter, {"ttftSource": "magic"})
    with pytest.raises(PluginConfigError, match="peakPrefillThroughput"):
        build(PrefixCacheAffinityFilter, {"peakPrefillThroughput": 0})
    build(PrefixCacheAffinityFilter, {"peakPrefillThroughput": 0, "maxTTFTPenaltyMs": 0})  # gate off: allowed
    ds = Datastore()
    pipeline = build_pipeline(parse_config("plugins: [{type: prefix-cache-affinity-filter}]"), plugin_context(ds))
    assert isinstance(pipeline.plugins["approx-prefix-cache-producer"], ApproxPrefixCacheProducer)
    assert isinstance(pipeline.plugins["inflight-load-producer"], InFlightLoadProducer)
    pipeline = build_pipeline(  # the predictor gate adds the producer it reads, as llm-d's default producers do
        parse_config("plugins: [{type: prefix-cache-affinity-filter, parameters: {ttftSource: latencyPredictor}}]"),
        plugin_context(ds),
    )
    assert isinstance(pipeline.plugins["predicted-latency-producer"], PredictedLatencyProducer)
    assert "inflight-load-producer" not in pipeline.plugins
    with pytest.raises(ConfigError, match="latency-prediction-info/mine"):
        build_pipeline(
            parse_config(
                "plugins: [{type: prefix-cache-affinity-filter, parameters: "
                "{ttftSource: latencyPredictor, latencyPredictionInfoProducerName: mine}}]"
            ),
            plugin_context(ds),
        )
