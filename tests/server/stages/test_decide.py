"""The decide stage: the director's call for a parsed request (its failures answered at once), and the
body-less route taken at the headers without the director."""

from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry

from e2e.harness.directors import RoundRobinDirector
from epp.datalayer.datastore import Datastore
from epp.framework.errors import DROPPED_NO_ENDPOINTS, TooManyRequests
from epp.framework.types import Endpoint, InferenceRequest, Usage
from epp.requestcontrol.types import RoutingDecision
from epp.server.extproc import RequestStream, ServerState
from epp.server.metrics import RequestMetrics
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


class _Director(RoundRobinDirector):
    """Round-robin that notes how it was called, and can return a decision with no endpoint."""

    def __init__(self, ds: Datastore) -> None:
        super().__init__(ds)
        self.calls: list[tuple[str, bool, list[str] | None]] = []
        self.completed: list[str] = []
        self.empty = False

    async def handle_request(self, request: InferenceRequest, *, defer_records: bool = False) -> RoutingDecision:
        self.calls.append((request.request_id, defer_records, request.subset))
        if self.empty:
            return RoutingDecision(endpoints=[])
        return await super().handle_request(request)

    def handle_response_complete(
        self, request: InferenceRequest, decision: RoutingDecision | None, usage: Usage | None
    ) -> None:
        self.completed.append(request.request_id)


def _stream() -> tuple[RequestStream, _Director, CollectorRegistry]:
    ds = Datastore()
    ds.replace_all([Endpoint("a", "10.0.0.1", 8000), Endpoint("b", "10.0.0.2", 8000)])
    director, registry = _Director(ds), CollectorRegistry()
    return RequestStream(ServerState(director, ds, RequestMetrics(registry))), director, registry


@pytest.mark.parametrize("behind_servicer", [False, True])
async def test_the_director_gets_the_subset_and_defers_records_only_behind_the_servicer(behind_servicer: bool) -> None:
    """The servicer writes the answer before the records run (`defer_completion`): only then does decide ask the
    director to hold them back; a stream driven on its own gets every hook run inside the call."""
    s, director, registry = _stream()
    s.defer_completion = behind_servicer
    await s.handle(headers_msg(subset=["10.0.0.2:8000"]))
    out = list(await s.handle(body_msg(b'{"model":"m","prompt":"x"}', True)))
    assert set_headers(out[0])[DEST] == "10.0.0.2:8000"
    assert director.calls == [("rid-1", behind_servicer, ["10.0.0.2:8000"])]
    assert s.model_routed and s.decision is not None and s.request is not None and s.request.subset == ["10.0.0.2:8000"]
    assert registry.get_sample_value("inference_objective_running_requests", {"model_name": "m"}) == 1
    s.complete()
    assert director.completed == ["rid-1"]


async def test_a_decision_without_endpoints_is_a_503_the_director_never_hears_completed() -> None:
    s, director, _ = _stream()
    director.empty = True
    await s.handle(headers_msg())
    (r,) = list(await s.handle(body_msg(b'{"model":"m","prompt":"x"}', True)))
    ir = r.immediate_response
    assert ir.status.code == 503
    assert "failed to find target endpoint" in json.loads(ir.body)["error"]["message"]
    dropped = {h.header.key: h.header.raw_value for h in ir.headers.set_headers}["x-llm-d-request-dropped-reason"]
    assert dropped == DROPPED_NO_ENDPOINTS.encode()
    assert not s.model_routed
    s.complete()
    assert director.completed == []  # it never accepted the request
