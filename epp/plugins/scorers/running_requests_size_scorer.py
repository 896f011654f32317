"""running-requests-size-scorer: prefer fewer running requests, min-max normalized like queue-scorer (GIE)."""

from __future__ import annotations

from collections.abc import Sequence

from epp.framework import CycleState, Endpoint, InferenceRequest, Plugin
from epp.plugins.scorers._normalize import min_max_inverted


class RunningRequestsSizeScorer(Plugin):
    type_name = "running-requests-size-scorer"
    aliases = ("running-requests-scorer",)

    def score(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        return min_max_inverted([ep.metrics.running_requests_size for ep in endpoints])
