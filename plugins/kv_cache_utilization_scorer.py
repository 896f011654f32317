"""kv-cache-utilization-scorer: 1 - KV cache usage (GIE; formerly kv-cache-scorer)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from epp.framework import CycleState, Endpoint, InferenceRequest, Params, Plugin, register


@register("kv-cache-utilization-scorer", "kv-cache-scorer")
class KVCacheUtilizationScorer(Plugin):
    @classmethod
    def from_config(cls, name: str, parameters: dict[str, Any], context: Any) -> KVCacheUtilizationScorer:
        Params(name, parameters)
        return cls(name)

    def score(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        return [1.0 - ep.metrics.kv_cache_usage_percent for ep in endpoints]
