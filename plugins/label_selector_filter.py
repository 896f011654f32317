"""label-selector-filter (llm-d; formerly by-label-selector): keep endpoints matching a Kubernetes label selector."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from epp.framework import CycleState, Endpoint, InferenceRequest, Params, Plugin, PluginConfigError, register

_OPS = ("In", "NotIn", "Exists", "DoesNotExist")


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: str
    values: frozenset[str]

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "In":
            return labels.get(self.key) in self.values
        if self.operator == "NotIn":
            return labels.get(self.key) not in self.values
        if self.operator == "Exists":
            return self.key in labels
        return self.key not in labels


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


@register("label-selector-filter", "by-label-selector")
class LabelSelectorFilter(Plugin):
    def __init__(self, name: str | None = None, requirements: Sequence[Requirement] = ()) -> None:
        super().__init__(name)
        self.requirements = list(requirements)

    @classmethod
    def from_config(cls, name: str, parameters: dict[str, Any], context: Any) -> LabelSelectorFilter:
        p = Params(name, parameters)
        return cls(name, parse_selector(name, p))

    def filter(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        reqs = self.requirements
        return [ep for ep in endpoints if all(r.matches(ep.labels) for r in reqs)]


@register("by-label")
class ByLabelFilter(Plugin):
    """Keep endpoints whose `label` is one of `validValues` (and unlabeled ones if `allowsNoLabel`)."""

    def __init__(
        self, name: str | None = None, label: str = "", valid: frozenset[str] = frozenset(), no_label: bool = False
    ) -> None:
        super().__init__(name)
        self.label = label
        self.valid = valid
        self.allows_no_label = no_label

    @classmethod
    def from_config(cls, name: str, parameters: dict[str, Any], context: Any) -> ByLabelFilter:
        p = Params(name, parameters)
        label = p.str("label", "")
        if not label:
            raise PluginConfigError(f"{name}: parameter 'label' is required", key="label")
        values = p.list("validValues")
        no_label = p.bool("allowsNoLabel", False)
        if not values and not no_label:
            raise PluginConfigError(f"{name}: parameter 'validValues' must not be empty", key="validValues")
        return cls(name, label, frozenset(str(v) for v in values), no_label)

    def filter(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        out = []
        for ep in endpoints:
            v = ep.labels.get(self.label)
            if (v is None and self.allows_no_label) or (v is not None and v in self.valid):
                out.append(ep)
        return out
