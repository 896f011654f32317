"""session-affinity-filter, session-id-producer and the llm-d-router parameters of session-affinity-scorer."""

from __future__ import annotations

import base64

import pytest

from epp.framework import (
    CycleState,
    Endpoint,
    InferenceRequest,
    PluginConfigError,
    ProfileResult,
    Response,
    SchedulingResult,
)
from epp.framework.attributes import AGENT_ID, SESSION_ID
from epp.plugins.filters.session_affinity_filter import SessionAffinityFilter
from epp.plugins.producers.session_id_producer import SessionIDProducer
from epp.plugins.scorers.session_affinity_scorer import SessionAffinityScorer
from tests.helpers import build

S = CycleState()
A, B, P = (Endpoint(n, f"10.0.0.{i}", 8000) for i, n in enumerate(("a", "b", "p"), 1))


def req(headers: dict[str, str] | None = None) -> InferenceRequest:
    return InferenceRequest("r", "/v1/completions", "completions", "m", "m", {}, headers=headers or {})


def result(primary: Endpoint, prefill: Endpoint | None = None) -> SchedulingResult:
    prs = {"decode": ProfileResult([primary])}
    if prefill is not None:
        prs["prefill"] = ProfileResult([prefill])
    return SchedulingResult(prs, "decode")


def test_filter_pins_the_encoded_pod_and_passes_through_otherwise() -> None:
    f = build(SessionAffinityFilter)
    token = base64.b64encode(b"default/b").decode()
    assert f.filter(S, req({"x-session-token": token}), [A, B]) == [B]
    assert f.filter(S, req({"x-session-token": token}), [A]) == [A]  # pod gone: everything passes
    assert f.filter(S, req({"x-session-token": "%%%"}), [A, B]) == [A, B]
    assert f.filter(S, req(), [A, B]) == [A, B]
    r = req()
    f.pre_request(r, result(A))
    resp = Response(200)
    f.response_received(r, resp, A)
    assert base64.b64decode(resp.set_headers["x-session-token"]) == b"default/a"


def test_filter_for_the_prefill_profile_sends_the_prefill_pod() -> None:
    f = build(
        SessionAffinityFilter,
        {"profileName": "prefill", "encodedEndpointHeaderConfig": {"header": "x-session-token-prefill"}},
        name="sa-prefill",
    )
    r = req()
    f.pre_request(r, result(A, prefill=P))
    resp = Response(200)
    f.response_received(r, resp, A)  # the served (decode) pod is A; this instance reports the prefill pick
    assert base64.b64decode(resp.set_headers["x-session-token-prefill"]) == b"default/p"


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


def test_scorer_takes_the_routers_session_id_config() -> None:
    s = build(
        SessionAffinityScorer, {"strategy": "session_id", "sessionIdConfig": {"sources": [{"attribute": "SessionID"}]}}
    )
    r = req()
    r.data.put(SESSION_ID, "conv-9")
    s.pre_request(r, result(A))
    r2 = req()
    r2.data.put(SESSION_ID, "conv-9")
    assert s.score(S, r2, [A, B]) == [1.0, 0.0]


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
