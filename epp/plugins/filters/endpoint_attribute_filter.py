"""endpoint-attribute-filter (llm-d-router): keeps endpoints whose numeric attribute passes a threshold.

`attribute` (see `_attribute`: a core metric or a producer's scalar), `algorithm: {type: threshold, threshold:
{operator, value}}`; `onMissing: Pass|Fail` for endpoints without it; `fallbackOnEmpty` returns every candidate
when none passes.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Self

from epp.framework import CycleState, Endpoint, InferenceRequest, Params, Plugin, PluginContext, Stability
from epp.plugins.contracts.attribute import attribute_reader

OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "LessThan": operator.lt,
    "LessThanOrEqual": operator.le,
    "GreaterThan": operator.gt,
    "GreaterThanOrEqual": operator.ge,
    "Equal": operator.eq,
    "NotEqual": operator.ne,
}


class EndpointAttributeFilter(Plugin):
    type_name = "endpoint-attribute-filter"
    stability = Stability.ALPHA

    def __init__(
        self,
        name: str,
        read: Callable[[Endpoint], float | None],
        op: Callable[[float, float], bool],
        value: float,
        pass_missing: bool = True,
        fallback_on_empty: bool = False,
    ) -> None:
        super().__init__(name)
        self.read, self.op, self.value = read, op, value
        self.pass_missing = pass_missing
        self.fallback_on_empty = fallback_on_empty

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        read = attribute_reader(params, "attribute")
        algo = params.section("algorithm")
        algo.str("type", "", choices=("threshold",))
        th = algo.section("threshold")
        op = th.str("operator", "", choices=tuple(OPERATORS))
        if not th.has("value"):
            raise th.fail("value", "required")
        return cls(
            name,
            read,
            OPERATORS[op],
            th.float("value", 0.0),
            params.str("onMissing", "Pass", choices=("Pass", "Fail")) == "Pass",
            params.bool("fallbackOnEmpty", False),
        )

    def filter(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        kept = []
        for ep in endpoints:
            v = self.read(ep)
            if (v is None and self.pass_missing) or (v is not None and self.op(v, self.value)):
                kept.append(ep)
        if not kept and self.fallback_on_empty:
            return list(endpoints)
        return kept
