"""endpoint-attribute-scorer (llm-d-router): a linear score from one numeric endpoint attribute.

score = (v - min) / (max - min), inverted for `linear_lower_is_better`. The range is the candidates' own
(`adaptiveRange`, the default; all equal → 1.0) or `fixedRange: {min, max}` (values clamped). An endpoint without
the attribute scores 0 and takes no part in the range.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Self

from epp.framework import CycleState, Endpoint, InferenceRequest, Params, Plugin, PluginContext, Stability
from epp.plugins.contracts.attribute import attribute_reader


class EndpointAttributeScorer(Plugin):
    type_name = "endpoint-attribute-scorer"
    stability = Stability.ALPHA

    def __init__(
        self,
        name: str,
        read: Callable[[Endpoint], float | None],
        lower_is_better: bool,
        fixed: tuple[float, float] | None = None,
    ) -> None:
        super().__init__(name)
        self.read = read
        self.lower_is_better = lower_is_better
        self.fixed = fixed

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        read = attribute_reader(params, "attributeKey")
        algo = params.section("algorithm")
        kind = algo.str("type", "", choices=("linear_lower_is_better", "linear_higher_is_better"))
        norm = algo.section("normalization")
        if norm.has("adaptiveRange") and norm.has("fixedRange"):
            raise norm.fail("fixedRange", "at most one of adaptiveRange and fixedRange")
        norm.get("adaptiveRange")
        fixed = None
        if norm.has("fixedRange"):
            fr = norm.section("fixedRange")
            lo, hi = fr.float("min", 0.0), fr.float("max", 1.0)
            if lo >= hi:
                raise fr.fail("max", f"must be greater than min ({lo})")
            fixed = (lo, hi)
        return cls(name, read, kind == "linear_lower_is_better", fixed)

    def score(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        values = [self.read(ep) for ep in endpoints]
        present = [v for v in values if v is not None]
        if not present:
            return [0.0] * len(endpoints)
        lo, hi = self.fixed if self.fixed is not None else (min(present), max(present))
        out = []
        for v in values:
            if v is None:
                out.append(0.0)
                continue
            if hi == lo:
                out.append(1.0)
                continue
            x = (min(max(v, lo), hi) - lo) / (hi - lo)
            out.append(1.0 - x if self.lower_is_better else x)
        return out
