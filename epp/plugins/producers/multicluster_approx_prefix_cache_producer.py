"""multicluster-approx-prefix-cache-producer (llm-d-router, Alpha): approx-prefix-cache-producer under its
multi-cluster name: a hub's record of which cluster it sent each prompt prefix to (the same parameters)."""

from __future__ import annotations

from epp.framework import Stability
from epp.plugins.producers.approx_prefix_cache_producer import ApproxPrefixCacheProducer


class MultiClusterApproxPrefixCacheProducer(ApproxPrefixCacheProducer):
    type_name = "multicluster-approx-prefix-cache-producer"
    stability = Stability.ALPHA
