"""kv-cache-utilization-scorer: 1 - KV cache usage (GIE). Its old name `kv-cache-scorer` is refused, as by
llm-d-router v0.10 and GIE v1.5, which register only this one."""

from __future__ import annotations

from collections.abc import Sequence

from epp.framework import CycleState, Endpoint, InferenceRequest, Plugin


class KVCacheUtilizationScorer(Plugin):
    type_name = "kv-cache-utilization-scorer"

    def score(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        return [1.0 - ep.metrics.kv_cache_usage_percent for ep in endpoints]
