"""session-affinity-filter (llm-d-router): pins a session to the pod it used before, as a hard constraint: when that
pod is a candidate it is the only one returned; with no session, or the pod gone, every candidate passes (never an
empty set). Strategies and parameters as session-affinity-scorer (`_session`)."""

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
from epp.plugins.scorers._session import SessionBinding


class SessionAffinityFilter(Plugin):
    type_name = "session-affinity-filter"

    def __init__(self, name: str | None = None, binding: SessionBinding | None = None) -> None:
        super().__init__(name)
        self.binding = binding or SessionBinding(self.name)

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

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        self.binding.record(request, result)

    def response_received(self, request: InferenceRequest, response: Response, endpoint: Endpoint | None) -> None:
        token = self.binding.response_token(request, endpoint)
        if token is not None:
            response.set_headers[self.binding.header] = token
