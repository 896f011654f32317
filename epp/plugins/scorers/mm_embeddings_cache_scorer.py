"""mm-embeddings-cache-scorer (llm-d): prefer the endpoints that likely hold the request's multimodal items in their
encoder cache, as `mm-embeddings-cache-producer` tracks them.

Score = matched items / the request's distinct items (each item weighs 1, as the router's unweighted producer), in
[0, 1]; 0 for every endpoint when the request has no multimodal item or no producer ran. `producerName` picks a
producer instance (default: the one named `mm-embeddings-cache-producer`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, Self

from epp.framework import CycleState, DataKey, Endpoint, InferenceRequest, Params, Plugin, PluginContext
from epp.plugins.contracts.multimodal import MM_CACHE_MATCH, MM_MATCH, MM_PRODUCER


class MMEmbeddingsCacheScorer(Plugin):
    type_name = "mm-embeddings-cache-scorer"

    def __init__(self, name: str | None = None, producer: str = MM_PRODUCER) -> None:
        super().__init__(name)
        self.key = MM_CACHE_MATCH.of(producer)

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        return cls(name, context.producer_for(MM_MATCH, params, requested_by=name, add_default=False))

    def consumes(self) -> Collection[DataKey[Any]]:
        return (self.key,)

    def score(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        match = request.data.get(self.key)
        if match is None or match.total <= 0:
            return [0.0] * len(endpoints)
        total = match.total
        return [match.matched.get(ep.name, 0) / total for ep in endpoints]
