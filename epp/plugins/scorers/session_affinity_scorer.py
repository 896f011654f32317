"""session-affinity-scorer (llm-d): 1.0 for the endpoint bound to the request's session, 0 for the others.

Strategies:
- `encoded_endpoint_header`: header `x-session-token` (or `headerName`) = base64("namespace/name") of the endpoint
  to stick to; the same header goes back on the response, naming the endpoint that served the request.
- `session_id`: header `x-session-id` (or `headerName`); the EPP remembers session → endpoint (set in PreRequest)
  for `ttl`.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections import OrderedDict
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

SESSION_TOKEN_HEADER = "x-session-token"
SESSION_ID_HEADER = "x-session-id"


def encode_session_token(endpoint: Endpoint) -> str:
    return base64.b64encode(f"{endpoint.namespace}/{endpoint.name}".encode()).decode()


class SessionAffinityScorer(Plugin):
    type_name = "session-affinity-scorer"

    def __init__(
        self,
        name: str | None = None,
        strategy: str = "encoded_endpoint_header",
        ttl: float = 300.0,
        header: str | None = None,
    ) -> None:
        super().__init__(name)
        self.strategy = strategy
        self.ttl = ttl
        self.header = header or (SESSION_TOKEN_HEADER if strategy == "encoded_endpoint_header" else SESSION_ID_HEADER)
        self._sessions: OrderedDict[str, tuple[str, float]] = OrderedDict()  # session id -> (endpoint, expiry)

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        strategy = params.str("strategy", "encoded_endpoint_header", choices=("encoded_endpoint_header", "session_id"))
        header = params.optional_str("headerName")
        ttl = params.duration("ttl", 300.0)
        return cls(name, strategy=strategy, ttl=ttl, header=header.lower() if header else None)

    def _bound(self, request: InferenceRequest) -> str | None:
        value = request.headers.get(self.header)
        if not value:
            return None
        if self.strategy == "encoded_endpoint_header":
            try:
                return base64.b64decode(value, validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                return None
        entry = self._sessions.get(value)
        if entry is None or entry[1] < time.monotonic():
            return None
        return entry[0]

    def score(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        bound = self._bound(request)
        if bound is None:
            return [0.0] * len(endpoints)
        if self.strategy == "encoded_endpoint_header":
            return [1.0 if f"{ep.namespace}/{ep.name}" == bound else 0.0 for ep in endpoints]
        return [1.0 if ep.name == bound else 0.0 for ep in endpoints]

    def response_received(self, request: InferenceRequest, response: Response, endpoint: Endpoint | None) -> None:
        """Echo the endpoint that served the request in the header the client sends back."""
        if self.strategy == "encoded_endpoint_header" and endpoint is not None:
            response.set_headers[self.header] = encode_session_token(endpoint)

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        targets = result.targets
        if not targets or self.strategy != "session_id":
            return
        sid = request.headers.get(self.header)
        if not sid:
            return
        now = time.monotonic()
        self._sessions[sid] = (targets[0].name, now + self.ttl)
        self._sessions.move_to_end(sid)
        while self._sessions:  # expire from the oldest end (entries are kept in refresh order)
            first = next(iter(self._sessions.values()))
            if first[1] >= now:
                break
            self._sessions.popitem(last=False)
