"""lora-affinity-scorer (GIE): prefer servers that already run the adapter, then ones with a free adapter slot."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from epp.framework import CycleState, Endpoint, InferenceRequest, Params, Plugin, register


@register("lora-affinity-scorer")
class LoraAffinityScorer(Plugin):
    @classmethod
    def from_config(cls, name: str, parameters: dict[str, Any], context: Any) -> LoraAffinityScorer:
        Params(name, parameters)
        return cls(name)

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
