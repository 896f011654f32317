"""agent-identity (llm-d-router): an agent session's id from its headers, stored as the request's AGENT_ID; the
director uses it as the flow-control fairness id when the client sent no explicit fairness header, so every turn
of an agent session lands in the same fairness queue.

Headers checked, first non-empty wins: `additionalSessionHeaders` (in order), then `x-claude-code-session-id`,
`x-session-affinity`, `session-id`, `session_id`. The value is client-controlled: it is cut to 256 characters.
"""

from __future__ import annotations

from typing import Self

from epp.framework import InferenceRequest, Params, Plugin, PluginContext, Stability
from epp.framework.attributes import AGENT_ID

DEFAULT_HEADERS = ("x-claude-code-session-id", "x-session-affinity", "session-id", "session_id")
MAX_ID_CHARS = 256


class AgentIdentity(Plugin):
    type_name = "agent-identity"
    stability = Stability.ALPHA

    def __init__(self, name: str | None = None, additional: tuple[str, ...] = ()) -> None:
        super().__init__(name)
        self.headers = tuple(h.lower() for h in additional) + DEFAULT_HEADERS

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        extra = params.list("additionalSessionHeaders")
        for i, h in enumerate(extra):
            if not isinstance(h, str) or not h.strip():
                raise params.fail("additionalSessionHeaders", f"entry {i} must be a header name")
        return cls(name, tuple(h.strip() for h in extra))

    def process_request_headers(self, request: InferenceRequest) -> None:
        for h in self.headers:
            v = request.headers.get(h, "").strip()
            if v:
                request.data.put(AGENT_ID, v[:MAX_ID_CHARS])
                return
