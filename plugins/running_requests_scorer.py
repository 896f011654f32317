"""running-requests-size-scorer: prefer fewer running requests, min-max normalized like queue-scorer (GIE)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from epp.framework import CycleState, Endpoint, InferenceRequest, Params, Plugin, register
from plugins.queue_scorer import min_max_inverted


@register("running-requests-size-scorer", "running-requests-scorer")
class RunningRequestsScorer(Plugin):
    @classmethod
    def from_config(cls, name: str, parameters: dict[str, Any], context: Any) -> RunningRequestsScorer:
        Params(name, parameters)
        return cls(name)

    def score(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        return min_max_inverted([ep.metrics.running_requests_size for ep in endpoints])
