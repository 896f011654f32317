"""multicluster-queue-scorer (llm-d-router, Alpha): on a multi-cluster hub, a cluster's average waiting queue (the
`llm-d.ai/multicluster-queue-size` attribute) min-max normalized over the clusters that have it, shorter is better
(all equal: 1.0); a cluster without it scores 0."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from epp.framework import CycleState, DataKey, Endpoint, InferenceRequest, Plugin, Stability
from epp.framework.keys import MULTICLUSTER_QUEUE_SIZE
from epp.plugins.scorers._normalize import min_max_inverted


class MultiClusterQueueScorer(Plugin):
    type_name = "multicluster-queue-scorer"
    stability = Stability.ALPHA

    def consumes(self) -> Collection[DataKey[Any]]:
        return (MULTICLUSTER_QUEUE_SIZE,)

    def score(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        queues = [ep.attributes.get(MULTICLUSTER_QUEUE_SIZE) for ep in endpoints]
        known = [q for q in queues if q is not None]
        scores = iter(min_max_inverted(known))
        return [0.0 if q is None else next(scores) for q in queues]
