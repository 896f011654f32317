"""multicluster-kv-cache-utilization-scorer (llm-d-router, Alpha): on a multi-cluster hub, 1 - a cluster's average KV
cache utilization (the `llm-d.ai/multicluster-kv-cache-utilization` attribute multicluster-metrics-extractor writes);
a cluster without it scores 0."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from epp.framework import CycleState, DataKey, Endpoint, InferenceRequest, Plugin, Stability
from epp.framework.keys import MULTICLUSTER_KV_CACHE_UTILIZATION


class MultiClusterKVCacheUtilizationScorer(Plugin):
    type_name = "multicluster-kv-cache-utilization-scorer"
    stability = Stability.ALPHA

    def consumes(self) -> Collection[DataKey[Any]]:
        return (MULTICLUSTER_KV_CACHE_UTILIZATION,)

    def score(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        out = []
        for ep in endpoints:
            util = ep.attributes.get(MULTICLUSTER_KV_CACHE_UTILIZATION)
            out.append(0.0 if util is None else 1.0 - util)
        return out
