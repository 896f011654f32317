"""The decide stage: the director's call for a parsed request (its failures answered at once), and the
body-less route taken at the headers without the director."""

from __future__ import annotations

import json

from epp.framework.errors import TooManyRequests
from tests.server.support import (
    DEST,
    Harness,
    body_msg,
    exchange,
    headers_msg,
    set_headers,
)


async def test_429_and_internal_500_are_immediate(epp: Harness) -> None:
    epp.director.fail = TooManyRequests("system saturated, sheddable request dropped")
    call = epp.stub.Process()
    (resp,) = await exchange(call, [headers_msg(), body_msg(b'{"model":"m","prompt":"x"}', True)], 1)
    assert resp.immediate_response.status.code == 429
    call.cancel()
    epp.director.fail = RuntimeError("boom")
    call = epp.stub.Process()
    (resp,) = await exchange(call, [headers_msg(), body_msg(b'{"model":"m","prompt":"x"}', True)], 1)
    assert resp.immediate_response.status.code == 500
    message = json.loads(resp.immediate_response.body)["error"]["message"]
    assert message == "inference error: Internal - internal error"  # the cause is logged, never sent
    call.cancel()


async def test_bodyless_get_routed_at_headers(epp: Harness) -> None:
    call = epp.stub.Process()
    (resp,) = await exchange(call, [headers_msg("/v1/models", "GET", eos=True, extra={DEST: "6.6.6.6:1"})], 1)
    assert set_headers(resp)[DEST].startswith("10.0.0.1:")
    assert resp.dynamic_metadata.fields["envoy.lb"].struct_value.fields[DEST].string_value
    call.cancel()
    assert epp.director.requests == []
