"""session-affinity-scorer (llm-d): 1.0 for the endpoint bound to the request's session, 0 for the others (a soft
preference other scorers can outweigh). Strategies and parameters (llm-d-router's `strategy`, `profileName`,
`encodedEndpointHeaderConfig`, `sessionIdConfig`): `epp.plugins.contracts.session`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Self

from epp.framework import CycleState, Endpoint, InferenceRequest, Params, PluginContext, Stability
from epp.plugins.contracts.session import SessionAffinityPlugin, SessionBinding, encode_session_token

__all__ = ["SessionAffinityScorer", "encode_session_token"]


class SessionAffinityScorer(SessionAffinityPlugin):
    type_name = "session-affinity-scorer"
    stability = Stability.ALPHA

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        return cls(name, SessionBinding.from_params(name, params))

    @property
    def strategy(self) -> str:
        return self.binding.strategy

    def score(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        bound = self.binding.bound(request)
        if bound is None:
            return [0.0] * len(endpoints)
        return [1.0 if SessionBinding.matches(bound, ep) else 0.0 for ep in endpoints]
