"""session-id-producer (llm-d-router): the request's session id, from a header (`headerName`) or a cookie
(`cookieName`; exactly one), published as SESSION_ID for session-aware plugins (`attribute: SessionID`).
Absent or empty: nothing is published (no session preference). Client-controlled: cut to 512 characters."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from http.cookies import CookieError, SimpleCookie
from typing import Any, Self

from epp.framework import DataKey, Endpoint, InferenceRequest, Params, Plugin, PluginContext
from epp.framework.attributes import SESSION_ID

MAX_ID_CHARS = 512


class SessionIDProducer(Plugin):
    type_name = "session-id-producer"

    def __init__(self, name: str | None = None, header: str = "", cookie: str = "") -> None:
        super().__init__(name)
        self.header, self.cookie = header.lower(), cookie

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        header, cookie = params.str("headerName", ""), params.str("cookieName", "")
        if bool(header.strip()) == bool(cookie.strip()):
            raise params.fail("headerName", "set exactly one of headerName and cookieName")
        return cls(name, header.strip(), cookie.strip())

    def produces(self) -> Collection[DataKey[Any]]:
        return (SESSION_ID,)

    def session_id(self, request: InferenceRequest) -> str | None:
        if self.header:
            v = request.headers.get(self.header, "").strip()
            return v[:MAX_ID_CHARS] or None
        raw = request.headers.get("cookie", "")
        if not raw:
            return None
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(raw)
        except CookieError:
            return None
        morsel = jar.get(self.cookie)
        v = morsel.value.strip() if morsel is not None else ""
        return v[:MAX_ID_CHARS] or None

    async def prepare(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        sid = self.session_id(request)
        if sid is not None:
            request.data.put(SESSION_ID, sid)
