"""slo-deadline-ordering-policy: orders by the TTFT header's deadline."""

from __future__ import annotations

from epp.requestcontrol.flowcontrol_spec import FlowControlSpec, PriorityBandSpec
from tests.plugins.flowcontrol.support import QUEUE, fc_director, order_of, pool


async def test_slo_deadline_orders_by_the_ttft_header() -> None:
    ds = pool(50)
    spec = FlowControlSpec(default_priority_band=PriorityBandSpec(0, ordering_policy_ref="slo"))
    d = fc_director(ds, QUEUE + "- {name: slo, type: slo-deadline-ordering-policy}\n", spec)
    sends = [
        ("none", {}),
        ("loose", {"x-llm-d-slo-ttft-ms": "5000"}),
        ("tight", {"x-llm-d-slo-ttft-ms": "100"}),
        ("legacy", {"x-slo-ttft-ms": "1000"}),
        ("invalid", {"x-llm-d-slo-ttft-ms": "soon"}),
    ]
    assert await order_of(d, ds, sends) == ["tight", "legacy", "loose", "none", "invalid"]
