"""The FlowController: a request with no endpoint waits for one until its TTL; the policies' optional capabilities."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

import pytest

from epp.datalayer.datastore import Datastore
from epp.framework import InferenceRequest, Plugin
from epp.plugins.saturation.utilization_detector import UtilizationDetector
from epp.requestcontrol.flowcontrol import FlowController
from epp.requestcontrol.flowcontrol_spec import FlowControlSpec, PriorityBandSpec
from tests.plugins.flowcontrol.support import QUEUE, chat_req, fc_director, pool


async def test_no_endpoint_request_ttl_waits_for_an_endpoint() -> None:
    from epp.framework import ServiceUnavailable

    ds = Datastore()
    d = fc_director(ds, QUEUE, FlowControlSpec(no_endpoint_request_ttl=1.0))
    pending = asyncio.create_task(d.handle_request(chat_req("r")))
    await asyncio.sleep(0.1)
    assert not pending.done()  # no endpoint yet: it waits instead of a 503
    fresh_pool = pool(0)
    ds.replace_all(list(fresh_pool.endpoints()))
    decision = await asyncio.wait_for(pending, 1)
    assert decision.endpoints[0].name == "pod-0"
    empty = fc_director(Datastore(), QUEUE, FlowControlSpec(no_endpoint_request_ttl=0.1))
    t0 = time.monotonic()
    with pytest.raises(ServiceUnavailable):
        await empty.handle_request(chat_req("x"))
    assert 0.09 <= time.monotonic() - t0 < 1.0
    with pytest.raises(ServiceUnavailable):  # without the setting: at once, as before
        await fc_director(Datastore(), QUEUE, FlowControlSpec()).handle_request(chat_req("y"))


class Limit(Plugin):
    threshold = 0.8


class Ceilings(Limit):
    def ceilings(self, saturation: float, priorities: list[int]) -> list[float]:
        return [1.0 if p > 0 else 0.5 for p in priorities]


class Fair(Plugin):
    strict = False


class PicksFlow(Fair):
    def pick_flow(self, flows: Mapping[str, tuple[int, float]]) -> str | None:
        return max(flows)


class Order(Plugin):
    ordering = "fcfs"


class Deadline(Order):
    def deadline(self, request: InferenceRequest, enqueued: float, ttl: float | None) -> float:
        return -enqueued  # the newest first


def test_flow_control_uses_the_policies_declared_capabilities() -> None:
    """PriorityCeilings, FlowPicker and DeadlineOrdering take effect for a policy that implements them; a plain
    usage limit, fairness or ordering policy keeps the threshold, oldest-head and FIFO defaults."""
    band = PriorityBandSpec(0, fairness_policy_ref="fair", ordering_policy_ref="order")
    spec = FlowControlSpec(priority_bands=[band], usage_limit_policy_ref="limit")

    def controller(limit: Plugin, fair: Plugin, order: Plugin) -> FlowController:
        return FlowController(spec, UtilizationDetector(), plugins={"limit": limit, "fair": fair, "order": order})

    plain = controller(Limit("l"), Fair("f"), Order("o"))
    assert plain.threshold == 0.8 and plain._ceilings is None
    assert plain._band(0).pick_flow is None and plain._band(0).deadline is None
    declared = controller(Ceilings("l"), PicksFlow("f"), Deadline("o"))
    assert declared._ceilings is not None and declared._ceilings(0.9, [1, 0]) == [1.0, 0.5]
    b = declared._band(0)
    assert b.pick_flow is not None and b.pick_flow({"a": (1, 0.0), "b": (1, 1.0)}) == "b"
    assert b.deadline is not None and b.deadline(chat_req("r"), 5.0, None) == -5.0
