"""slo-headroom-tier-filter: keeps the tier of endpoints with SLO headroom."""

from __future__ import annotations

import pytest

from epp.framework import (
    CycleState,
    LatencyPredictionInfo,
)
from epp.plugins.filters.slo_headroom_tier_filter import SLOHeadroomTierFilter
from tests.helpers import build
from tests.plugins.support_latency import INFO, endpoints, info, request


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
