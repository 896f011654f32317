"""A Director for protocol tests and benchmarks that need no scheduling: subset-aware round-robin."""

from __future__ import annotations

from collections.abc import Mapping

from epp.framework import EndpointView, InferenceRequest, ServiceUnavailable, Usage
from epp.requestcontrol.types import RoutingDecision, locate_candidates


class RoundRobinDirector:
    completes_before_last_answer = False

    def __init__(self, endpoints: EndpointView) -> None:
        self._view = endpoints
        self._next = 0

    async def handle_request(self, request: InferenceRequest, *, defer_records: bool = False) -> RoutingDecision:
        candidates = locate_candidates(self._view.endpoints(), request.subset)
        if not candidates:
            raise ServiceUnavailable("failed to find candidate endpoints for serving the request")
        i = self._next % len(candidates)
        self._next += 1
        return RoutingDecision(endpoints=[candidates[i]])

    def run_deferred(self) -> None:
        return None

    def handle_response_headers(
        self,
        request: InferenceRequest,
        decision: RoutingDecision,
        status: int,
        served: str | None,
        headers: Mapping[str, str],
    ) -> None:
        return None

    def handle_response_chunk(
        self, request: InferenceRequest, decision: RoutingDecision | None, data: bytes, first: bool, end: bool
    ) -> None:
        return None

    def handle_response_complete(
        self, request: InferenceRequest, decision: RoutingDecision | None, usage: Usage | None
    ) -> None:
        return None
