"""The seam between the protocol server and request control.

The ext_proc server only calls a `Director`: `handle_request` turns a parsed request into a `RoutingDecision` or
raises a `RequestError` (400/429/503...); the response hooks report what came back. Admission, candidate location
(subset hint), data producers, the scheduler and the plugin hooks all live behind it (epp.requestcontrol.director).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from epp.framework.types import Endpoint, InferenceRequest, SchedulingResult, Usage


@dataclass(slots=True)
class RoutingDecision:
    """Where one request goes, and what the server adds to the request and the response for it."""

    endpoints: list[Endpoint]  # best first; the rest are fallbacks
    # Extra keys for the `envoy.lb` dynamic metadata namespace (besides the destination).
    metadata: dict[str, Any] = field(default_factory=dict)
    # Extra request headers to set (e.g. disaggregation hints).
    headers: dict[str, str] = field(default_factory=dict)
    # Headers for the client's response (set by ResponseReceived plugins, e.g. session-affinity's token).
    response_headers: dict[str, str] = field(default_factory=dict)
    # The scheduler's full result (None for decisions made without scheduling, e.g. body-less requests).
    result: SchedulingResult | None = None
    # The endpoint that actually served the request, once the response reports it.
    served: Endpoint | None = None
    # Set when flow control evicts this in-flight request (enableEviction): the server then ends the stream.
    evicted: asyncio.Event | None = None

    @property
    def destination(self) -> str:
        return ",".join(ep.hostport for ep in self.endpoints)


class Director(Protocol):
    # True when a ResponseComplete hook must run before the last response body message is answered (its output
    # goes out with that answer); otherwise the servicer completes the request right after writing the answer.
    completes_before_last_answer: bool

    async def handle_request(self, request: InferenceRequest, *, defer_records: bool = False) -> RoutingDecision:
        """The routing decision. With `defer_records` the caller calls `run_deferred` once the answer is written:
        PreRequest hooks that only record the pick may wait until then."""
        ...

    def run_deferred(self) -> None:
        """Run what `handle_request(defer_records=True)` held back (a no-op when nothing is)."""
        ...

    def handle_response_headers(
        self,
        request: InferenceRequest,
        decision: RoutingDecision,
        status: int,
        served: str | None,
        headers: Mapping[str, str],
    ) -> None:
        """Record the response's arrival; may fill `decision.response_headers`."""
        ...

    def handle_response_chunk(
        self, request: InferenceRequest, decision: RoutingDecision | None, data: bytes, first: bool, end: bool
    ) -> None:
        """One response body chunk (`first`/`end` mark the first and the last)."""
        ...

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
