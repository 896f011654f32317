"""label-selector-filter (llm-d; formerly by-label-selector): keep endpoints matching a Kubernetes label selector."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Self

from epp.framework import CycleState, Endpoint, InferenceRequest, Params, Plugin, PluginConfigError, PluginContext
from epp.plugins.contracts.labels import Requirement

_OPS = ("In", "NotIn", "Exists", "DoesNotExist")


def parse_selector(name: str, p: Params) -> list[Requirement]:
    reqs = []
    match_labels = p.mapping("matchLabels")
    for k, v in match_labels.items():
        reqs.append(Requirement(str(k), "In", frozenset([str(v)])))
    for i, expr in enumerate(p.list("matchExpressions")):
        where = f"matchExpressions[{i}]"
        if not isinstance(expr, Mapping) or "key" not in expr or "operator" not in expr:
            raise PluginConfigError(f"{name}: {where}: needs key and operator", key="matchExpressions")
        op = expr["operator"]
        if op not in _OPS:
            raise PluginConfigError(
                f"{name}: {where}.operator: must be one of {', '.join(_OPS)}, got {op!r}", key="matchExpressions"
            )
        values = expr.get("values") or []
        if not isinstance(values, list):
            raise PluginConfigError(f"{name}: {where}.values: expected a list", key="matchExpressions")
        if op in ("In", "NotIn") and not values:
            raise PluginConfigError(f"{name}: {where}.values: {op} needs at least one value", key="matchExpressions")
        if op in ("Exists", "DoesNotExist") and values:
            raise PluginConfigError(f"{name}: {where}.values: must be empty for {op}", key="matchExpressions")
        reqs.append(Requirement(str(expr["key"]), op, frozenset(str(v) for v in values)))
    return reqs


class LabelSelectorFilter(Plugin):
    type_name = "label-selector-filter"
    aliases = ("by-label-selector",)

    def __init__(self, name: str | None = None, requirements: Sequence[Requirement] = ()) -> None:
        super().__init__(name)
        self.requirements = list(requirements)

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        return cls(name, parse_selector(name, params))

    def filter(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        reqs = self.requirements
        return [ep for ep in endpoints if all(r.matches(ep.labels) for r in reqs)]
