"""latency-scorer: lower predicted latency wins; SLO strategies, idle preference, composite fallback."""

from __future__ import annotations

import pytest

from epp.framework import (
    CycleState,
    Endpoint,
    InferenceRequest,
    LatencyPredictionInfo,
)
from epp.plugins.scorers.latency_scorer import LatencyScorer
from tests.helpers import build
from tests.plugins.support_latency import INFO, endpoints, info, request


def scored(scorer: LatencyScorer, req: InferenceRequest, eps: list[Endpoint]) -> dict[str, float]:
    return {ep.name: s for ep, s in zip(eps, scorer.score(CycleState(), req, eps), strict=True)}


def test_scorer_prefers_lower_predicted_latency_without_slo() -> None:
    eps = endpoints(3)
    scorer = build(LatencyScorer)
    req = request("r", 100)
    req.data.put(INFO, info({"pod-0": (300, 0, -300, 0), "pod-1": (120, 0, -120, 0), "pod-2": (200, 0, -200, 0)}))
    s = scored(scorer, req, eps)
    assert s["pod-1"] > s["pod-2"] > s["pod-0"]
    assert s == {"pod-1": 1.01, "pod-2": 0.56, "pod-0": 0.01}  # llm-d: int((1 - n) * 100) + 1, over 100


def test_scorer_slo_strategies_idle_preference_and_composite_fallback() -> None:
    eps = endpoints(3)
    req = request("r", 100)
    # pod-0 and pod-1 meet the SLO (headroom 50 and 10 ms), pod-2 misses it
    req.data.put(
        INFO, info({"pod-0": (150, 5, 50, 5), "pod-1": (190, 5, 10, 5), "pod-2": (260, 5, -60, 5)}, has_slo=True)
    )
    least = scored(build(LatencyScorer, {"headroomSelectionStrategy": "least"}), req, eps)
    most = scored(build(LatencyScorer, {"headroomSelectionStrategy": "most"}), req, eps)
    assert least["pod-1"] > least["pod-0"] and least["pod-2"] == 0  # bin-packing: closest to the boundary
    assert most["pod-0"] > most["pod-1"] and most["pod-2"] == 0
    # all miss: the idle endpoint (nothing dispatched) wins over lower predicted latency
    idle = info({"pod-0": (300, 5, -100, 5), "pod-1": (250, 5, -50, 5)}, has_slo=True)
    idle.predictions["pod-0"].dispatched = 0
    req.data.put(INFO, idle)
    s = scored(build(LatencyScorer), req, eps[:2])
    assert s["pod-0"] > 0 and s["pod-1"] == 0
    # no predictions (cold model): llm-d's composite of free KV, relative queue and prefix match
    eps[0].metrics.kv_cache_usage_percent, eps[0].metrics.waiting_queue_size = 0.5, 4
    eps[1].metrics.kv_cache_usage_percent = 0.1
    req = request("cold", 160, {"pod-2": 10})
    req.data.put(INFO, LatencyPredictionInfo())
    s = scored(build(LatencyScorer), req, eps)
    assert s == {"pod-0": pytest.approx(0.17), "pod-1": pytest.approx(0.63), "pod-2": pytest.approx(1.0)}
