"""latency-slo-admitter (llm-d): reject a sheddable request that no endpoint is predicted to serve within its SLO.

Only requests with priority < 0 and an SLO header are considered. They are admitted when any endpoint is
predicted to meet both SLOs, or is idle (no running requests), or is cold (KV usage < 2%: predictions are
unreliable there), or when there are no predictions at all (a cold or unfit model: fail open). Otherwise the
request is refused before scheduling. llm-d answers 500 ("request cannot be admitted: no valid endpoint available
to serve the request"); pyepp answers that message with 429, as for any shed request, since a shed is not a
server fault and clients retry 429s.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, Self

from epp.framework import (
    DataKey,
    Endpoint,
    InferenceRequest,
    Params,
    Plugin,
    PluginContext,
)
from epp.plugins.contracts.latency import DEFAULT_LATENCY_KEY, LATENCY

DENY_REASON = "no valid endpoint available to serve the request"
COLD_KV_USAGE = 0.02


class LatencySLOAdmitter(Plugin):
    type_name = "latency-slo-admitter"

    def __init__(self, name: str | None = None, *, latency_key: DataKey[Any] = DEFAULT_LATENCY_KEY) -> None:
        super().__init__(name)
        self.latency_key = latency_key

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        return cls(name, latency_key=LATENCY.of(context.producer_for(LATENCY, params, requested_by=name)))

    def consumes(self) -> Collection[DataKey[Any]]:
        return (self.latency_key,)

    def admit(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> str | None:
        if request.priority >= 0:
            return None
        info = request.data.get(self.latency_key)
        if info is None or not info.has_slo or not info.predictions:
            return None
        preds = info.predictions
        for ep in endpoints:
            m = ep.metrics
            if m.kv_cache_usage_percent < COLD_KV_USAGE or m.running_requests_size == 0:
                return None
            p = preds.get(ep.name)
            if p is not None and p.valid:
                return None
        return DENY_REASON
