"""edf-ordering-policy (flow control): earliest deadline first within a flow.

deadline = enqueue time + the request's effective TTL: flowControl.defaultRequestTTL, clamped by the caller's own
deadline when Envoy sends one (`x-envoy-expected-rq-timeout-ms`, the route timeout). A request without a TTL gets
a far-future deadline (after every time-bound one); ties leave in arrival order.
"""

from __future__ import annotations

from epp.framework import InferenceRequest, Plugin

FAR_FUTURE = float("inf")
CALLER_TIMEOUT_HEADER = "x-envoy-expected-rq-timeout-ms"


def _positive_ms(value: str | None) -> float | None:
    if not value:
        return None
    try:
        ms = float(value.strip())
    except ValueError:
        return None
    return ms / 1000.0 if ms > 0 and ms == ms and ms != float("inf") else None


class EDFOrderingPolicy(Plugin):
    type_name = "edf-ordering-policy"
    ordering = "edf"

    def deadline(self, request: InferenceRequest, enqueued: float, ttl: float | None) -> float:
        effective = ttl if ttl and ttl > 0 else None
        caller = _positive_ms(request.headers.get(CALLER_TIMEOUT_HEADER))
        if caller is not None:
            # the caller's deadline runs from its arrival, not from the enqueue
            remaining = caller - max(0.0, enqueued - request.arrival)
            effective = remaining if effective is None else min(effective, remaining)
        return FAR_FUTURE if effective is None else enqueued + effective
