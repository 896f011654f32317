"""multicluster-prefix-cache-scorer (llm-d-router, Alpha): prefix-cache-scorer under its multi-cluster name, for a
hub whose endpoints are clusters (the same parameters and behaviour)."""

from __future__ import annotations

from epp.framework import Stability
from epp.plugins.scorers.prefix_cache_scorer import PrefixCacheScorer


class MultiClusterPrefixCacheScorer(PrefixCacheScorer):
    type_name = "multicluster-prefix-cache-scorer"
    stability = Stability.ALPHA
