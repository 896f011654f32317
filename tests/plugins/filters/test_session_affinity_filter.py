"""session-affinity-filter: pins the encoded pod (the prefill pod for the prefill profile) or passes through."""

from __future__ import annotations

import base64

from epp.framework import (
    Response,
)
from epp.plugins.filters.session_affinity_filter import SessionAffinityFilter
from tests.helpers import build
from tests.plugins.support_session import A, B, P, S, req, result


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
