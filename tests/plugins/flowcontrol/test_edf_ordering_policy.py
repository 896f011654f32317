"""edf-ordering-policy through the real FlowController and Director: deadline order, not arrival."""

from __future__ import annotations

import pytest

from epp.plugins.flowcontrol.edf_ordering_policy import EDFOrderingPolicy
from epp.plugins.flowcontrol.slo_deadline_ordering_policy import SLODeadlineOrderingPolicy
from epp.requestcontrol.flowcontrol_spec import FlowControlSpec, PriorityBandSpec
from tests.plugins.flowcontrol.support import QUEUE, chat_req, fc_director, order_of, pool


async def test_edf_orders_by_deadline_not_arrival() -> None:
    ds = pool(50)
    spec = FlowControlSpec(
        default_request_ttl=10.0, default_priority_band=PriorityBandSpec(0, ordering_policy_ref="edf")
    )
    d = fc_director(ds, QUEUE + "- {name: edf, type: edf-ordering-policy}\n", spec)
    t = "x-envoy-expected-rq-timeout-ms"
    sends = [("no-deadline-hint", {}), ("caller-2s", {t: "2000"}), ("caller-500ms", {t: "500"}), ("bad", {t: "x"})]
    # 10 s default TTL for all; the caller's own deadline clamps it; same deadlines leave in arrival order
    assert await order_of(d, ds, sends) == ["caller-500ms", "caller-2s", "no-deadline-hint", "bad"]


def test_edf_and_slo_deadlines() -> None:
    r = chat_req("r", {"x-envoy-expected-rq-timeout-ms": "300"})
    assert EDFOrderingPolicy().deadline(r, r.arrival, None) == pytest.approx(r.arrival + 0.3)
    assert EDFOrderingPolicy().deadline(chat_req("r"), 5.0, None) == float("inf")
    assert EDFOrderingPolicy().deadline(chat_req("r"), 5.0, 2.0) == 7.0
    s = chat_req("s", {"x-llm-d-slo-ttft-ms": "-5"})
    assert SLODeadlineOrderingPolicy().deadline(s, 0.0, None) == float("inf")
