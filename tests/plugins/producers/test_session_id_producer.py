"""session-id-producer: the session-id strategy binds from its sources in order; header and cookie."""

from __future__ import annotations

import pytest

from epp.framework import (
    PluginConfigError,
    Response,
)
from epp.framework.attributes import AGENT_ID, SESSION_ID
from epp.plugins.filters.session_affinity_filter import SessionAffinityFilter
from epp.plugins.producers.session_id_producer import SessionIDProducer
from tests.helpers import build
from tests.plugins.support_session import A, B, S, req, result


def test_session_id_strategy_binds_from_sources_in_order() -> None:
    params = {
        "strategy": "session_id",
        "sessionIdConfig": {"sources": [{"header": "X-Session-Id"}, {"attribute": "agent-identity"}]},
    }
    f = build(SessionAffinityFilter, params)
    first = req()
    first.data.put(AGENT_ID, "agent-1")
    assert f.filter(S, first, [A, B]) == [A, B]  # unbound: no preference
    f.pre_request(first, result(B))
    again = req()
    again.data.put(AGENT_ID, "agent-1")
    assert f.filter(S, again, [A, B]) == [B]
    other = req({"x-session-id": "s-2"})
    other.data.put(AGENT_ID, "agent-1")  # the header source wins and is not bound yet
    assert f.filter(S, other, [A, B]) == [A, B]
    resp = Response(200)
    f.response_received(again, resp, B)
    assert resp.set_headers == {}  # nothing goes back to the client in session_id mode
    with pytest.raises(PluginConfigError, match="exactly one of header and attribute"):
        build(SessionAffinityFilter, {"sessionIdConfig": {"sources": [{"header": "a", "attribute": "b"}]}})
    with pytest.raises(PluginConfigError, match=r"unknown parameter 'sessionIdConfig.sources\[0\].cookie'"):
        build(SessionAffinityFilter, {"sessionIdConfig": {"sources": [{"header": "a", "cookie": "b"}]}})


async def test_session_id_producer_header_and_cookie() -> None:
    h = build(SessionIDProducer, {"headerName": "X-Conv"})
    r = req({"x-conv": " c1 "})
    await h.prepare(r, [])
    assert r.data.get(SESSION_ID) == "c1"
    c = build(SessionIDProducer, {"cookieName": "llm-d-session"})
    r2 = req({"cookie": "a=1; llm-d-session=abc; b=2"})
    await c.prepare(r2, [])
    assert r2.data.get(SESSION_ID) == "abc"
    r3 = req({"cookie": "a=1"})
    await c.prepare(r3, [])
    assert SESSION_ID not in r3.data
    with pytest.raises(PluginConfigError, match="exactly one"):
        build(SessionIDProducer, {"headerName": "a", "cookieName": "b"})
    with pytest.raises(PluginConfigError, match="exactly one"):
        build(SessionIDProducer, {})
