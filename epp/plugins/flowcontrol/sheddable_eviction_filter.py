"""sheddable-eviction-filter (llm-d-router flow-control eviction): only sheddable in-flight requests (priority < 0)
may be evicted; higher-priority traffic is never revoked. The eviction built into flow control uses this rule."""

from __future__ import annotations

from epp.framework import Plugin, Stability


class SheddableEvictionFilter(Plugin):
    type_name = "sheddable-eviction-filter"
    stability = Stability.ALPHA

    def eligible(self, priority: int) -> bool:
        return priority < 0
