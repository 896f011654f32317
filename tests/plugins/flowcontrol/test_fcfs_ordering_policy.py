"""fcfs-ordering-policy through the real FlowController and Director: arrival order."""

from __future__ import annotations

from epp.requestcontrol.flowcontrol_spec import FlowControlSpec, PriorityBandSpec
from tests.plugins.flowcontrol.support import QUEUE, fc_director, order_of, pool


async def test_fcfs_keeps_arrival_order_with_the_same_requests() -> None:
    ds = pool(50)
    spec = FlowControlSpec(default_request_ttl=10.0, default_priority_band=PriorityBandSpec(0, ordering_policy_ref="f"))
    d = fc_director(ds, QUEUE + "- {name: f, type: fcfs-ordering-policy}\n", spec)
    t = "x-envoy-expected-rq-timeout-ms"
    assert await order_of(d, ds, [("a", {}), ("b", {t: "500"})]) == ["a", "b"]
