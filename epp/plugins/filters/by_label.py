"""by-label (llm-d, deprecated): keep endpoints whose `label` is one of `validValues` (+ unlabeled if allowed)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Self

from epp.framework import CycleState, Endpoint, InferenceRequest, Params, Plugin, PluginConfigError, PluginContext


class ByLabelFilter(Plugin):
    """Keep endpoints whose `label` is one of `validValues` (and unlabeled ones if `allowsNoLabel`)."""

    type_name = "by-label"

    def __init__(
        self, name: str | None = None, label: str = "", valid: frozenset[str] = frozenset(), no_label: bool = False
    ) -> None:
        super().__init__(name)
        self.label = label
        self.valid = valid
        self.allows_no_label = no_label

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        label = params.str("label", "")
        if not label:
            raise PluginConfigError(f"{name}: parameter 'label' is required", key="label")
        values = params.list("validValues")
        no_label = params.bool("allowsNoLabel", False)
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
