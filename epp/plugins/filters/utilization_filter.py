"""utilization-filter (llm-d-router): drops endpoints over any configured metric cap.

`conditions: [{metric, maxValue}]` — an endpoint is kept only if every metric is <= its maxValue. Metrics:
`active-requests` (the EPP's in-flight count, from inflight-load-producer), `running-requests`, `waiting-queue`
and `kv-cache-utilization` (scraped; a fraction, maxValue <= 1). `fallbackOnEmpty` returns the candidates unchanged
when every one was dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
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
    Stability,
)
from epp.plugins.contracts.load import INFLIGHT, INFLIGHT_PRODUCER

METRICS = ("active-requests", "running-requests", "waiting-queue", "kv-cache-utilization")


class UtilizationFilter(Plugin):
    type_name = "utilization-filter"
    stability = Stability.ALPHA

    def __init__(
        self,
        name: str,
        conditions: Sequence[tuple[str, float]],
        fallback_on_empty: bool = False,
        producer: str = INFLIGHT_PRODUCER,
    ) -> None:
        super().__init__(name)
        self.conditions = list(conditions)
        self.fallback_on_empty = fallback_on_empty
        self.load_key = INFLIGHT_LOAD.of(producer)
        self._checks: list[tuple[Callable[[Endpoint], float], float]] = [
            (self._getter(m), v) for m, v in self.conditions
        ]

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        raw = params.list("conditions")
        if not raw:
            raise params.fail("conditions", "needs at least one {metric, maxValue}")
        conditions: list[tuple[str, float]] = []
        for i, c in enumerate(raw):
            cp = Params(name, c, path=f"conditions[{i}]")
            metric = cp.str("metric", "", choices=METRICS)
            if not cp.has("maxValue"):
                raise cp.fail("maxValue", "required")
            top = 1.0 if metric == "kv-cache-utilization" else None
            conditions.append((metric, cp.float("maxValue", 0.0, min=0.0, max=top)))
            unknown = cp.unread_error()
            if unknown is not None:
                raise unknown
        uses_inflight = any(m == "active-requests" for m, _ in conditions)
        producer = context.producer_for(INFLIGHT, params, requested_by=name, add_default=uses_inflight)
        if not uses_inflight:
            params.ignore(INFLIGHT.parameter)
        return cls(name, conditions, params.bool("fallbackOnEmpty", False), producer)

    def consumes(self) -> Collection[DataKey[Any]]:
        return (self.load_key,) if any(m == "active-requests" for m, _ in self.conditions) else ()

    def _getter(self, metric: str) -> Callable[[Endpoint], float]:
        if metric == "active-requests":
            key = self.load_key

            def active(ep: Endpoint) -> float:
                load = ep.attributes.get(key)
                return float(load.total_requests) if load is not None else 0.0

            return active
        if metric == "running-requests":
            return lambda ep: float(ep.metrics.running_requests_size)
        if metric == "waiting-queue":
            return lambda ep: float(ep.metrics.waiting_queue_size)
        return lambda ep: float(ep.metrics.kv_cache_usage_percent)

    def filter(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        kept = [ep for ep in endpoints if all(get(ep) <= cap for get, cap in self._checks)]
        if not kept and self.fallback_on_empty:
            return list(endpoints)
        return kept
