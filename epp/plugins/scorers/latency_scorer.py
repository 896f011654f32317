"""latency-scorer (llm-d): scores endpoints by predicted latency headroom (SLO − predicted), llm-d's formula.

With predictions (LATENCY_PREDICTION_INFO from a predicted-latency-producer): endpoints meeting both SLOs
(positive headroom) are scored and the others get 0; when none does, idle endpoints (nothing dispatched) are
preferred, then the least severe deficit bucket (only TPOT missed, only TTFT missed, both). Within the bucket
|headroom| is min-max normalized per dimension (a dimension with no spread hands its weight to the other),
blended `ttftWeight·nTTFT + tpotWeight·nTPOT` (weights normalized), and turned into ⌊(1−c)·100⌋+1 / 100
(`least`: closest to the SLO boundary wins — bin-packing; without SLOs that is the lowest predicted latency) or
⌊c·100⌋+1 / 100 (`most`, positive headroom only). Without predictions (cold or unfit model) it falls back to
llm-d's composite: `kvW·(1−kv) + queueW·relative queue + prefixW·prefix match`, weights normalized, rounded to
hundredths.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Self

from epp.framework import (
    CycleState,
    DataKey,
    Endpoint,
    InferenceRequest,
    LatencyPrediction,
    Params,
    Plugin,
    PluginContext,
)
from epp.plugins.contracts.latency import DEFAULT_LATENCY_KEY, LATENCY
from epp.plugins.contracts.prefix import APPROX_PRODUCER, PREFIX_MATCH

DEFAULT_PREFIX_KEY: DataKey[Any] = PREFIX_MATCH.of(APPROX_PRODUCER)
_W_MAX = 100
_EPS = 1e-9


@dataclass(slots=True)
class _Scored:
    index: int
    p: LatencyPrediction


class LatencyScorer(Plugin):
    type_name = "latency-scorer"

    def __init__(
        self,
        name: str | None = None,
        *,
        latency_key: DataKey[Any] = DEFAULT_LATENCY_KEY,
        prefix_key: DataKey[Any] = DEFAULT_PREFIX_KEY,
        ttft_weight: float = 0.8,
        tpot_weight: float = 0.2,
        strategy: str = "least",
        kv_weight: float = 1.0,
        queue_weight: float = 1.0,
        prefix_weight: float = 1.0,
    ) -> None:
        super().__init__(name)
        self.latency_key = latency_key
        self.prefix_key = prefix_key
        self.ttft_weight = ttft_weight
        self.tpot_weight = tpot_weight
        self.strategy = strategy
        self.kv_weight = kv_weight
        self.queue_weight = queue_weight
        self.prefix_weight = prefix_weight

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        latency_key = LATENCY.of(context.producer_for(LATENCY, params, requested_by=name))
        prefix = context.producer_for(PREFIX_MATCH, params, requested_by=name)
        return cls(
            name,
            latency_key=latency_key,
            prefix_key=PREFIX_MATCH.of(prefix),
            ttft_weight=params.float("ttftWeight", 0.8, min=0.0),
            tpot_weight=params.float("tpotWeight", 0.2, min=0.0),
            strategy=params.str("headroomSelectionStrategy", "least", choices=("least", "most")),
            kv_weight=params.float("compositeKVWeight", 1.0, min=0.0),
            queue_weight=params.float("compositeQueueWeight", 1.0, min=0.0),
            prefix_weight=params.float("compositePrefixWeight", 1.0, min=0.0),
        )

    def consumes(self) -> Collection[DataKey[Any]]:
        return (self.latency_key, self.prefix_key)

    def score(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        info = request.data.get(self.latency_key)
        preds = info.predictions if info is not None else {}
        data = [_Scored(i, preds[ep.name]) for i, ep in enumerate(endpoints) if ep.name in preds]
        if not data or len(data) < len(endpoints):
            return self.composite(request, endpoints)
        scores = [0.0] * len(endpoints)
        positive = [d for d in data if d.p.ttft_headroom >= 0 and d.p.tpot_headroom >= 0]
        if positive:
            self._bucket(positive, scores, force_least=False)
            return scores
        idle = [d for d in data if d.p.dispatched == 0]
        if idle:
            self._bucket(idle, scores, force_least=True)
            return scores
        tpot_only = [d for d in data if d.p.tpot_headroom < 0 <= d.p.ttft_headroom]
        ttft_only = [d for d in data if d.p.ttft_headroom < 0 <= d.p.tpot_headroom]
        both = [d for d in data if d.p.ttft_headroom < 0 and d.p.tpot_headroom < 0]
        self._bucket(tpot_only or ttft_only or both, scores, force_least=True)
        return scores

    def _bucket(self, data: list[_Scored], scores: list[float], force_least: bool) -> None:
        total = self.ttft_weight + self.tpot_weight
        alpha, beta = (self.ttft_weight / total, self.tpot_weight / total) if total > 0 else (1.0, 0.0)
        ttft = [abs(d.p.ttft_headroom) for d in data]
        tpot = [abs(d.p.tpot_headroom) for d in data]
        t_min, t_range = min(ttft), max(ttft) - min(ttft)
        p_min, p_range = min(tpot), max(tpot) - min(tpot)
        if t_range <= _EPS < p_range:
            alpha, beta = 0.0, 1.0
        elif p_range <= _EPS < t_range:
            alpha, beta = 1.0, 0.0
        most = self.strategy == "most" and not force_least
        for d, t, p in zip(data, ttft, tpot, strict=True):
            n_ttft = (t - t_min) / t_range if t_range > _EPS else 0.5
            n_tpot = (p - p_min) / p_range if p_range > _EPS else 0.5
            combined = alpha * n_ttft + beta * n_tpot
            w = int(combined * _W_MAX) + 1 if most else int((1.0 - combined) * _W_MAX) + 1
            scores[d.index] = w / _W_MAX

    def composite(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        """llm-d's fallback without predictions: free KV, relative queue and prefix match."""
        wkv, wq, wp = self.kv_weight, self.queue_weight, self.prefix_weight
        total = wkv + wq + wp
        if total <= 0:
            wkv, wq, wp, total = 1.0, 0.0, 0.0, 1.0
        wkv, wq, wp = wkv / total, wq / total, wp / total
        max_q = max((ep.metrics.waiting_queue_size for ep in endpoints), default=0)
        prefix = request.data.get(self.prefix_key)
        out = []
        for ep in endpoints:
            q = ep.metrics.waiting_queue_size
            rel_q = (max_q - q) / max_q if max_q > 0 else 1.0
            match = 0.0
            if prefix is not None and prefix.total_blocks > 0:
                match = prefix.matches.get(ep.name, 0.0) / prefix.total_blocks
            composite = wkv * (1.0 - ep.metrics.kv_cache_usage_percent) + wq * rel_q + wp * match
            out.append(round(_W_MAX * composite) / _W_MAX)
        return out
