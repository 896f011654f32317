"""header-label-affinity-scorer (llm-d-router): 1 for endpoints whose label `labelKey` equals the request header
`headerName`, else 0 (soft affinity: the others stay eligible). One instance per header-to-label mapping."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Self

from epp.framework import CycleState, Endpoint, InferenceRequest, Params, Plugin, PluginContext, Stability


class HeaderLabelAffinityScorer(Plugin):
    type_name = "header-label-affinity-scorer"
    stability = Stability.ALPHA

    def __init__(self, name: str, header: str, label: str) -> None:
        super().__init__(name)
        self.header = header.lower()
        self.label = label

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        header, label = params.str("headerName", ""), params.str("labelKey", "")
        if not header.strip():
            raise params.fail("headerName", "required")
        if not label.strip():
            raise params.fail("labelKey", "required")
        return cls(name, header.strip(), label.strip())

    def score(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        want = request.headers.get(self.header, "").strip()
        if not want:
            return [0.0] * len(endpoints)
        return [1.0 if ep.labels.get(self.label) == want else 0.0 for ep in endpoints]
