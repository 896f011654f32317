"""The seam between the protocol server and scheduling.

The ext_proc server only calls a `Director`: `handle_request` turns a parsed request into a
`RoutingDecision` or raises a `RequestError` (400/429/503...). Admission, candidate location
(subset hint), data producers, the scheduler and pre-request hooks all live behind it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from epp.framework.errors import ServiceUnavailable
from epp.framework.types import Endpoint, InferenceRequest, Usage


@dataclass(slots=True)
class RoutingDecision:
    endpoints: list[Endpoint]  # best first; the rest are fallbacks
    # Extra keys for the `envoy.lb` dynamic metadata namespace (besides the destination).
    metadata: dict[str, Any] = field(default_factory=dict)
    # Extra request headers to set (e.g. disaggregation hints).
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def destination(self) -> str:
        return ",".join(ep.hostport for ep in self.endpoints)


class Director(Protocol):
    async def handle_request(self, request: InferenceRequest) -> RoutingDecision: ...

    def handle_response_headers(
        self, request: InferenceRequest, decision: RoutingDecision, status: int, served: str | None
    ) -> None: ...

    def handle_response_complete(
        self, request: InferenceRequest, decision: RoutingDecision | None, usage: Usage | None
    ) -> None: ...


def locate_candidates(endpoints: Sequence[Endpoint], subset: list[str] | None) -> list[Endpoint]:
    """Apply the subset hint: `ip:port` entries match exactly, bare IPs match every port of that IP."""
    if subset is None:
        return list(endpoints)
    exact = set(subset)
    ips = {s for s in subset if s.count(":") == 0 or (s.startswith("[") and s.endswith("]"))}
    return [ep for ep in endpoints if ep.hostport in exact or ep.address in ips or f"[{ep.address}]" in ips]


class RoundRobinDirector:
    """The skeleton's director: subset-aware round-robin. The framework's scheduler replaces it."""

    def __init__(self, endpoints: Any) -> None:
        self._view = endpoints
        self._next = 0

    async def handle_request(self, request: InferenceRequest) -> RoutingDecision:
        candidates = locate_candidates(self._view.endpoints(), request.subset)
        if not candidates:
            raise ServiceUnavailable("failed to find candidate endpoints for serving the request")
        i = self._next % len(candidates)
        self._next += 1
        return RoutingDecision(endpoints=[candidates[i]])

    def handle_response_headers(
        self, request: InferenceRequest, decision: RoutingDecision, status: int, served: str | None
    ) -> None:
        return None

    def handle_response_complete(
        self, request: InferenceRequest, decision: RoutingDecision | None, usage: Usage | None
    ) -> None:
        return None
