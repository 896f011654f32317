"""session-affinity-scorer (llm-d): 1.0 for the endpoint bound to the request's session, 0 for the others.

Strategies:
- `encoded_endpoint_header`: header `x-session-token` = base64("namespace/name") of the endpoint to stick to.
- `session_id`: header `x-session-id`; the EPP remembers session → endpoint (set in PreRequest) for `ttl`.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from epp.framework import CycleState, Endpoint, InferenceRequest, Params, Plugin, SchedulingResult, register

SESSION_TOKEN_HEADER = "x-session-token"
SESSION_ID_HEADER = "x-session-id"


def encode_session_token(endpoint: Endpoint) -> str:
    return base64.b64encode(f"{endpoint.namespace}/{endpoint.name}".encode()).decode()


@register("session-affinity-scorer")
class SessionAffinityScorer(Plugin):
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
    def from_config(cls, name: str, parameters: dict[str, Any], context: Any) -> SessionAffinityScorer:
        p = Params(name, parameters)
        strategy = p.str("strategy", "encoded_endpoint_header", choices=("encoded_endpoint_header", "session_id"))
        header = p.get("headerName")
        if header is not None and not isinstance(header, str):
            raise p._fail("headerName", "expected a string")
        return cls(name, strategy=strategy, ttl=p.duration("ttl", 300.0), header=header.lower() if header else None)

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

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        targets = result.targets
        if not targets:
            return
        if self.strategy == "encoded_endpoint_header":
            # The token to echo on the response (the server copies request.data["response_headers"] if it supports it).
            request.data.setdefault("response_headers", {})[SESSION_TOKEN_HEADER] = encode_session_token(targets[0])
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
