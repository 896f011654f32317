"""token-load-scorer (llm-d): 1 - min(1, tokens/queueThresholdTokens), tokens being the endpoint's in-flight tokens
(all replicas') plus what this request would add there (its uncached prompt, from the inflight-load-producer).

`queueThresholdTokens` defaults to 4,194,304 (128 requests of 32K); a value <= 0 means the default, as in llm-d.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, Self

from epp.framework import (
    INFLIGHT_LOAD,
    UNCACHED_REQUEST_TOKENS,
    CycleState,
    DataKey,
    Endpoint,
    InferenceRequest,
    Params,
    Plugin,
    PluginContext,
)
from epp.plugins.contracts.load import INFLIGHT, INFLIGHT_PRODUCER

DEFAULT_THRESHOLD = 4194304


class TokenLoadScorer(Plugin):
    type_name = "token-load-scorer"

    def __init__(
        self, name: str | None = None, threshold: int = DEFAULT_THRESHOLD, producer: str = INFLIGHT_PRODUCER
    ) -> None:
        super().__init__(name)
        self.threshold = float(threshold if threshold > 0 else DEFAULT_THRESHOLD)
        self.load_key = INFLIGHT_LOAD.of(producer)
        self.uncached_key = UNCACHED_REQUEST_TOKENS.of(producer)

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        producer = context.producer_for(INFLIGHT, params, requested_by=name)
        return cls(name, threshold=params.int("queueThresholdTokens", DEFAULT_THRESHOLD), producer=producer)

    def consumes(self) -> Collection[DataKey[Any]]:
        return (self.load_key, self.uncached_key)

    def score(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        uncached = request.data.get(self.uncached_key) or {}
        key, threshold = self.load_key, self.threshold
        out = []
        for ep in endpoints:
            load = ep.attributes.get(key)
            tokens = (load.total_tokens if load is not None else 0) + uncached.get(ep.name, 0)
            out.append(1.0 if tokens <= 0 else 1.0 - min(tokens, threshold) / threshold)
        return out
