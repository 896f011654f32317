"""session-affinity-scorer: encoded and custom headers, the session-id strategy and the router's sessionIdConfig."""

from __future__ import annotations

import base64
import time

import pytest

from epp.framework import (
    PluginConfigError,
    Response,
)
from epp.framework.attributes import SESSION_ID
from epp.plugins.scorers.session_affinity_scorer import SessionAffinityScorer
from tests.helpers import build
from tests.plugins.scorers.support import S, ep, req, result_for
from tests.plugins.support_session import A, B, result


def test_session_affinity_encoded_header() -> None:
    a, b = ep("a"), ep("b")
    token = base64.b64encode(b"default/b").decode()
    s = build(SessionAffinityScorer, name="sa", parameters={})
    assert s.score(S, req(headers={"x-session-token": token}), [a, b]) == [0.0, 1.0]
    assert s.score(S, req(headers={"x-session-token": "%%%"}), [a, b]) == [0.0, 0.0]
    response = Response(200)
    s.response_received(req(), response, a)
    assert base64.b64decode(response.set_headers["x-session-token"]) == b"default/a"


def test_session_affinity_custom_header_round_trips() -> None:
    """With `encodedEndpointHeaderConfig.header`, the token goes back in that header, so the next request sticks."""
    a, b = ep("a"), ep("b")
    s = build(SessionAffinityScorer, {"encodedEndpointHeaderConfig": {"header": "X-My-Session"}})
    response = Response(200)
    s.response_received(req(), response, b)
    assert set(response.set_headers) == {"x-my-session"}
    again = req(headers={"x-my-session": response.set_headers["x-my-session"]})
    assert s.score(S, again, [a, b]) == [0.0, 1.0]


def test_session_affinity_session_id_binds_and_expires() -> None:
    a, b = ep("a"), ep("b")
    s = build(
        SessionAffinityScorer,
        name="sa",
        parameters={"strategy": "session_id", "sessionIdConfig": {"evictionTtlSeconds": 0.05}},
    )
    r = req(headers={"x-session-id": "s1"})
    assert s.score(S, r, [a, b]) == [0.0, 0.0]
    s.pre_request(r, result_for(b))
    assert s.score(S, r, [a, b]) == [0.0, 1.0]
    time.sleep(0.06)
    assert s.score(S, r, [a, b]) == [0.0, 0.0]
    with pytest.raises(PluginConfigError, match="strategy"):
        build(SessionAffinityScorer, name="sa", parameters={"strategy": "sticky"})


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
