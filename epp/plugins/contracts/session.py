"""Session binding shared by session-affinity-scorer and session-affinity-filter (llm-d-router's parameters).

`encoded_endpoint_header` (default): the client echoes `encodedEndpointHeaderConfig.header` (x-session-token), the
base64 of "namespace/name" of the pod that served it; the same header goes back on each response.
`session_id`: an opaque id read from `sessionIdConfig.sources` ([{header: ...} | {attribute: ...}], first non-empty
wins; default the `x-session-id` header); the EPP binds id → pod after each pick, for `evictionTtlSeconds` unused
(swept every `evictionSweepSeconds`, and never more than MAX_SESSIONS bindings: client ids are bounded).
`profileName` binds the pod that profile picked (e.g. prefill) instead of the primary one.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections import OrderedDict
from typing import Any

from epp.framework import DataKey, Endpoint, InferenceRequest, Params, Plugin, Response, SchedulingResult
from epp.framework.attributes import AGENT_ID, SESSION_ID

SESSION_TOKEN_HEADER = "x-session-token"
SESSION_ID_HEADER = "x-session-id"
MAX_SESSIONS = 100_000
MAX_ID_CHARS = 512
STRATEGIES = ("encoded_endpoint_header", "session_id")
ATTRIBUTES: dict[str, DataKey[str]] = {"agent-identity": AGENT_ID, "SessionID": SESSION_ID, "session-id": SESSION_ID}


def encode_session_token(endpoint: Endpoint) -> str:
    return base64.b64encode(f"{endpoint.namespace}/{endpoint.name}".encode()).decode()


class SessionBinding:
    def __init__(
        self,
        owner: str,
        strategy: str = "encoded_endpoint_header",
        header: str = SESSION_TOKEN_HEADER,
        sources: list[tuple[str, str]] | None = None,
        ttl: float = 300.0,
        sweep_every: float = 10.0,
        profile: str = "",
    ) -> None:
        self.strategy, self.header, self.ttl, self.sweep_every, self.profile = (
            strategy,
            header,
            ttl,
            sweep_every,
            profile,
        )
        self.sources = sources or [("header", SESSION_ID_HEADER)]
        self._sessions: OrderedDict[str, tuple[str, float]] = OrderedDict()  # id -> (endpoint name, last use)
        self._last_sweep = time.monotonic()
        self._served: DataKey[Endpoint] = DataKey(f"session-affinity-target/{owner}")

    @classmethod
    def from_params(cls, owner: str, params: Params) -> SessionBinding:
        strategy = params.str("strategy", STRATEGIES[0], choices=STRATEGIES)
        profile = params.str("profileName", "")
        enc = params.section("encodedEndpointHeaderConfig")
        sid = params.section("sessionIdConfig")
        header = (enc.str("header", SESSION_TOKEN_HEADER) or SESSION_TOKEN_HEADER).lower()
        sources: list[tuple[str, str]] = []
        for i, src in enumerate(sid.list("sources")):
            sp = Params(params.plugin, src, path=f"sessionIdConfig.sources[{i}]")
            h, a = sp.optional_str("header"), sp.optional_str("attribute")
            if bool(h) == bool(a):
                raise sp.fail("header", "set exactly one of header and attribute")
            unknown = sp.unread_error()
            if unknown is not None:
                raise unknown
            sources.append(("header", h.lower()) if h else ("attribute", str(a)))
        ttl = sid.float("evictionTtlSeconds", 300.0, min=0.0, min_exclusive=True)
        sweep = sid.float("evictionSweepSeconds", 10.0, min=0.0, min_exclusive=True)
        return cls(owner, strategy, header, sources or None, ttl, sweep, profile)

    def session_id(self, request: InferenceRequest) -> str | None:
        for kind, name in self.sources:
            if kind == "header":
                v: Any = request.headers.get(name)
            else:
                v = request.data.get(ATTRIBUTES.get(name) or DataKey(name))
            if isinstance(v, str) and v.strip():
                return v.strip()[:MAX_ID_CHARS]
        return None

    def bound(self, request: InferenceRequest) -> tuple[str, str] | None:
        """(kind, value): ("ns/name", ...) for a decoded token, ("name", ...) for a session id binding."""
        if self.strategy == "encoded_endpoint_header":
            value = request.headers.get(self.header)
            if not value:
                return None
            try:
                return ("ns/name", base64.b64decode(value, validate=True).decode())
            except (binascii.Error, UnicodeDecodeError):
                return None
        sid = self.session_id(request)
        if sid is None:
            return None
        now = time.monotonic()
        self._sweep(now)
        entry = self._sessions.get(sid)
        if entry is None or now - entry[1] > self.ttl:
            return None
        return ("name", entry[0])

    @staticmethod
    def matches(bound: tuple[str, str], ep: Endpoint) -> bool:
        kind, value = bound
        return (f"{ep.namespace}/{ep.name}" if kind == "ns/name" else ep.name) == value

    def target(self, result: SchedulingResult) -> Endpoint | None:
        if self.profile:
            pr = result.profile_results.get(self.profile)
            return pr.targets[0] if pr is not None and pr.targets else None
        return result.targets[0] if result.targets else None

    def record(self, request: InferenceRequest, result: SchedulingResult) -> None:
        """After the pick: remember the pod (session_id) and the token to send back."""
        target = self.target(result)
        if target is None:
            return
        request.data.put(self._served, target)
        if self.strategy != "session_id":
            return
        sid = self.session_id(request)
        if sid is None:
            return
        self._sessions[sid] = (target.name, time.monotonic())
        self._sessions.move_to_end(sid)
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)

    def response_token(self, request: InferenceRequest, served: Endpoint | None) -> str | None:
        if self.strategy != "encoded_endpoint_header":
            return None
        target = request.data.get(self._served) if self.profile else served
        if target is None:
            target = request.data.get(self._served)
        return encode_session_token(target) if target is not None else None

    def _sweep(self, now: float) -> None:
        if now - self._last_sweep < self.sweep_every:
            return
        self._last_sweep = now
        while self._sessions:  # entries are kept in last-use order
            first = next(iter(self._sessions.values()))
            if now - first[1] <= self.ttl:
                break
            self._sessions.popitem(last=False)


class SessionAffinityPlugin(Plugin):
    """What session-affinity-filter and -scorer share: the binding, recorded after the pick (PreRequest) and the
    token sent back with the response (ResponseReceived)."""

    def __init__(self, name: str | None = None, binding: SessionBinding | None = None) -> None:
        super().__init__(name)
        self.binding = binding or SessionBinding(self.name)

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        self.binding.record(request, result)

    def response_received(self, request: InferenceRequest, response: Response, endpoint: Endpoint | None) -> None:
        token = self.binding.response_token(request, endpoint)
        if token is not None:
            response.set_headers[self.binding.header] = token
