"""precise-prefix-cache-scorer (llm-d, deprecated alias kvcache-aware-scorer): the precise prefix-cache producer
and its scorer in one plugin. Score = matched blocks / prompt blocks (tier-weighted), 0 without a cached prefix."""

from __future__ import annotations

from collections.abc import Sequence

from epp.framework import CycleState, Endpoint, InferenceRequest
from epp.plugins.contracts.prefix import PreciseMatch
from epp.plugins.producers.precise_prefix_cache_producer import PrecisePrefixCacheProducer


def match_scores(info: PreciseMatch | None, endpoints: Sequence[Endpoint]) -> list[float]:
    """matched/total (tier-weighted), clipped to [0, 1]; 0 for endpoints without a cached prefix."""
    if info is None or info.total_blocks == 0:
        return [0.0] * len(endpoints)
    t = float(info.total_blocks)
    return [min(1.0, info.weighted.get(ep.hostport, 0.0) / t) for ep in endpoints]


class PrecisePrefixCacheScorer(PrecisePrefixCacheProducer):
    type_name = "precise-prefix-cache-scorer"
    aliases = ("kvcache-aware-scorer",)
    legacy_tokenizer_pool = True

    def score(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        if self.fallback is not None:  # approximateFallback: the merged match (index and routing history)
            info = request.data.get(self.info_key)
            if info is None or not info.total_blocks:
                return [0.0] * len(endpoints)
            t = float(info.total_blocks)
            return [min(1.0, info.matches.get(ep.name, 0.0) / t) for ep in endpoints]
        return match_scores(request.data.get(self.match_key), endpoints)
