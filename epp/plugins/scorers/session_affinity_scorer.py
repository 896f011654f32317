"""session-affinity-scorer (llm-d): 1.0 for the endpoint bound to the request's session, 0 for the others (a soft
preference other scorers can outweigh). Strategies and parameters: see `_session` (llm-d-router's
`strategy`, `profileName`, `encodedEndpointHeaderConfig`, `sessionIdConfig`; pyepp's earlier `headerName`/`ttl`
still work)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Self

from epp.framework import (
    CycleState,
    Endpoint,
    InferenceRequest,
    Params,
    Plugin,
    PluginContext,
    Response,
    SchedulingResult,
)
from epp.plugins.scorers._session import SessionBinding, encode_session_token

__all__ = ["SessionAffinityScorer", "encode_session_token"]


class SessionAffinityScorer(Plugin):
    type_name = "session-affinity-scorer"

    def __init__(self, name: str | None = None, binding: SessionBinding | None = None) -> None:
        super().__init__(name)
        self.binding = binding or SessionBinding(self.name)

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        return cls(name, SessionBinding.from_params(name, params, legacy=True))

    @property
    def strategy(self) -> str:
        return self.binding.strategy

    def score(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        bound = self.binding.bound(request)
        if bound is None:
            return [0.0] * len(endpoints)
        return [1.0 if SessionBinding.matches(bound, ep) else 0.0 for ep in endpoints]

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        self.binding.record(request, result)

    def response_received(self, request: InferenceRequest, response: Response, endpoint: Endpoint | None) -> None:
        """Echo the pod that served the request (or `profileName`'s pick) in the header the client sends back."""
        token = self.binding.response_token(request, endpoint)
        if token is not None:
            response.set_headers[self.binding.header] = token
