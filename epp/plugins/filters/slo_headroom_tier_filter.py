"""slo-headroom-tier-filter (llm-d): keep the endpoints predicted to meet the request's SLOs.

Endpoints with TTFT and TPOT headroom ≥ 0 form the positive tier, the rest (and those without a prediction) the
negative one. Both present: the positive tier, except with probability `epsilonExploreNeg` (0.01) the negative
one, so an endpoint recovering from overload is re-measured. One present: that one. No predictions (a cold or
unfit model): every endpoint. Without SLO headers every headroom is negative, so the filter keeps all.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from typing import Any, Self

from epp.framework import (
    CycleState,
    DataKey,
    Endpoint,
    InferenceRequest,
    Params,
    Plugin,
    PluginContext,
)
from epp.plugins.contracts.latency import DEFAULT_LATENCY_KEY, LATENCY


class SLOHeadroomTierFilter(Plugin):
    type_name = "slo-headroom-tier-filter"

    def __init__(
        self,
        name: str | None = None,
        *,
        latency_key: DataKey[Any] = DEFAULT_LATENCY_KEY,
        epsilon_explore_neg: float = 0.01,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(name)
        self.latency_key = latency_key
        self.epsilon = epsilon_explore_neg
        self.rng = rng or random.Random()

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        return cls(
            name,
            latency_key=LATENCY.of(context.producer_for(LATENCY, params, requested_by=name)),
            epsilon_explore_neg=params.float("epsilonExploreNeg", 0.01, min=0.0, max=1.0),
        )

    def consumes(self) -> Collection[DataKey[Any]]:
        return (self.latency_key,)

    def filter(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        if len(endpoints) <= 1:
            return list(endpoints)
        info = request.data.get(self.latency_key)
        preds = info.predictions if info is not None else {}
        positive: list[Endpoint] = []
        negative: list[Endpoint] = []
        unknown: list[Endpoint] = []
        for ep in endpoints:
            p = preds.get(ep.name)
            if p is None:
                unknown.append(ep)
            elif p.ttft_headroom >= 0 and p.tpot_headroom >= 0:
                positive.append(ep)
            else:
                negative.append(ep)
        if not positive and not negative:
            return list(endpoints)
        negative.extend(unknown)
        if positive and negative:
            return negative if self.rng.random() < self.epsilon else positive
        return positive or negative
