"""active-request-scorer (llm-d): prefer endpoints with fewer in-flight requests, as the inflight-load-producer
counts them (all replicas' when a cross-replica syncer is configured).

Score 1.0 when an endpoint's count is <= `idleThreshold`, else (max - count) / max · `maxBusyScore`, max being the
highest count among the candidates. As in llm-d, a negative idleThreshold means 0 and an out-of-range maxBusyScore
is logged and replaced by 1.0; `requestTimeout` is deprecated and ignored (the producer reaps stale requests).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from typing import Any, Self

from epp.framework import (
    INFLIGHT_LOAD,
    CycleState,
    DataKey,
    Endpoint,
    InferenceRequest,
    Params,
    Plugin,
    PluginContext,
)
from epp.plugins.contracts.load import INFLIGHT, INFLIGHT_PRODUCER

log = logging.getLogger(__name__)


class ActiveRequestScorer(Plugin):
    type_name = "active-request-scorer"

    def __init__(
        self,
        name: str | None = None,
        idle_threshold: int = 0,
        max_busy_score: float = 1.0,
        producer: str = INFLIGHT_PRODUCER,
    ) -> None:
        super().__init__(name)
        self.idle_threshold = max(0, idle_threshold)
        self.max_busy_score = max_busy_score
        self.key = INFLIGHT_LOAD.of(producer)

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        if params.has("requestTimeout"):
            params.get("requestTimeout")
            log.warning(
                "%s: requestTimeout is deprecated and ignored (the inflight-load-producer tracks requests)",
                name,
            )
        busy = params.float("maxBusyScore", 1.0)
        if not 0.0 <= busy <= 1.0:
            log.warning("%s: ignoring out-of-range maxBusyScore %s; using 1.0", name, busy)
            busy = 1.0
        producer = context.producer_for(INFLIGHT, params, requested_by=name)
        return cls(name, idle_threshold=params.int("idleThreshold", 0), max_busy_score=busy, producer=producer)

    def consumes(self) -> Collection[DataKey[Any]]:
        return (self.key,)

    def score(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        key = self.key
        counts = []
        for ep in endpoints:
            load = ep.attributes.get(key)
            counts.append(load.total_requests if load is not None else 0)
        top = max(counts, default=0)
        idle, busy = self.idle_threshold, self.max_busy_score
        return [1.0 if c <= idle else (top - c) / top * busy for c in counts]
