"""p2p-source-producer (llm-d-router): names a peer the routing sidecar can pull the prompt's cached KV blocks from
(`x-kv-cache-source-host-port`), instead of recomputing them.

Before scheduling, among the endpoints caching within one block of the most prompt tokens (the prefix producer's
PrefixCacheMatchInfo, `prefixMatchInfoProducerName`), one is sampled with weight 1/(1 + waiting queue), the
request id's FNV-1a hash as the coordinate (so pulls spread over replicas of a hot prefix). After scheduling the
header is set only when that peer caches at least `minCachedTokenDelta` more tokens than the computing pod (the
`prefillProfileName` pick when there is one, else the primary); a client-sent value never passes.
Our match info has no per-tier split, so every cached block counts (llm-d counts only CPU-tier blocks when a
producer reports tiers).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Self

from epp.framework import (
    KV_CACHE_SOURCE_HEADER,
    PREFIX_CACHE_MATCH_INFO,
    DataKey,
    Endpoint,
    InferenceRequest,
    Params,
    Plugin,
    PluginContext,
    PrefixCacheMatchInfo,
    SchedulingResult,
    Stability,
)
from epp.plugins.contracts.disagg import upstream_headers
from epp.plugins.contracts.prefix import APPROX_PRODUCER, PREFIX_MATCH


@dataclass(frozen=True, slots=True)
class _Peer:
    hostport: str
    cached_tokens: int


def fnv1a32(s: str) -> int:
    h = 0x811C9DC5
    for b in s.encode("utf-8", "surrogatepass"):
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


class P2PSourceProducer(Plugin):
    type_name = "p2p-source-producer"
    stability = Stability.ALPHA

    def __init__(
        self, name: str | None = None, producer: str = APPROX_PRODUCER, min_delta: int = 1, prefill: str = "prefill"
    ) -> None:
        super().__init__(name)
        self.key = PREFIX_CACHE_MATCH_INFO.of(producer)
        self.min_delta, self.prefill = min_delta, prefill
        self._best: DataKey[_Peer] = DataKey(f"p2p-best-peer/{self.name}")

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        producer = context.producer_for(PREFIX_MATCH, params, requested_by=name)
        return cls(
            name, producer, params.int("minCachedTokenDelta", 1, min=1), params.str("prefillProfileName", "prefill")
        )

    def consumes(self) -> Collection[DataKey[Any]]:
        return (self.key,)

    @staticmethod
    def _cached(info: PrefixCacheMatchInfo | None, ep: Endpoint) -> int:
        if info is None:
            return 0
        return int(info.matches.get(ep.name, 0.0)) * info.block_size_tokens

    async def prepare(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        info = request.data.get(self.key)
        if info is None:
            return
        cached = [(ep, self._cached(info, ep)) for ep in endpoints]
        cached = [(ep, c) for ep, c in cached if c > 0]
        if not cached:
            return
        top = max(c for _, c in cached)
        band = [(ep, c) for ep, c in cached if c + info.block_size_tokens >= top]
        weights = [1.0 / (1.0 + ep.metrics.waiting_queue_size) for ep, _ in band]
        target = fnv1a32(request.request_id) / float(1 << 32) * sum(weights)
        chosen = len(band) - 1
        for i, w in enumerate(weights):
            if target < w:
                chosen = i
                break
            target -= w
        ep, c = band[chosen]
        request.data.put(self._best, _Peer(ep.hostport, c))

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        best = request.data.get(self._best)
        if best is None:
            return
        computing = result.profile_results.get(self.prefill)
        if computing is None or not computing.targets:
            computing = result.profile_results.get(result.primary_profile)
        if computing is None or not computing.targets:
            return
        pod = computing.targets[0]
        if best.hostport == pod.hostport:
            return
        if best.cached_tokens - self._cached(request.data.get(self.key), pod) < self.min_delta:
            return
        headers = upstream_headers(request)
        headers[KV_CACHE_SOURCE_HEADER] = best.hostport
