"""endpoint-attribute-filter: threshold, missing attributes and the fallback."""

from __future__ import annotations

import pytest

from epp.framework import (
    DataKey,
    Endpoint,
    PluginConfigError,
)
from epp.plugins.filters.endpoint_attribute_filter import EndpointAttributeFilter
from tests.helpers import build
from tests.plugins.support_catalog import S, ep, req


def test_endpoint_attribute_filter_threshold_missing_and_fallback() -> None:
    f = build(
        EndpointAttributeFilter,
        {
            "attribute": "num_requests_running",
            "algorithm": {"type": "threshold", "threshold": {"operator": "LessThan", "value": 10}},
        },
    )
    unscraped = Endpoint("e9", "10.0.0.9", 8000)
    assert [x.name for x in f.filter(S, req(), [ep(1, running=3), ep(2, running=10), unscraped])] == ["e1", "e9"]
    strict = build(
        EndpointAttributeFilter,
        {
            "attribute": "gpu_util",
            "producer": "dcgm-extractor",
            "onMissing": "Fail",
            "fallbackOnEmpty": True,
            "algorithm": {"type": "threshold", "threshold": {"operator": "GreaterThanOrEqual", "value": 0.5}},
        },
    )
    a, b = ep(1), ep(2)
    a.attributes.put(DataKey[float]("gpu_util").of("dcgm-extractor"), 0.7)
    assert strict.filter(S, req(), [a, b]) == [a]
    assert strict.filter(S, req(), [b]) == [b]  # nothing passes: fallbackOnEmpty
    with pytest.raises(PluginConfigError, match="operator"):
        build(EndpointAttributeFilter, {"attribute": "x", "algorithm": {"type": "threshold", "threshold": {}}})
    with pytest.raises(PluginConfigError, match="set 'producer'"):
        build(EndpointAttributeFilter, {"attribute": "a/b", "algorithm": {"type": "threshold"}})
