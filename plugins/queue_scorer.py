"""queue-scorer: prefer short waiting queues, min-max normalized over the candidates (GIE)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from epp.framework import CycleState, Endpoint, InferenceRequest, Params, Plugin, register


def min_max_inverted(values: Sequence[float]) -> list[float]:
    """(max - v) / (max - min); every candidate gets 1.0 when all values are equal."""
    if not values:
        return []
    lo, hi = min(values), max(values)
    if hi == lo:
        return [1.0] * len(values)
    span = hi - lo
    return [(hi - v) / span for v in values]


@register("queue-scorer")
class QueueScorer(Plugin):
    @classmethod
    def from_config(cls, name: str, parameters: dict[str, Any], context: Any) -> QueueScorer:
        Params(name, parameters)
        return cls(name)

    def score(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        return min_max_inverted([ep.metrics.waiting_queue_size for ep in endpoints])
