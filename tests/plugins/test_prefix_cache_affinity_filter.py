"""prefix-cache-affinity-filter: sticky set, fall-through, exploration, the TTFT load gate (both sources)."""

from __future__ import annotations

import pytest

from epp.config.loader import ConfigError, parse_config
from epp.datalayer.datastore import Datastore
from epp.framework import (
    INFLIGHT_LOAD,
    PREDICTED_TTFT_MS,
    PREFIX_CACHE_MATCH_INFO,
    CycleState,
    Endpoint,
    InferenceRequest,
    InFlightLoad,
    PluginConfigError,
    PrefixCacheMatchInfo,
)
from epp.plugins.filters.prefix_cache_affinity_filter import PrefixCacheAffinityFilter
from epp.plugins.producers.approx_prefix_cache_producer import ApproxPrefixCacheProducer
from epp.plugins.producers.inflight_load_producer import InFlightLoadProducer
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
    r = InferenceRequest("r", "/v1/completions", "completions", "m", "m", {})
    r.data.put(PREFIX, PrefixCacheMatchInfo(total, 16, matches))
    return r


def names(endpoints: list[Endpoint]) -> list[str]:
    return [e.name for e in endpoints]


def test_keeps_the_endpoints_at_or_above_the_threshold() -> None:
    f = build(PrefixCacheAffinityFilter)
    a, b, c = eps(0, 0, 0)
    assert names(f.filter(S, req({"a": 8, "b": 7, "c": 10}), [a, b, c])) == ["a", "c"]  # 0.8 passes, 0.7 not
    assert names(f.filter(S, req({"a": 5}), [a, b, c])) == ["a", "b", "c"]  # nobody sticky → everyone
    assert names(f.filter(S, InferenceRequest("x", "/", "other", "m", "m", {}), [a, b])) == ["a", "b"]
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


def test_ttft_gate_from_the_latency_predictor() -> None:
    f = build(PrefixCacheAffinityFilter, {"ttftSource": "latencyPredictor", "maxTTFTPenaltyMs": 100})
    a, b, c = eps(0, 0, 0)
    r = req({"a": 10})
    r.data.put(PREDICTED_TTFT_MS.of("predicted-latency-producer"), {"a": 350.0, "b": 200.0})
    assert names(f.filter(S, r, [a, b, c])) == ["a", "b", "c"]  # 150 ms worse than b; c has no prediction
    r.data.put(PREDICTED_TTFT_MS.of("predicted-latency-producer"), {"a": 250.0, "b": 200.0})
    assert names(f.filter(S, r, [a, b, c])) == ["a"]


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
    with pytest.raises(ConfigError, match="predicted-ttft-ms/predicted-latency-producer"):
        build_pipeline(
            parse_config("plugins: [{type: prefix-cache-affinity-filter, parameters: {ttftSource: latencyPredictor}}]"),
            plugin_context(ds),
        )
