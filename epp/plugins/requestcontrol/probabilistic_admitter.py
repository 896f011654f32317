"""probabilistic-admitter (llm-d-router): sheds sheddable requests (priority < 0) with a probability that rises
steeply with pool saturation; requests with priority >= 0 are always admitted.

saturation = mean over the candidates of max(waiting / queueDepthThreshold, kvUsage / kvCacheUtilThreshold) (an
endpoint never scraped counts as 1.0); p(reject) = min(saturation^power · k, 1). Defaults (power 5, k 300):
~2.3 % at 0.15, all sheddable traffic shed from ≈ 0.34.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Self

from epp.framework import Endpoint, InferenceRequest, Params, Plugin, PluginContext


class ProbabilisticAdmitter(Plugin):
    type_name = "probabilistic-admitter"

    def __init__(
        self,
        name: str | None = None,
        queue_threshold: float = 5,
        kv_threshold: float = 0.8,
        power: float = 5.0,
        k: float = 300.0,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(name)
        self.queue_threshold, self.kv_threshold, self.power, self.k = queue_threshold, kv_threshold, power, k
        self.rng = rng or random.Random()

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        return cls(
            name,
            params.float("queueDepthThreshold", 5, min=0.0, min_exclusive=True),
            params.float("kvCacheUtilThreshold", 0.8, min=0.0, min_exclusive=True, max=1.0),
            params.float("power", 5.0, min=0.0, min_exclusive=True),
            params.float("k", 300.0, min=0.0, min_exclusive=True),
        )

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        total = 0.0
        for ep in endpoints:
            m = ep.metrics
            if not m.update_time:
                total += 1.0
                continue
            total += max(m.waiting_queue_size / self.queue_threshold, m.kv_cache_usage_percent / self.kv_threshold)
        return total / len(endpoints)

    def reject_probability(self, endpoints: Sequence[Endpoint]) -> float:
        if not endpoints:
            return 0.0
        return min(self.saturation(endpoints) ** self.power * self.k, 1.0)

    def admit(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> str | None:
        """None admits; a reason rejects (the director answers 429)."""
        if request.priority >= 0:
            return None
        p = self.reject_probability(endpoints)
        if p > 0 and self.rng.random() < p:
            return f"sheddable request shed by {self.name} (p={p:.2f})"
        return None
