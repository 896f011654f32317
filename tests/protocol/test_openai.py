"""OpenAI request parsing (no gRPC, no Envoy)."""

from __future__ import annotations

from epp.protocol.openai import bodyless_request


def test_bodyless_request() -> None:
    req = bodyless_request({":path": "/v1/models", ":method": "GET"})
    assert req.api == "other"
    assert req.model == ""
    assert req.request_id
