"""kv-cache-utilization-scorer and running-requests-size-scorer against their reference formulas (llm-d-router
v0.10 pkg/epp/framework/plugins/scheduling/scorer/kvcacheutilization, runningrequests)."""

from __future__ import annotations

from epp.plugins.scorers.kv_cache_utilization_scorer import KVCacheUtilizationScorer
from epp.plugins.scorers.running_requests_size_scorer import RunningRequestsSizeScorer
from tests.plugins.scorers.support import S, ep, req


def test_kv_and_running_scorers() -> None:
    eps = [ep("a", kv_cache_usage_percent=0.25), ep("b", kv_cache_usage_percent=1.0)]
    assert KVCacheUtilizationScorer("kv").score(S, req(), eps) == [0.75, 0.0]
    eps = [ep("a", running_requests_size=2), ep("b", running_requests_size=6), ep("c", running_requests_size=4)]
    assert RunningRequestsSizeScorer("r").score(S, req(), eps) == [1.0, 0.0, 0.5]
