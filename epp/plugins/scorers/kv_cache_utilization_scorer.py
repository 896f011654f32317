"""kv-cache-utilization-scorer: 1 - KV cache usage (GIE; formerly kv-cache-scorer)."""

from __future__ import annotations

from collections.abc import Sequence

from epp.framework import CycleState, Endpoint, InferenceRequest, Plugin


class KVCacheUtilizationScorer(Plugin):
    type_name = "kv-cache-utilization-scorer"
    aliases = ("kv-cache-scorer",)

    def score(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        return [1.0 - ep.metrics.kv_cache_usage_percent for ep in endpoints]
