"""The SchedulingDirector: priority, admission (legacy and flow control), producers, scheduling, hooks."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from epp.config import parse_config
from epp.datalayer.datastore import Datastore
from epp.datalayer.objectives import ObjectiveStore
from epp.framework import (
    UPSTREAM_HEADERS,
    Endpoint,
    InferenceRequest,
    Metrics,
    Plugin,
    ServiceUnavailable,
    TooManyRequests,
)
from epp.plugins.producers.inflight_load_producer import InFlightLoadProducer
from epp.plugins.scorers.active_request_scorer import ActiveRequestScorer
from epp.requestcontrol.director import SchedulingDirector
from epp.requestcontrol.flowcontrol import FlowController
from epp.requestcontrol.flowcontrol_spec import FlowControlSpec, PriorityBandSpec
from epp.wiring import plugin_context
from epp.wiring.builder import build_pipeline
from tests.requestcontrol.support import chat, director, fresh, pool, with_gie_default


async def test_gie_default_prefers_idle_pod_then_prefix_affinity() -> None:
    ds = pool(3)
    eps = ds.endpoints()
    eps[0].metrics = Metrics(waiting_queue_size=4, update_time=time.monotonic())
    eps[1].metrics = Metrics(waiting_queue_size=0, kv_cache_usage_percent=0.1, update_time=time.monotonic())
    eps[2].metrics = Metrics(waiting_queue_size=4, update_time=time.monotonic())
    d = director(ds)
    long_prompt = "You are a helpful assistant. " * 200
    first = await d.handle_request(chat(long_prompt + "Q1"))
    assert first.destination == "10.0.0.2:8000"
    await asyncio.sleep(0)  # the prefix index records the pick right after the decision
    # pod-1 gets a bit busier, but it holds the prompt's prefix: prefix (w=3) outweighs queue (w=2)
    eps[1].metrics = Metrics(waiting_queue_size=2, kv_cache_usage_percent=0.1, update_time=time.monotonic())
    eps[0].metrics = Metrics(waiting_queue_size=0, update_time=time.monotonic())
    second = await d.handle_request(chat(long_prompt + "Q2"))
    assert second.destination == "10.0.0.2:8000"
    other = await d.handle_request(chat("completely different " * 100))
    assert other.destination == "10.0.0.1:8000"


async def test_sheddable_request_rejected_when_saturated() -> None:
    ds = pool(2, waiting_queue_size=10)  # queue 10 ≥ threshold 5 → saturation 2.0
    d = director(ds, "objectives:\n- {name: batch, priority: -1}\n- {name: chat, priority: 10}\n")
    batch = chat("hi", headers={"x-gateway-inference-objective": "batch"})
    with pytest.raises(TooManyRequests) as ei:
        await d.handle_request(batch)
    assert ei.value.status == 429 and b"system saturated, sheddable request dropped" in ei.value.body()
    assert batch.priority == -1 and batch.objective == "batch"
    critical = chat("hi", headers={"x-gateway-inference-objective": "chat"})
    assert (await d.handle_request(critical)).endpoints and critical.priority == 10
    fresh(ds, waiting_queue_size=0)
    assert (await d.handle_request(chat("hi", headers={"x-gateway-inference-objective": "batch"}))).endpoints


async def test_stale_metrics_count_as_saturated() -> None:
    ds = pool(1)
    ds.endpoints()[0].metrics = Metrics(update_time=time.monotonic() - 5)
    d = director(ds, "objectives: [{name: batch, priority: -5}]")
    with pytest.raises(TooManyRequests):
        await d.handle_request(chat("x", headers={"x-gateway-inference-objective": "batch"}))


async def test_candidates_subset_and_scheduling_failure() -> None:
    ds = pool(3)
    d = director(ds)
    r = chat("hi")
    r.subset = ["10.0.0.3:8000"]
    assert (await d.handle_request(r)).destination == "10.0.0.3:8000"
    r = chat("hi")
    r.subset = []
    with pytest.raises(ServiceUnavailable, match="candidate"):
        await d.handle_request(r)
    with pytest.raises(ServiceUnavailable):
        await director(Datastore()).handle_request(chat("hi"))
    strict = director(
        ds,
        "plugins:\n- type: label-selector-filter\n  parameters: {matchLabels: {accelerator: tpu}}\n"
        "- type: queue-scorer\n",
    )
    with pytest.raises(TooManyRequests, match="failed to find target endpoint"):
        await strict.handle_request(chat("hi"))


async def test_fallback_endpoints_in_the_decision() -> None:
    ds = pool(4)
    for i, e in enumerate(ds.endpoints()):
        e.metrics = Metrics(waiting_queue_size=i, update_time=time.monotonic())
    d = director(ds, "plugins:\n- type: queue-scorer\n- type: max-score-picker\n  parameters: {maxNumOfEndpoints: 3}\n")
    dec = await d.handle_request(chat("hi"))
    assert dec.destination == "10.0.0.1:8000,10.0.0.2:8000,10.0.0.3:8000"


class SlowProducer(Plugin):
    def __init__(self, name: str, delay: float, fail: bool = False) -> None:
        super().__init__(name)
        self.delay = delay
        self.fail = fail
        self.finished = False

    async def prepare(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        await asyncio.sleep(self.delay)
        if self.fail:
            raise RuntimeError("tokenizer exploded")
        self.finished = True


async def test_data_producers_budget_and_failures_do_not_fail_the_request() -> None:
    ds = pool(2)
    d = director(ds, "plugins: [{type: queue-scorer}]", producer_budget=0.05)
    slow, broken = SlowProducer("slow", 5.0), SlowProducer("broken", 0, fail=True)
    d._producers = [broken, slow]
    t0 = time.monotonic()
    assert (await d.handle_request(chat("hi"))).endpoints
    # Cut at the 50 ms budget, not after the slow producer's 5 s (a bound loose enough for a loaded machine).
    assert time.monotonic() - t0 < 4.0 and not slow.finished


class StepProducer(Plugin):
    """Records the order producers run in; `suspend` awaits that many loop turns first, `fail` raises after them."""

    def __init__(self, name: str, log: list[str], suspend: int = 0, fail: bool = False) -> None:
        super().__init__(name)
        self.log, self.suspend, self.fail = log, suspend, fail

    async def prepare(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        for _ in range(self.suspend):
            await asyncio.sleep(0)
        if self.fail:
            raise ValueError("bad input")
        self.log.append(self.name)


async def test_producers_that_finish_at_once_or_suspend_all_run_in_order() -> None:
    """Producers that never suspend run as plain calls; once one suspends the rest run under the budget; a failure
    before or after a suspension skips only that producer."""
    ds = pool(2)
    d = director(ds, "plugins: [{type: queue-scorer}]", producer_budget=5.0)
    ran: list[str] = []
    d._producers = [
        StepProducer("a", ran),
        StepProducer("b", ran, fail=True),
        StepProducer("c", ran, suspend=2),
        StepProducer("d", ran, suspend=1, fail=True),
        StepProducer("e", ran),
        StepProducer("f", ran, suspend=1),
    ]
    assert (await d.handle_request(chat("hi"))).endpoints
    assert ran == ["a", "c", "e", "f"]


async def test_budget_counts_from_the_start_when_the_first_suspension_comes_late() -> None:
    """The producers that ran without suspending used the budget up: the next one's first wait is cut at once."""
    ds = pool(2)
    d = director(ds, "plugins: [{type: queue-scorer}]", producer_budget=0.05)

    class Busy(Plugin):
        async def prepare(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
            time.sleep(0.1)  # CPU-bound past the budget, no suspension

    slow = SlowProducer("slow", 5.0)
    d._producers = [Busy("busy"), slow]
    t0 = time.monotonic()
    assert (await d.handle_request(chat("hi"))).endpoints
    # Cut at the 50 ms budget, not after the slow producer's 5 s (a bound loose enough for a loaded machine).
    assert time.monotonic() - t0 < 4.0 and not slow.finished


async def test_a_cancelled_request_cancels_the_suspended_producer() -> None:
    ds = pool(2)
    d = director(ds, "plugins: [{type: queue-scorer}]", producer_budget=10.0)
    cancelled: list[bool] = []

    class Waits(Plugin):
        async def prepare(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
            try:
                await asyncio.sleep(5)
            except asyncio.CancelledError:
                cancelled.append(True)
                raise

    d._producers = [Waits("waits")]
    task = asyncio.ensure_future(d.handle_request(chat("hi")))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancelled == [True]


async def test_response_hooks_drive_active_request_bookkeeping() -> None:
    ds = pool(2)
    d = director(ds, "plugins: [{type: active-request-scorer}]")
    assert isinstance(d.pipeline.plugins["active-request-scorer"], ActiveRequestScorer)
    producer = d.pipeline.plugins["inflight-load-producer"]  # added for the scorer
    assert isinstance(producer, InFlightLoadProducer)
    r1, r2 = chat("a", rid="1"), chat("b", rid="2")
    d1 = await d.handle_request(r1)
    d2 = await d.handle_request(r2)
    assert d1.endpoints[0] is not d2.endpoints[0]  # the second goes to the idle pod
    assert sorted(load.requests for load in producer.loads.values()) == [1, 1]
    d.handle_response_headers(r1, d1, 200, d1.destination, {})
    d.handle_response_chunk(r1, d1, b"data: {}", True, False)
    first, second = producer.loads[d1.endpoints[0].name], producer.loads[d2.endpoints[0].name]
    assert (first.requests, first.tokens) == (1, 0)  # first chunk: prefill done, tokens released
    assert second.requests == 1 and second.tokens > 0
    d.handle_response_complete(r1, d1, None)
    d.handle_response_complete(r2, d2, None)
    assert [(load.requests, load.tokens) for load in producer.loads.values()] == [(0, 0), (0, 0)]


def fc_director(ds: Datastore, spec: FlowControlSpec, objectives: str = "{}") -> SchedulingDirector:
    cfg = parse_config(with_gie_default(objectives))
    pipeline = build_pipeline(cfg, plugin_context(ds))
    fc = FlowController(spec, pipeline.saturation_detector, plugins=pipeline.plugins, poll_interval=0.002)
    return SchedulingDirector(ds, pipeline, ObjectiveStore(cfg.objectives), flow_controller=fc)


OBJ = "objectives:\n- {name: high, priority: 10}\n- {name: low, priority: -1}\n"


async def dispatch_order(d: SchedulingDirector, ds: Datastore) -> list[str]:
    """Queue six requests on a saturated pool, then free it; returns the order they were let through."""
    order: list[str] = []

    async def send(name: str, objective: str, tenant: str) -> None:
        h = {"x-gateway-inference-objective": objective, "x-gateway-inference-fairness-id": tenant}
        await d.handle_request(chat("hi", rid=name, headers=h))
        order.append(name)

    tasks = []
    for name, obj, tenant in [
        ("a1", "low", "A"),
        ("a2", "low", "A"),
        ("a3", "low", "A"),
        ("b1", "low", "B"),
        ("b2", "low", "B"),
        ("h1", "high", "C"),
    ]:
        tasks.append(asyncio.create_task(send(name, obj, tenant)))
        await asyncio.sleep(0.001)
    await asyncio.sleep(0.02)
    assert order == [] and d.flow_controller is not None and d.flow_controller.queued() == 6
    fresh(ds, waiting_queue_size=0)
    await asyncio.wait_for(asyncio.gather(*tasks), 2)
    return order


async def test_flow_control_global_strict_fairness_and_usage_limit() -> None:
    ds = pool(1, waiting_queue_size=50)
    policies = "plugins:\n- type: queue-scorer\n- type: global-strict-fairness-policy\n"
    strict = PriorityBandSpec(0, fairness_policy_ref="global-strict-fairness-policy")
    spec = FlowControlSpec(default_priority_band=strict)
    d = fc_director(ds, spec, policies + OBJ)
    # strict priority, then one FCFS order across tenants
    assert await dispatch_order(d, ds) == ["h1", "a1", "a2", "a3", "b1", "b2"]
    # static-usage-limit-policy: saturation 2.0 is under a threshold of 3 → no queueing at all
    cfg = parse_config(
        "plugins:\n- type: queue-scorer\n- type: static-usage-limit-policy\n  parameters: {threshold: 3}\n"
    )
    fresh(ds, waiting_queue_size=10)
    pipeline = build_pipeline(cfg, plugin_context(ds))
    limited = FlowControlSpec(usage_limit_policy_ref="static-usage-limit-policy")
    fc = FlowController(limited, pipeline.saturation_detector, plugins=pipeline.plugins)
    d2 = SchedulingDirector(ds, pipeline, flow_controller=fc)
    assert (await asyncio.wait_for(d2.handle_request(chat("x")), 1)).endpoints and fc.queued() == 0


async def test_flow_control_dispatches_by_priority_then_round_robin() -> None:
    ds = pool(1, waiting_queue_size=50)  # saturated: everything queues
    d = fc_director(ds, FlowControlSpec(), OBJ)
    order = await dispatch_order(d, ds)
    assert order[0] == "h1"  # strict priority first
    assert order[1:] == ["a1", "b1", "a2", "b2", "a3"]  # round-robin across fairness ids within the band


async def test_flow_control_ttl_capacity_and_cancel() -> None:
    ds = pool(1, waiting_queue_size=50)
    spec = FlowControlSpec(max_requests=2, default_request_ttl=0.05)
    d = fc_director(ds, spec)
    fc = d.flow_controller
    assert fc is not None
    waiting = [asyncio.create_task(d.handle_request(chat("x", rid=str(i)))) for i in range(2)]
    await asyncio.sleep(0.005)
    with pytest.raises(TooManyRequests, match="capacity"):
        await d.handle_request(chat("x", rid="over"))
    for t in waiting:
        with pytest.raises(ServiceUnavailable, match="timed out in queue"):
            await t
    assert fc.queued() == 0
    # a cancelled client frees its slot
    d2 = fc_director(ds, FlowControlSpec(max_requests=1))
    t = asyncio.create_task(d2.handle_request(chat("x")))
    await asyncio.sleep(0.005)
    assert d2.flow_controller is not None and d2.flow_controller.queued() == 1
    t.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t
    assert d2.flow_controller.queued() == 0


async def test_flow_control_band_limits_and_fast_path() -> None:
    ds = pool(1)
    spec = FlowControlSpec(priority_bands=[PriorityBandSpec(priority=0, max_requests=1)])
    d = fc_director(ds, spec)
    assert (await d.handle_request(chat("x"))).endpoints  # unsaturated and nothing queued: no queueing
    fresh(ds, waiting_queue_size=50)
    t = asyncio.create_task(d.handle_request(chat("x", rid="q")))
    await asyncio.sleep(0.005)
    with pytest.raises(TooManyRequests):
        await d.handle_request(chat("x", rid="q2"))
    fresh(ds, waiting_queue_size=0)
    assert (await asyncio.wait_for(t, 1)).endpoints


def attempts(status: str) -> float:
    from epp.scheduling.metrics import SCHEDULER_ATTEMPTS

    return sum(
        smp.value
        for metric in SCHEDULER_ATTEMPTS.collect()
        for smp in metric.samples
        if smp.name.endswith("_total") and smp.labels["status"] == status
    )


async def test_scheduler_metrics_and_debug_decision_log(caplog: pytest.LogCaptureFixture) -> None:
    ds = pool(2)
    d = director(ds)
    ok0, fail0 = attempts("success"), attempts("failure")
    with caplog.at_level("DEBUG", logger="epp"):
        dec = await d.handle_request(chat("hello", rid="logged"))
    assert attempts("success") == ok0 + 1
    assert any("logged" in r.getMessage() and dec.destination in r.getMessage() for r in caplog.records)
    strict = director(ds, "plugins:\n- type: label-selector-filter\n  parameters: {matchLabels: {x: y}}\n")
    with pytest.raises(TooManyRequests):
        await strict.handle_request(chat("x"))
    assert attempts("failure") == fail0 + 1


async def test_unhealthy_endpoints_are_not_candidates() -> None:
    """Dead pods (failed scrapes) and pods answering 5xx in a row are skipped; all unhealthy fails open."""
    ds = pool(3)
    d = director(ds, "plugins: [{type: active-request-scorer}]")
    ep0, ep1, ep2 = ds.endpoints()
    ep0.health.scrape_failures = 5
    picks = set()
    for i in range(12):
        r = chat("x", rid=str(i))
        dec = await d.handle_request(r)
        picks.add(dec.endpoints[0].name)
        status = 503 if dec.endpoints[0] is ep1 else 200  # ep1 answers 503 (also what Envoy says when it is down)
        d.handle_response_headers(r, dec, status, dec.destination, {})
    assert "pod-0" not in picks
    assert ep1.health.ejected_until > time.monotonic()  # five 503s in a row: ejected
    for i in range(5):
        assert (await d.handle_request(chat("x", rid=f"e{i}"))).endpoints[0] is ep2
    ep2.health.scrape_failures = ep1.health.scrape_failures = 5
    assert len({(await d.handle_request(chat("x", rid=f"o{i}"))).endpoints[0].name for i in range(9)}) > 1


async def test_the_response_status_is_in_the_request_data_for_the_completion_hooks() -> None:
    from epp.framework import RESPONSE_STATUS

    ds = pool(2)
    d = director(ds, "plugins: [{type: active-request-scorer}]")
    r = chat("a", rid="s1")
    dec = await d.handle_request(r)
    assert r.data.get(RESPONSE_STATUS) is None
    d.handle_response_headers(r, dec, 429, dec.destination, {})
    assert r.data.get(RESPONSE_STATUS) == 429


class HeaderHook(Plugin):
    """A PreRequest hook whose output the answer carries (an upstream header): never deferred."""

    def pre_request(self, request: InferenceRequest, result: Any) -> None:
        request.data.put(UPSTREAM_HEADERS, {"x-hook": result.targets[0].name})


async def test_records_only_hooks_wait_for_the_answer_but_never_for_the_next_pick() -> None:
    """defer_records: the in-flight booking (a records-only hook) is made after the answer, yet the next pick,
    a response hook or run_deferred always finds the earlier bookings made first."""
    ds = pool(2)
    d = director(ds, "plugins: [{type: active-request-scorer}]")
    producer = d.pipeline.plugins["inflight-load-producer"]
    assert isinstance(producer, InFlightLoadProducer) and producer in d._records
    d._pre_request.append(HeaderHook("header-hook"))

    def booked() -> list[int]:
        return [producer.loads[ep.name].requests if ep.name in producer.loads else 0 for ep in ds.endpoints()]

    r1, r2 = chat("a", rid="1"), chat("b", rid="2")
    d1 = await d.handle_request(r1, defer_records=True)
    assert booked() == [0, 0]  # held back: the answer goes first
    assert d1.headers == {"x-hook": d1.endpoints[0].name}  # a hook the answer carries ran at once
    d2 = await d.handle_request(r2, defer_records=True)
    assert d1.endpoints[0] is not d2.endpoints[0]  # r1's booking was made before r2 was scheduled
    assert sum(booked()) == 1
    d.run_deferred()
    assert booked() == [1, 1]
    d.run_deferred()  # nothing left: a no-op
    assert booked() == [1, 1]

    # A completion that arrives before the deferred booking ran still finds the booking to release.
    r3 = chat("c", rid="3")
    d3 = await d.handle_request(r3, defer_records=True)
    d.handle_response_complete(r3, d3, None)
    d.run_deferred()
    assert booked() == [1, 1]
    # Without defer_records every hook runs inside handle_request, as before.
    d4 = await d.handle_request(chat("d", rid="4"))
    assert sum(booked()) == 3 and d4.endpoints


async def test_a_pick_made_while_a_producer_waits_is_booked_before_the_waiting_request_goes_on() -> None:
    """Request 1 waits in a producer while request 2 is picked (its records deferred): request 1's later producers
    and its scheduling see request 2's booking."""
    ds = pool(2)
    d = director(ds, "plugins: [{type: active-request-scorer}]", producer_budget=5.0)
    producer = d.pipeline.plugins["inflight-load-producer"]
    assert isinstance(producer, InFlightLoadProducer)
    gate = asyncio.Event()
    seen: dict[str, int] = {}

    def booked() -> int:
        return sum(load.requests for load in producer.loads.values())

    class WaitsForRequest1(Plugin):
        async def prepare(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
            if request.request_id == "1":
                await gate.wait()

    class Looks(Plugin):
        async def prepare(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
            if request.request_id == "1":
                seen["producer"] = booked()

    schedule = d.scheduler.schedule

    def looking(request: InferenceRequest, candidates: Any) -> Any:
        if request.request_id == "1":
            seen["scheduling"] = booked()
        return schedule(request, candidates)

    d.scheduler.schedule = looking  # type: ignore[method-assign]
    d._producers = [WaitsForRequest1("waits"), Looks("looks"), *d._producers]
    first = asyncio.ensure_future(d.handle_request(chat("a", rid="1"), defer_records=True))
    await asyncio.sleep(0)
    await d.handle_request(chat("b", rid="2"), defer_records=True)  # picked while request 1 waits
    assert booked() == 0
    gate.set()
    await first
    assert seen == {"producer": 1, "scheduling": 1}


class Hook(Plugin):
    """A PreRequest hook that logs when it ran (the answer may carry what it writes: never deferred)."""

    def __init__(self, name: str, ran: list[str]) -> None:
        super().__init__(name)
        self.ran = ran

    def pre_request(self, request: InferenceRequest, result: Any) -> None:
        self.ran.append(self.name)


class Booking(Hook):
    records_only = True


class Completion(Plugin):
    def response_complete(self, request: InferenceRequest, endpoint: Endpoint | None, usage: Any) -> None:
        pass


class Reporter(Completion):
    writes_response_metadata = True


class Windowed(StepProducer):
    produce_timeout = 3.0


async def test_the_director_reads_the_declared_capabilities() -> None:
    """records_only defers a hook past the answer, writes_response_metadata moves completion before the last answer,
    produce_timeout extends the producer budget; a plugin that does not declare one gets the default behaviour."""
    ds = pool(2)
    base = director(ds, "plugins: [{type: queue-scorer}]", producer_budget=0.5).pipeline
    ran: list[str] = []
    hook, booking = Hook("hook", ran), Booking("booking", ran)
    plain = SchedulingDirector(
        ds, replace(base, pre_request=[hook], response_complete=[Completion("c")]), producer_budget=0.5
    )
    assert plain.producer_budget == 0.5 and not plain.completes_before_last_answer
    await plain.handle_request(chat("a"), defer_records=True)
    assert ran == ["hook"]

    ran.clear()
    declared = SchedulingDirector(
        ds,
        replace(
            base,
            pre_request=[hook, booking],
            response_complete=[Completion("c"), Reporter("r")],
            producers=[StepProducer("p", []), Windowed("w", [])],
        ),
        producer_budget=0.5,
    )
    assert declared.producer_budget == 3.0 and declared.completes_before_last_answer
    await declared.handle_request(chat("b"), defer_records=True)
    assert ran == ["hook"]  # the booking waits for the answer
    declared.run_deferred()
    assert ran == ["hook", "booking"]


def _booked(d: SchedulingDirector) -> int:
    producer = d.pipeline.plugins["inflight-load-producer"]
    assert isinstance(producer, InFlightLoadProducer) and producer in d._records
    return sum(load.requests for load in producer.loads.values())


async def test_the_next_requests_producers_see_the_bookings_held_back_before_it() -> None:
    """Request 1's answer is still being written (its booking held back) when request 2 arrives: request 2's data
    producers, which run before its scheduling, already see request 1's booking."""
    ds = pool(2)
    d = director(ds, "plugins: [{type: active-request-scorer}]")
    seen: list[tuple[str, int]] = []

    class Looks(Plugin):
        async def prepare(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
            seen.append((request.request_id, _booked(d)))

    d._producers = [Looks("looks"), *d._producers]
    await d.handle_request(chat("a", rid="1"), defer_records=True)
    await d.handle_request(chat("b", rid="2"), defer_records=True)
    assert seen == [("1", 0), ("2", 1)]


async def test_scheduling_after_the_last_producer_suspended_sees_the_picks_made_meanwhile() -> None:
    """The last producer of request 1 waits while request 2 is picked (its booking held back): no producer runs
    after the wait, yet request 1's scheduling sees request 2's booking and picks the other endpoint."""
    ds = pool(2)
    d = director(ds, "plugins: [{type: active-request-scorer}]", producer_budget=5.0)
    gate = asyncio.Event()
    seen: dict[str, int] = {}

    class WaitsForRequest1(Plugin):
        async def prepare(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
            if request.request_id == "1":
                await gate.wait()

    schedule = d.scheduler.schedule

    def looking(request: InferenceRequest, candidates: Any) -> Any:
        seen[request.request_id] = _booked(d)
        return schedule(request, candidates)

    d.scheduler.schedule = looking  # type: ignore[method-assign]
    d._producers = [*d._producers, WaitsForRequest1("waits")]
    first = asyncio.ensure_future(d.handle_request(chat("a", rid="1"), defer_records=True))
    await asyncio.sleep(0)
    d2 = await d.handle_request(chat("b", rid="2"), defer_records=True)
    assert _booked(d) == 0
    gate.set()
    d1 = await first
    assert seen == {"2": 0, "1": 1}
    assert d1.endpoints[0] is not d2.endpoints[0]


async def test_response_hooks_see_the_bookings_held_back_before_them() -> None:
    """Request 2's answer is still being written when request 1's response headers and chunks arrive: the
    ResponseReceived and ResponseStreaming hooks already see request 2's booking."""
    ds = pool(2)
    d = director(ds, "plugins: [{type: active-request-scorer}]")
    seen: list[tuple[str, int]] = []

    class Hooks(Plugin):
        def response_received(self, request: InferenceRequest, response: Any, endpoint: Endpoint | None) -> None:
            seen.append(("headers", _booked(d)))

        def response_chunk(self, request: InferenceRequest, chunk: Any, endpoint: Endpoint | None) -> None:
            seen.append(("chunk", _booked(d)))

    hooks = Hooks("hooks")
    d._received.append(hooks)
    d._streaming.insert(0, hooks)
    r1 = chat("a", rid="1")
    d1 = await d.handle_request(r1, defer_records=True)
    d.run_deferred()  # request 1's answer is written
    await d.handle_request(chat("b", rid="2"), defer_records=True)
    assert _booked(d) == 1
    d.handle_response_headers(r1, d1, 200, None, {})
    assert seen == [("headers", 2)]
    await d.handle_request(chat("c", rid="3"), defer_records=True)
    d.handle_response_chunk(r1, d1, b"data: x\n\n", True, False)
    assert seen == [("headers", 2), ("chunk", 3)]


async def test_scheduler_attempts_counted_per_endpoint_through_the_kept_children() -> None:
    from prometheus_client import REGISTRY

    ds = pool(2)
    d = director(ds)
    eps = ds.endpoints()

    def count(ep: Endpoint) -> float:
        labels = {"status": "success", "target_model_name": "m", "pod_name": ep.pod_name,
                  "namespace": ep.namespace, "port": str(ep.port)}  # fmt: skip
        return REGISTRY.get_sample_value("inference_extension_scheduler_attempts_total", labels) or 0.0

    before = [count(ep) for ep in eps]
    picks = [(await d.handle_request(chat(f"question {i} " * 40, rid=f"r{i}"))).destination for i in range(6)]
    after = [count(ep) for ep in eps]
    assert [a - b for a, b in zip(after, before, strict=True)] == [picks.count(ep.hostport) for ep in eps]
    assert sum(after) - sum(before) == 6
