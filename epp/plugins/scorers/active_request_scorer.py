"""active-request-scorer (llm-d): prefer endpoints with fewer in-flight requests routed by this EPP.

It tracks in-flight requests itself: +1 in PreRequest for the primary target, -1 when the response completes;
entries older than `requestTimeout` are dropped so a lost completion cannot pin an endpoint forever.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Self

from epp.framework import (
    CycleState,
    Endpoint,
    InferenceRequest,
    Params,
    Plugin,
    PluginContext,
    SchedulingResult,
    Usage,
)


class ActiveRequestScorer(Plugin):
    type_name = "active-request-scorer"

    def __init__(
        self,
        name: str | None = None,
        idle_threshold: int = 0,
        max_busy_score: float = 1.0,
        request_timeout: float = 120.0,
    ) -> None:
        super().__init__(name)
        self.idle_threshold = idle_threshold
        self.max_busy_score = max_busy_score
        self.request_timeout = request_timeout
        self.counts: dict[str, int] = {}
        self._inflight: dict[str, tuple[str, float]] = {}  # request id -> (endpoint name, start)
        self._next_sweep = 0.0

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        return cls(
            name,
            idle_threshold=params.int("idleThreshold", 0, min=0),
            max_busy_score=params.float("maxBusyScore", 1.0, min=0.0, max=1.0),
            request_timeout=params.duration("requestTimeout", 120.0),
        )

    def score(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        counts = self.counts
        vals = [counts.get(ep.name, 0) for ep in endpoints]
        top = max(vals, default=0)
        idle, busy = self.idle_threshold, self.max_busy_score
        return [1.0 if c <= idle else (top - c) / top * busy for c in vals]

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        targets = result.targets
        if not targets:
            return
        now = time.monotonic()
        if now >= self._next_sweep:
            self._sweep(now)
        name = targets[0].name
        prev = self._inflight.get(request.request_id)
        if prev is not None:
            self._dec(prev[0])
        self._inflight[request.request_id] = (name, now)
        self.counts[name] = self.counts.get(name, 0) + 1

    def response_complete(self, request: InferenceRequest, endpoint: Endpoint | None, usage: Usage | None) -> None:
        entry = self._inflight.pop(request.request_id, None)
        if entry is not None:
            self._dec(entry[0])

    def _dec(self, name: str) -> None:
        c = self.counts.get(name, 0) - 1
        if c > 0:
            self.counts[name] = c
        else:
            self.counts.pop(name, None)

    def _sweep(self, now: float) -> None:
        self._next_sweep = now + max(1.0, self.request_timeout / 10)
        if self.request_timeout <= 0:
            return
        cutoff = now - self.request_timeout
        for rid, (name, start) in list(self._inflight.items()):
            if start < cutoff:
                del self._inflight[rid]
                self._dec(name)
