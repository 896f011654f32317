"""utilization-detector: the saturation formula, its filter and fail-open, bad parameters."""

from __future__ import annotations

import time

import pytest

from epp.framework import Endpoint, Metrics, PluginConfigError
from epp.plugins.saturation.utilization_detector import UtilizationDetector
from tests.helpers import build
from tests.plugins.support_pickers_filters import R, S


def with_metrics(q: int, kv: float, age: float = 0.0) -> Endpoint:
    e = Endpoint(f"q{q}kv{kv}age{age}", "10.0.0.9", 8000)
    e.metrics = Metrics(waiting_queue_size=q, kv_cache_usage_percent=kv, update_time=time.monotonic() - age)
    return e


def test_utilization_detector_saturation_formula() -> None:
    d = build(UtilizationDetector, name="u", parameters={})  # queue 5, kv 0.8, staleness 200ms
    assert d.saturation([]) == 1.0
    # max(2/5, 0.4/0.8) = 0.5 ; max(10/5, 0) = 2.0 → mean 1.25
    assert d.saturation([with_metrics(2, 0.4), with_metrics(10, 0.0)]) == pytest.approx(1.25)
    assert d.saturation([with_metrics(0, 0.0, age=1.0)]) == 1.0  # stale = saturated
    never = Endpoint("n", "10.0.0.8", 8000)
    assert d.saturation([never, with_metrics(0, 0.0)]) == 0.5
    d2 = build(UtilizationDetector, name="u", parameters={"queueDepthThreshold": 10, "kvCacheUtilThreshold": 0.5})
    assert d2.saturation([with_metrics(5, 0.2)]) == pytest.approx(0.5)


def test_utilization_detector_filter_and_fail_open() -> None:
    d = build(UtilizationDetector, name="u", parameters={"headroom": 0.2})  # q limit 6, kv limit 0.96
    ok, busy, full, stale = with_metrics(5, 0.5), with_metrics(6, 0.1), with_metrics(0, 0.97), with_metrics(0, 0, 5)
    assert d.filter(S, R, [ok, busy, full, stale]) == [ok]
    assert d.filter(S, R, [busy, stale]) == [busy, stale]  # everything dropped → fail open


@pytest.mark.parametrize(
    ("params", "key"),
    [
        ({"queueDepthThreshold": 0}, "queueDepthThreshold"),
        ({"kvCacheUtilThreshold": 0}, "kvCacheUtilThreshold"),
        ({"kvCacheUtilThreshold": 1.5}, "kvCacheUtilThreshold"),
        ({"metricsStalenessThreshold": "soon"}, "metricsStalenessThreshold"),
        ({"headroom": -1}, "headroom"),
    ],
)
def test_utilization_detector_bad_parameters(params: dict[str, object], key: str) -> None:
    with pytest.raises(PluginConfigError) as ei:
        build(UtilizationDetector, name="u", parameters=params)
    assert ei.value.key == key and key in str(ei.value)
