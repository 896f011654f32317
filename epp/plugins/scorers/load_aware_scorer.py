"""load-aware-scorer (llm-d): 0.5 for an empty queue, falling linearly to 0 at `threshold` waiting requests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Self

from epp.framework import CycleState, Endpoint, InferenceRequest, Params, Plugin, PluginContext


class LoadAwareScorer(Plugin):
    type_name = "load-aware-scorer"

    def __init__(self, name: str | None = None, threshold: int = 128) -> None:
        super().__init__(name)
        self.threshold = threshold

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        return cls(name, threshold=params.int("threshold", 128, min=1))

    def score(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        thr = self.threshold
        out = []
        for ep in endpoints:
            q = ep.metrics.waiting_queue_size
            out.append(0.5 if q <= 0 else 0.0 if q >= thr else 0.5 * (1.0 - q / thr))
        return out
