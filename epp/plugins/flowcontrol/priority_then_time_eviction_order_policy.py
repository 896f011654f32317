"""priority-then-time-eviction-order-policy (llm-d-router flow-control eviction): the victim is the lowest-priority
in-flight request, and among equals the most recently dispatched (the least KV-cache work lost)."""

from __future__ import annotations

from epp.framework import Plugin, Stability


class PriorityThenTimeEvictionOrderPolicy(Plugin):
    type_name = "priority-then-time-eviction-order-policy"
    stability = Stability.ALPHA

    def victim_key(self, priority: int, dispatched: float) -> tuple[int, float]:
        """Smaller is evicted first."""
        return (priority, -dispatched)
