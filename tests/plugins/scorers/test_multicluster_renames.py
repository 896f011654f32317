"""The pure-renamed multicluster types (llm-d-router: they reuse the stock plugin and only rename the type): each
builds as its stock plugin would, under its own type, and is Alpha (needs --allow-experimental-plugins)."""

from __future__ import annotations

import pytest

from epp.config import ConfigError, parse_config
from epp.datalayer.datastore import Datastore
from epp.framework import Plugin, Stability
from epp.plugins.filters.multicluster_session_affinity_filter import MultiClusterSessionAffinityFilter
from epp.plugins.filters.session_affinity_filter import SessionAffinityFilter
from epp.plugins.producers.approx_prefix_cache_producer import ApproxPrefixCacheProducer
from epp.plugins.producers.multicluster_approx_prefix_cache_producer import MultiClusterApproxPrefixCacheProducer
from epp.plugins.scorers.multicluster_prefix_cache_scorer import MultiClusterPrefixCacheScorer
from epp.plugins.scorers.prefix_cache_scorer import PrefixCacheScorer
from epp.wiring import build_pipeline, known_types, plugin_context
from tests.helpers import build


@pytest.mark.parametrize(
    ("cls", "stock", "params"),
    [
        (MultiClusterPrefixCacheScorer, PrefixCacheScorer, {"matchLengthWeight": 0.5}),
        (MultiClusterSessionAffinityFilter, SessionAffinityFilter, {}),
        (MultiClusterApproxPrefixCacheProducer, ApproxPrefixCacheProducer, {"blockSizeTokens": 32}),
    ],
)
def test_renamed_types(cls: type[Plugin], stock: type[Plugin], params: dict[str, object]) -> None:
    p = build(cls, params)
    assert isinstance(p, stock) and p.type_name == cls.type_name != stock.type_name
    assert cls.type_name in known_types() and cls.stability is Stability.ALPHA
    with pytest.raises(ConfigError, match="unknown parameter 'noSuchParameter'"):
        text = f"plugins:\n- {{type: {cls.type_name}, parameters: {{noSuchParameter: 1}}}}\n"
        build_pipeline(parse_config(text), plugin_context(Datastore()))
