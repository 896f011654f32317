"""slo-deadline-ordering-policy (flow control): earliest SLO deadline first within a flow.

deadline = arrival + `x-llm-d-slo-ttft-ms` (or the older `x-slo-ttft-ms`), in milliseconds. A request without
a valid header (missing, empty, not a positive integer) gets a far-future deadline; ties leave in arrival order.
"""

from __future__ import annotations

from epp.framework import InferenceRequest, Plugin
from epp.plugins.contracts.latency import TTFT_SLO_HEADERS

FAR_FUTURE = float("inf")


class SLODeadlineOrderingPolicy(Plugin):
    type_name = "slo-deadline-ordering-policy"
    ordering = "slo-deadline"

    def deadline(self, request: InferenceRequest, enqueued: float, ttl: float | None) -> float:
        for h in TTFT_SLO_HEADERS:
            v = request.headers.get(h, "").strip()
            if v:
                try:
                    ms = int(v)
                except ValueError:
                    return FAR_FUTURE
                return request.arrival + ms / 1000.0 if ms > 0 else FAR_FUTURE
        return FAR_FUTURE
