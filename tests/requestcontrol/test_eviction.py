"""Flow-control eviction (flowControl.enableEviction): held dispatch revokes in-flight sheddable requests."""

from __future__ import annotations

import asyncio
import time

from epp.config.loader import parse_config
from epp.datalayer.datastore import Datastore
from epp.framework import ApiKind, Endpoint, InferenceRequest, Metrics
from epp.plugins.flowcontrol.priority_then_time_eviction_order_policy import PriorityThenTimeEvictionOrderPolicy
from epp.plugins.flowcontrol.sheddable_eviction_filter import SheddableEvictionFilter
from epp.requestcontrol.director import SchedulingDirector
from epp.requestcontrol.eviction import Evictor
from epp.wiring import build_runtime


def evictor(grace: float = 0.0) -> Evictor:
    return Evictor(SheddableEvictionFilter().eligible, PriorityThenTimeEvictionOrderPolicy().victim_key, grace)


def test_victims_are_sheddable_lowest_priority_newest_first() -> None:
    ev = evictor()
    events = {rid: ev.track(rid, prio) for rid, prio in [("c0", 0), ("b1", -1), ("b2", -1), ("a", -5), ("hi", 3)]}
    # 5 in flight at saturation 1.2 over a ceiling of 1.0: credit 0.24, target 0.2 → one revocation
    assert ev.reclaim(1.2, 1.0, demand_priority=0) == ["a"]
    assert events["a"].is_set() and not events["b2"].is_set()
    assert ev.reclaim(1.2, 1.0, 0) == []  # gated until "a" has ended
    ev.untrack(events["a"])
    assert ev.reclaim(2.0, 1.0, 0) == ["b2", "b1"]  # target 1.0 / credit 0.5: two, the newest -1 first
    for rid in ("b1", "b2"):
        ev.untrack(events[rid])
    assert ev.reclaim(2.0, 1.0, 0) == []  # only c0 (not sheddable) and hi remain
    assert not events["c0"].is_set() and not events["hi"].is_set()


def test_the_demand_priority_bounds_victims_and_grace_paces_decisions() -> None:
    ev = evictor(grace=0.05)
    ev.track("x", -3)
    assert ev.reclaim(1.5, 1.0, demand_priority=-3) == []  # equal priority is not below the demand
    y = ev.track("y", -4)
    assert ev.reclaim(1.5, 1.0, demand_priority=-3) == ["y"]
    ev.untrack(y)
    assert not ev.gate_open()  # cooling: freed capacity not yet visible
    time.sleep(0.06)
    assert ev.gate_open()


def test_requests_sharing_a_request_id_are_tracked_apart() -> None:
    """x-request-id is the client's: a second request under the same id must not hide the first from eviction, and
    each one's end confirms its own revocation."""
    ev = evictor()
    first, second = ev.track("dup", -1), ev.track("dup", -1)
    ev.untrack(second)  # the second one ends: the first is still in flight
    assert ev.reclaim(1.5, 1.0, demand_priority=0) == ["dup"]
    assert first.is_set() and not second.is_set()
    assert not ev.gate_open()
    ev.untrack(second)  # a late end of the other request confirms nothing
    assert not ev.gate_open()
    ev.untrack(first)
    assert ev.gate_open()


def req(rid: str, objective: str) -> InferenceRequest:
    body = {"model": "m", "prompt": "x"}
    return InferenceRequest(
        rid,
        "/v1/completions",
        ApiKind.COMPLETIONS,
        "m",
        "m",
        body,
        headers={"x-gateway-inference-objective": objective},
        body_size=30,
    )


ONE_SLOT = """
featureGates: [flowControl]
plugins:
- type: queue-scorer
- type: concurrency-detector
  parameters: {maxConcurrency: 1}
flowControl:
  enableEviction: %s
  saturationDetector: {pluginRef: concurrency-detector}
objectives:
- {name: batch, priority: -1}
- {name: chat, priority: 5}
endpoints:
- {address: 10.0.0.1, port: 8000}
"""


def one_slot_director(eviction: bool) -> SchedulingDirector:
    """Flow control over one pod that takes one request at a time (concurrency-detector)."""
    runtime = build_runtime(parse_config(ONE_SLOT % ("true" if eviction else "false")))
    ds: Datastore = runtime.datastore
    ep = Endpoint("pod", "10.0.0.1", 8000)
    ep.metrics = Metrics(update_time=time.monotonic())
    ds.replace_all([ep])
    d = runtime.director
    assert isinstance(d, SchedulingDirector) and d.flow_controller is not None
    return d


async def test_a_waiting_request_evicts_an_in_flight_sheddable_one() -> None:
    d = one_slot_director(eviction=True)
    batch = req("batch-1", "batch")
    first = await d.handle_request(batch)  # dispatched at once, now in flight and counted by the detector
    assert first.evicted is not None and not first.evicted.is_set()
    pending = asyncio.create_task(d.handle_request(req("chat-1", "chat")))
    for _ in range(200):
        if first.evicted.is_set():
            break
        await asyncio.sleep(0.005)
    assert first.evicted.is_set() and not pending.done()  # revoked; the chat request still waits for capacity
    d.handle_response_complete(batch, first, None)  # the server ends the evicted stream: capacity comes back
    second = await asyncio.wait_for(pending, 2)
    assert second.endpoints[0].hostport == "10.0.0.1:8000"


async def test_the_dispatcher_counts_picks_whose_records_are_held_back() -> None:
    """Behind the servicer a pick's in-flight booking waits for its answer to be written. The flow-control
    dispatcher, which checks saturation between picks, runs the held-back bookings first (`settle`): with one slot,
    freeing it lets exactly one of two queued requests through."""
    d = one_slot_director(eviction=False)
    assert d.flow_controller is not None
    r0 = req("r0", "chat")
    first = await d.handle_request(r0)  # booked at once: the one slot is taken
    waiting = [asyncio.create_task(d.handle_request(req(f"r{i}", "chat"), defer_records=True)) for i in (1, 2)]
    await asyncio.sleep(0.05)
    assert d.flow_controller.queued() == 2
    d.handle_response_complete(r0, first, None)  # the slot frees: one of the two may go
    done, _ = await asyncio.wait(waiting, timeout=0.3)
    assert len(done) == 1 and d.flow_controller.queued() == 1
    for t in waiting:
        t.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
