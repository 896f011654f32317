"""prefix-cache-scorer: score = w·min(1, matched·blockSize/scale)² + (1-w)·matched/total from PrefixCacheMatchInfo.

Without `prefixMatchInfoProducerName` it asks for GIE's default producer, approx-prefix-cache-producer, and
forwards the producer parameters older configs put on the scorer (blockSizeTokens, hashBlockSize, ...).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, Self

from epp.framework import (
    PREFIX_CACHE_MATCH_INFO,
    CycleState,
    DataKey,
    Endpoint,
    InferenceRequest,
    Params,
    Plugin,
    PluginContext,
)
from epp.plugins.contracts.prefix import APPROX_PRODUCER, PREFIX_MATCH

_PRODUCER_KEYS = (
    "autoTune",
    "blockSize",
    "blockSizeTokens",
    "hashBlockSize",
    "maxPrefixBlocksToMatch",
    "maxPrefixTokensToMatch",
    "lruCapacityPerServer",
)


class PrefixCacheScorer(Plugin):
    type_name = "prefix-cache-scorer"

    def __init__(
        self,
        name: str | None = None,
        producer: str = APPROX_PRODUCER,
        match_length_weight: float = 0.0,
        match_length_scale_tokens: int = 8192,
    ) -> None:
        super().__init__(name)
        self.producer = producer
        self.key = PREFIX_CACHE_MATCH_INFO.of(producer)
        self.w_len = match_length_weight
        self.scale = match_length_scale_tokens

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        forwarded = {k: params.get(k) for k in _PRODUCER_KEYS if params.has(k)}
        producer = context.producer_for(PREFIX_MATCH, params, requested_by=name, parameters=forwarded)
        return cls(
            name,
            producer=producer,
            match_length_weight=params.float("matchLengthWeight", 0.0, min=0.0, max=1.0),
            match_length_scale_tokens=params.int("matchLengthScaleTokens", 8192, min=1),
        )

    def consumes(self) -> Collection[DataKey[Any]]:
        return (self.key,)

    def score(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        info = request.data.get(self.key)
        if info is None or info.total_blocks <= 0:
            return [0.0] * len(endpoints)
        matches, total = info.matches, info.total_blocks
        if not matches:
            return [0.0] * len(endpoints)
        w = self.w_len
        if w == 0.0:
            return [matches.get(ep.name, 0) / total for ep in endpoints]
        bs, scale = info.block_size_tokens, self.scale
        out = []
        for ep in endpoints:
            m = matches.get(ep.name, 0)
            length = min(1.0, m * bs / scale)
            out.append(w * length * length + (1.0 - w) * m / total)
        return out
