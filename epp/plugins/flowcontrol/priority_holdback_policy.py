"""priority-holdback-policy (flow control usage limit): one dispatch ceiling per active priority, from
`maxCeiling` (highest) down to `minCeiling` (lowest), so lower priorities are held first as saturation rises.

`domain: rank` spaces the ceilings evenly by rank; `domain: value` by the priorities' numeric values. `shape` is
`linear` (the only one the anchor has).
"""

from __future__ import annotations

from typing import Self

from epp.framework import Params, Plugin, PluginContext, Stability


class PriorityHoldbackPolicy(Plugin):
    type_name = "priority-holdback-policy"
    stability = Stability.ALPHA

    def __init__(self, name: str, min_ceiling: float, max_ceiling: float = 1.0, domain: str = "rank") -> None:
        super().__init__(name)
        self.min_ceiling, self.max_ceiling, self.domain = min_ceiling, max_ceiling, domain
        self.threshold = max_ceiling

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        params.str("shape", "linear", choices=("linear",))
        domain = params.str("domain", "rank", choices=("rank", "value"))
        if not params.has("minCeiling"):
            raise params.fail("minCeiling", "required: the ceiling of the lowest priority, in [0, 1)")
        lo = params.float("minCeiling", 0.0, min=0.0, max=1.0)
        if lo >= 1.0:
            raise params.fail("minCeiling", "must be < 1.0")
        hi = params.float("maxCeiling", 1.0, min=0.0, min_exclusive=True, max=1.0)
        if lo > hi:
            raise params.fail("minCeiling", f"must not exceed maxCeiling ({hi})")
        return cls(name, lo, hi, domain)

    def ceilings(self, saturation: float, priorities: list[int]) -> list[float]:
        n = len(priorities)
        if n <= 1:
            return [self.max_ceiling] * n
        span = self.max_ceiling - self.min_ceiling
        if self.domain == "rank":
            return [self.max_ceiling - i * span / (n - 1) for i in range(n)]
        p_max, p_min = max(priorities), min(priorities)
        if p_max == p_min:
            return [self.max_ceiling] * n
        return [self.min_ceiling + (p - p_min) / (p_max - p_min) * span for p in priorities]
