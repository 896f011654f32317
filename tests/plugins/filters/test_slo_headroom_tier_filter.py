"""slo-headroom-tier-filter: keeps the tier of endpoints with SLO headroom."""

from __future__ import annotations

import time

import pytest

from epp.framework import (
    LATENCY_PREDICTION_INFO,
    PREFIX_CACHE_MATCH_INFO,
    TOKENIZED_PROMPT,
    CycleState,
    Endpoint,
    InferenceRequest,
    LatencyPrediction,
    LatencyPredictionInfo,
    Metrics,
    PrefixCacheMatchInfo,
    TokenizedPrompt,
)
from epp.plugins.filters.slo_headroom_tier_filter import SLOHeadroomTierFilter
from tests.helpers import build

PREFIX = PREFIX_CACHE_MATCH_INFO.of("approx-prefix-cache-producer")


INFO = LATENCY_PREDICTION_INFO.of("predicted-latency-producer")


def endpoints(n: int, **metrics: float) -> list[Endpoint]:
    eps = []
    for i in range(n):
        ep = Endpoint(f"pod-{i}", f"10.0.0.{i + 1}", 8000)
        ep.metrics = Metrics(update_time=time.monotonic(), **metrics)  # type: ignore[arg-type]
        eps.append(ep)
    return eps


def request(
    rid: str, prompt: int, matches: dict[str, float] | None = None, headers: dict[str, str] | None = None
) -> InferenceRequest:
    req = InferenceRequest(rid, "/v1/completions", "completions", "m", "m", {}, headers=headers or {}, stream=True)
    req.data.put(TOKENIZED_PROMPT, TokenizedPrompt(list(range(prompt))))
    req.data.put(PREFIX, PrefixCacheMatchInfo(prompt // 16, 16, dict(matches or {})))
    return req


def info(
    preds: dict[str, tuple[float, float, float, float]], has_slo: bool = False, dispatched: int = 1
) -> LatencyPredictionInfo:
    """name -> (ttft, tpot, ttft_headroom, tpot_headroom)"""
    return LatencyPredictionInfo(
        {n: LatencyPrediction(t, p, th >= 0, ph >= 0, th, ph, dispatched) for n, (t, p, th, ph) in preds.items()},
        has_slo,
    )


def test_slo_headroom_tier_filter() -> None:
    eps = endpoints(3)
    req = request("r", 100)
    req.data.put(INFO, info({"pod-0": (150, 5, 50, 5), "pod-1": (260, 5, -60, 5)}, has_slo=True))
    f = build(SLOHeadroomTierFilter, {"epsilonExploreNeg": 0.0})
    assert [e.name for e in f.filter(CycleState(), req, eps)] == ["pod-0"]
    always_explore = build(SLOHeadroomTierFilter, {"epsilonExploreNeg": 1.0})
    assert [e.name for e in always_explore.filter(CycleState(), req, eps)] == ["pod-1", "pod-2"]  # + unpredicted
    req.data.put(INFO, LatencyPredictionInfo())
    assert f.filter(CycleState(), req, eps) == eps  # no predictions: no-op
    from epp.framework import PluginConfigError

    with pytest.raises(PluginConfigError, match="epsilonExploreNeg"):
        build(SLOHeadroomTierFilter, {"epsilonExploreNeg": 2})
