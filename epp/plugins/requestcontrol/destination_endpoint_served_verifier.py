"""destination-endpoint-served-verifier (GIE conformance): echoes the endpoint Envoy reports it served
(`envoy.lb` `x-gateway-destination-endpoint-served` metadata; the director falls back to the pick when Envoy sent
none) to the client in `x-conformance-test-served-endpoint`,
or `fail: missing destination endpoint served metadata`. For conformance tests only."""

from __future__ import annotations

from epp.framework import Endpoint, InferenceRequest, Plugin, Response

RESULT_HEADER = "x-conformance-test-served-endpoint"


class DestinationEndpointServedVerifier(Plugin):
    type_name = "destination-endpoint-served-verifier"

    def response_received(self, request: InferenceRequest, response: Response, endpoint: Endpoint | None) -> None:
        if endpoint is None:
            response.set_headers[RESULT_HEADER] = "fail: missing destination endpoint served metadata"
        else:
            response.set_headers[RESULT_HEADER] = endpoint.hostport
