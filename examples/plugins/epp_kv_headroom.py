"""kv-headroom-scorer: an example pyepp plugin. Prefers endpoints with free KV cache: 1.0 when it is empty,
falling linearly to 0 at `threshold` usage (and 0 past it, however short the endpoint's queue)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Self

from epp.framework import CycleState, Endpoint, InferenceRequest, Params, Plugin, PluginContext


class KVHeadroomScorer(Plugin):
    type_name = "kv-headroom-scorer"

    def __init__(self, name: str | None = None, threshold: float = 0.8) -> None:
        super().__init__(name)
        self.threshold = threshold

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        # A bad value raises PluginConfigError; the EPP reports it with the key and its line in the file.
        return cls(name, threshold=params.float("threshold", 0.8, min=0.0, min_exclusive=True, max=1.0))

    def score(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        # On the request path: use what the endpoints carry (scraped metrics), never block on I/O.
        return [max(0.0, 1.0 - ep.metrics.kv_cache_usage_percent / self.threshold) for ep in endpoints]
