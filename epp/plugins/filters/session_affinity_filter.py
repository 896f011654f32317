"""session-affinity-filter (llm-d-router): pins a session to the pod it used before, as a hard constraint: when that
pod is a candidate it is the only one returned; with no session, or the pod gone, every candidate passes (never an
empty set). Strategies and parameters as session-affinity-scorer (`epp.plugins.contracts.session`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Self

from epp.framework import CycleState, Endpoint, InferenceRequest, Params, PluginContext, Stability
from epp.plugins.contracts.session import SessionAffinityPlugin, SessionBinding


class SessionAffinityFilter(SessionAffinityPlugin):
    type_name = "session-affinity-filter"
    stability = Stability.ALPHA

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        return cls(name, SessionBinding.from_params(name, params))

    def filter(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        bound = self.binding.bound(request)
        if bound is not None:
            pinned = [ep for ep in endpoints if SessionBinding.matches(bound, ep)]
            if pinned:
                return pinned[:1]
        return list(endpoints)
