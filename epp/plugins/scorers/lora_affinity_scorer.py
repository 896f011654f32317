"""lora-affinity-scorer (GIE): prefer servers that already run the adapter, then ones with a free adapter slot."""

from __future__ import annotations

from collections.abc import Sequence

from epp.framework import CycleState, Endpoint, InferenceRequest, Plugin


class LoraAffinityScorer(Plugin):
    type_name = "lora-affinity-scorer"

    def score(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        model = request.target_model
        out = []
        for ep in endpoints:
            m = ep.metrics
            if model in m.active_models:
                out.append(1.0)
            elif len(m.active_models) + len(m.waiting_models) < m.max_active_models:
                out.append(0.8)
            elif model in m.waiting_models:
                out.append(0.6)
            else:
                out.append(0.0)
        return out
