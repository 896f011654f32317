"""utilization-detector (GIE's default saturation detector), also usable as a filter.

Saturation = mean over endpoints of max(queue/queueDepthThreshold, kv/kvCacheUtilThreshold); stale or never
scraped endpoints count as 1.0 (saturated), no endpoints at all is 1.0. As a filter it drops endpoints that are
stale or at/above threshold x (1 + headroom), and fails open (returns everything) if that would drop them all.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Self

from epp.framework import CycleState, Endpoint, InferenceRequest, Params, Plugin, PluginContext


class UtilizationDetector(Plugin):
    type_name = "utilization-detector"

    def __init__(
        self,
        name: str | None = None,
        queue_threshold: int = 5,
        kv_threshold: float = 0.8,
        staleness: float = 0.2,
        headroom: float = 0.0,
    ) -> None:
        super().__init__(name)
        self.queue_threshold = queue_threshold
        self.kv_threshold = kv_threshold
        self.staleness = staleness
        self.headroom = headroom

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        return cls(
            name,
            queue_threshold=params.int("queueDepthThreshold", 5, min=1),
            kv_threshold=params.float("kvCacheUtilThreshold", 0.8, min=0.0, max=1.0, min_exclusive=True),
            staleness=params.duration("metricsStalenessThreshold", 0.2),
            headroom=params.float("headroom", 0.0, min=0.0),
        )

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        if not endpoints:
            return 1.0
        now = time.monotonic()
        qt, kt, stale = self.queue_threshold, self.kv_threshold, self.staleness
        total = 0.0
        for ep in endpoints:
            m = ep.metrics
            if m.update_time == 0.0 or now - m.update_time > stale:
                total += 1.0
                continue
            q = m.waiting_queue_size / qt
            k = m.kv_cache_usage_percent / kt
            total += q if q > k else k
        return total / len(endpoints)

    def filter(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        now = time.monotonic()
        factor = 1.0 + self.headroom
        q_limit = self.queue_threshold * factor
        kv_limit = min(1.0, self.kv_threshold * factor)
        stale = self.staleness
        kept = [
            ep
            for ep in endpoints
            if ep.metrics.update_time != 0.0
            and now - ep.metrics.update_time <= stale
            and ep.metrics.waiting_queue_size < q_limit
            and ep.metrics.kv_cache_usage_percent < kv_limit
        ]
        return kept if kept else list(endpoints)
