"""endpoint-attribute-scorer: adaptive and fixed ranges."""

from __future__ import annotations

import pytest

from epp.framework import (
    Endpoint,
    PluginConfigError,
)
from epp.plugins.scorers.endpoint_attribute_scorer import EndpointAttributeScorer
from tests.helpers import build
from tests.plugins.support_catalog import S, ep, req


def test_endpoint_attribute_scorer_adaptive_and_fixed_ranges() -> None:
    lower = build(
        EndpointAttributeScorer,
        {"attributeKey": "num_requests_waiting", "algorithm": {"type": "linear_lower_is_better"}},
    )
    e = [ep(1, waiting=0), ep(2, waiting=5), ep(3, waiting=10), Endpoint("e4", "10.0.0.4", 8000)]
    assert lower.score(S, req(), e) == [1.0, 0.5, 0.0, 0.0]
    assert lower.score(S, req(), [ep(1, waiting=4), ep(2, waiting=4)]) == [1.0, 1.0]
    fixed = build(
        EndpointAttributeScorer,
        {
            "attributeKey": "kv_cache_usage_perc",
            "algorithm": {"type": "linear_higher_is_better", "normalization": {"fixedRange": {"min": 0.0, "max": 0.5}}},
        },
    )
    assert fixed.score(S, req(), [ep(1, kv=0.25), ep(2, kv=0.9)]) == [0.5, 1.0]
    with pytest.raises(PluginConfigError, match="greater than min"):
        build(
            EndpointAttributeScorer,
            {
                "attributeKey": "x",
                "algorithm": {"type": "linear_lower_is_better", "normalization": {"fixedRange": {"min": 1, "max": 1}}},
            },
        )
