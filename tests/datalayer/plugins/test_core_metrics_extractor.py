"""core-metrics-extractor: the prefix-cache specs it reads and the engine config keys it accepts."""

from __future__ import annotations

import pytest

from epp.framework import Endpoint


def test_core_metrics_extractor_prefix_cache_specs() -> None:
    from epp.datalayer.plugins.core_metrics_extractor import CoreMetricsExtractorPlugin
    from tests.helpers import build

    spec = {"name": "vllm", "queuedRequestsSpec": "w", "runningRequestsSpec": "r", "kvUsageSpec": "k"}
    spec |= {"prefixCacheQueriesSpec": "my_queries_total", "prefixCacheHitsSpec": 'my_hits_total{tier="gpu"}'}
    plugin = build(CoreMetricsExtractorPlugin, {"engineConfigs": [spec]})
    page = 'w 0\nmy_queries_total 90\nmy_hits_total{tier="gpu"} 30\nmy_hits_total{tier="cpu"} 5\n'
    m = plugin.extractor.extract(page, Endpoint("p", "10.0.0.1", 8000))
    assert (m.prefix_cache_queries, m.prefix_cache_hits) == (90.0, 30.0)


def test_core_metrics_extractor_refuses_an_unknown_engine_config_key() -> None:
    """A misspelt spec in an engineConfigs entry was ignored, and the engine silently read no such family."""
    from epp.datalayer.plugins.core_metrics_extractor import CoreMetricsExtractorPlugin
    from epp.framework import PluginConfigError
    from tests.helpers import build

    spec = {"name": "vllm", "queuedRequestsSpec": "w", "kvUsageSpec": "k", "prefixCacheHitSpec": "hits_total"}
    with pytest.raises(PluginConfigError, match=r"engineConfigs\[0\]: unknown key 'prefixCacheHitSpec'"):
        build(CoreMetricsExtractorPlugin, {"engineConfigs": [spec]})
