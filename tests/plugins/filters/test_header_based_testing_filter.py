"""GIE's conformance filter (header-based-testing-filter) and the destination-endpoint-served verifier."""

from __future__ import annotations

from epp.framework import (
    Response,
)
from epp.plugins.filters.header_based_testing_filter import HeaderBasedTestingFilter
from epp.plugins.requestcontrol.destination_endpoint_served_verifier import DestinationEndpointServedVerifier
from tests.plugins.support_catalog import S, ep, req


def test_conformance_filter_and_verifier() -> None:
    e = [ep(1), ep(2), ep(3)]
    f = HeaderBasedTestingFilter()
    assert f.filter(S, req(), e) == []
    assert [
        x.name for x in f.filter(S, req({"test-epp-endpoint-selection": "10.0.0.3, 10.0.0.1:8000,10.0.0.3"}), e)
    ] == [
        "e3",
        "e1",
    ]
    assert f.filter(S, req({"test-epp-endpoint-selection": "10.0.0.2:9999"}), e) == []
    v = DestinationEndpointServedVerifier()
    resp = Response(200)
    v.response_received(req(), resp, e[1])
    assert resp.set_headers == {"x-conformance-test-served-endpoint": "10.0.0.2:8000"}
    v.response_received(req(), resp, None)
    assert resp.set_headers["x-conformance-test-served-endpoint"].startswith("fail: missing")
