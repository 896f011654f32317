"""queue-scorer: prefer short waiting queues, min-max normalized over the candidates (GIE)."""

from __future__ import annotations

from collections.abc import Sequence

from epp.framework import CycleState, Endpoint, InferenceRequest, Plugin
from epp.plugins.scorers._normalize import min_max_inverted


class QueueScorer(Plugin):
    type_name = "queue-scorer"

    def score(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        return min_max_inverted([ep.metrics.waiting_queue_size for ep in endpoints])
