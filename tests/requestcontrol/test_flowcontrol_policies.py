"""llm-d-router flow-control policies through the real FlowController and Director: EDF and SLO-deadline
ordering, program-aware (LAS) fairness, priority-holdback and soft-reflective ceilings, agent identity."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from epp.config.loader import parse_config
from epp.datalayer.datastore import Datastore
from epp.datalayer.objectives import ObjectiveStore
from epp.framework import Endpoint, InferenceRequest, Metrics, PluginConfigError, SchedulingResult, Usage
from epp.plugins.flowcontrol.edf_ordering_policy import EDFOrderingPolicy
from epp.plugins.flowcontrol.priority_holdback_policy import PriorityHoldbackPolicy
from epp.plugins.flowcontrol.program_aware_fairness import ProgramAwareFairness
from epp.plugins.flowcontrol.slo_deadline_ordering_policy import SLODeadlineOrderingPolicy
from epp.plugins.flowcontrol.soft_reflective_ceiling_policy import SoftReflectiveCeilingPolicy
from epp.plugins.requestcontrol.probabilistic_admitter import ProbabilisticAdmitter
from epp.requestcontrol.director import SchedulingDirector
from epp.requestcontrol.flowcontrol import FlowController
from epp.requestcontrol.flowcontrol_spec import FlowControlSpec, PriorityBandSpec
from epp.wiring import plugin_context
from epp.wiring.builder import build_pipeline
from tests.helpers import build


def pool(waiting: int) -> Datastore:
    ds = Datastore()
    e = Endpoint("pod-0", "10.0.0.1", 8000)
    e.metrics = Metrics(waiting_queue_size=waiting, update_time=time.monotonic())
    ds.replace_all([e])
    return ds


def fresh(ds: Datastore, waiting: int) -> None:
    for e in ds.endpoints():
        e.metrics = Metrics(waiting_queue_size=waiting, update_time=time.monotonic())


def req(rid: str, headers: dict[str, str] | None = None) -> InferenceRequest:
    msgs = [{"role": "user", "content": "hi"}]
    body = {"model": "m", "messages": msgs}
    return InferenceRequest(
        rid, "/v1/chat/completions", "chat", "m", "m", body, headers=headers or {}, messages=msgs, body_size=40
    )


def fc_director(ds: Datastore, yaml_text: str, spec: FlowControlSpec) -> SchedulingDirector:
    cfg = parse_config(yaml_text)
    pipeline = build_pipeline(cfg, plugin_context(ds))
    fc = FlowController(spec, pipeline.saturation_detector, plugins=pipeline.plugins, poll_interval=0.002)
    return SchedulingDirector(ds, pipeline, ObjectiveStore(cfg.objectives), flow_controller=fc)


async def order_of(d: SchedulingDirector, ds: Datastore, sends: list[tuple[str, dict[str, str]]]) -> list[str]:
    """Queue the requests on a saturated pool (in list order), then free it: the order they leave."""
    out: list[str] = []

    async def send(rid: str, headers: dict[str, str]) -> None:
        await d.handle_request(req(rid, headers))
        out.append(rid)

    tasks = []
    for rid, h in sends:
        tasks.append(asyncio.create_task(send(rid, h)))
        await asyncio.sleep(0.002)
    await asyncio.sleep(0.02)
    assert out == []
    fresh(ds, 0)
    await asyncio.wait_for(asyncio.gather(*tasks), 2)
    return out


QUEUE = "plugins:\n- type: queue-scorer\n"


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


async def test_fcfs_keeps_arrival_order_with_the_same_requests() -> None:
    ds = pool(50)
    spec = FlowControlSpec(default_request_ttl=10.0, default_priority_band=PriorityBandSpec(0, ordering_policy_ref="f"))
    d = fc_director(ds, QUEUE + "- {name: f, type: fcfs-ordering-policy}\n", spec)
    t = "x-envoy-expected-rq-timeout-ms"
    assert await order_of(d, ds, [("a", {}), ("b", {t: "500"})]) == ["a", "b"]


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


def test_edf_and_slo_deadlines() -> None:
    r = req("r", {"x-envoy-expected-rq-timeout-ms": "300"})
    assert EDFOrderingPolicy().deadline(r, r.arrival, None) == pytest.approx(r.arrival + 0.3)
    assert EDFOrderingPolicy().deadline(req("r"), 5.0, None) == float("inf")
    assert EDFOrderingPolicy().deadline(req("r"), 5.0, 2.0) == 7.0
    s = req("s", {"x-llm-d-slo-ttft-ms": "-5"})
    assert SLODeadlineOrderingPolicy().deadline(s, 0.0, None) == float("inf")


async def test_program_aware_fairness_serves_the_least_served_program_first() -> None:
    ds = pool(50)
    spec = FlowControlSpec(default_priority_band=PriorityBandSpec(0, fairness_policy_ref="program-aware-fairness"))
    d = fc_director(ds, QUEUE + "- type: program-aware-fairness\n", spec)
    paf = d.pipeline.plugins["program-aware-fairness"]
    assert isinstance(paf, ProgramAwareFairness)
    heavy = req("done", {"x-llm-d-inference-fairness-id": "heavy"})
    heavy.fairness_id = "heavy"
    paf.pre_request(heavy, SchedulingResult({}, ""))
    paf.response_complete(heavy, None, Usage(prompt_tokens=1000, completion_tokens=500))
    assert paf.service("heavy") == pytest.approx(2000)
    f = "x-llm-d-inference-fairness-id"
    sends = [("h1", {f: "heavy"}), ("h2", {f: "heavy"}), ("l1", {f: "light"}), ("l2", {f: "light"})]
    # round-robin would interleave h1, l1, ...; LAS serves the program with no attained service first
    assert (await order_of(d, ds, sends))[0] == "l1"


def test_program_aware_fairness_parameters() -> None:
    with pytest.raises(PluginConfigError, match="strategy"):
        build(ProgramAwareFairness, {"strategy": "turn-priority"})


def test_priority_holdback_ceilings() -> None:
    rank = build(PriorityHoldbackPolicy, {"minCeiling": 0.4, "maxCeiling": 0.9})
    assert rank.ceilings(0.5, [10, 5, -1]) == pytest.approx([0.9, 0.65, 0.4])
    value = build(PriorityHoldbackPolicy, {"minCeiling": 0.4, "domain": "value"})
    assert value.ceilings(0.5, [10, 8, 0]) == pytest.approx([1.0, 0.88, 0.4])
    assert rank.ceilings(0.5, [3]) == [0.9]
    with pytest.raises(PluginConfigError, match="minCeiling"):
        build(PriorityHoldbackPolicy, {})
    with pytest.raises(PluginConfigError, match="shape"):
        build(PriorityHoldbackPolicy, {"minCeiling": 0.1, "shape": "cubic"})


async def test_priority_holdback_holds_low_priority_while_high_flows() -> None:
    # saturation 0.6 (waiting 3 / threshold 5): priority 10 (ceiling 0.9) flows at once, -1 (ceiling 0.4) waits
    ds = pool(3)
    text = (
        QUEUE + "- type: priority-holdback-policy\n  parameters: {minCeiling: 0.4, maxCeiling: 0.9}\n"
        "objectives:\n- {name: high, priority: 10}\n- {name: low, priority: -1}\n"
    )
    bands = [PriorityBandSpec(10), PriorityBandSpec(-1)]
    spec = FlowControlSpec(usage_limit_policy_ref="priority-holdback-policy", priority_bands=bands)
    d = fc_director(ds, text, spec)
    low = asyncio.create_task(d.handle_request(req("low", {"x-gateway-inference-objective": "low"})))
    await asyncio.sleep(0.02)
    assert not low.done()
    high = await asyncio.wait_for(d.handle_request(req("high", {"x-gateway-inference-objective": "high"})), 1)
    assert high.endpoints and not low.done()
    fresh(ds, 1)  # saturation 0.2 < 0.4: the low band opens
    await asyncio.wait_for(low, 1)


def test_soft_reflective_ceiling_alternates_gated_bands() -> None:
    p = SoftReflectiveCeilingPolicy()
    # 3 bands at saturation 0.3: band 1 ceiling 0.85 (open), band 2 ceiling 0.7 (open)
    assert p.ceilings(0.3, [2, 1, 0]) == [1.0, float("inf"), float("inf")]
    # saturation 0.75: band 1 ceiling 0.625 and band 2 0.25 are gated; period round(0.75/0.25) = 3
    opens = [p.ceilings(0.75, [2, 1, 0])[2] == float("inf") for _ in range(9)]
    assert opens.count(True) == 3 and opens[0] is True
    assert p.ceilings(1.0, [1, 0]) == [1.0, 0.0]
    assert p.ceilings(0.9, [0]) == [1.0]


async def test_agent_identity_is_the_fairness_id_unless_the_client_sent_one() -> None:
    ds = pool(0)
    cfg = parse_config(QUEUE + "- type: agent-identity\n  parameters: {additionalSessionHeaders: [x-my-agent]}\n")
    d = SchedulingDirector(ds, build_pipeline(cfg, plugin_context(ds)))
    r1 = req("1", {"session-id": "codex-1", "x-my-agent": "mine"})
    await d.handle_request(r1)
    assert r1.fairness_id == "mine"
    r2 = req("2", {"x-claude-code-session-id": "cc-7", "x-llm-d-inference-fairness-id": "tenant"})
    await d.handle_request(r2)
    assert r2.fairness_id == "tenant"
    r3 = req("3")
    await d.handle_request(r3)
    assert r3.fairness_id == "default-flow"


def test_probabilistic_admitter_curve() -> None:
    a = build(ProbabilisticAdmitter)
    a.rng = random.Random(1)

    def eps(waiting: int) -> list[Endpoint]:
        e = Endpoint("e", "10.0.0.1", 8000)
        e.metrics = Metrics(waiting_queue_size=waiting, update_time=time.monotonic())
        return [e]

    low = req("l")
    low.priority = -1
    assert a.reject_probability(eps(0)) == 0.0
    assert a.reject_probability(eps(1)) == pytest.approx(min(0.2**5 * 300, 1.0))  # ≈ 0.096
    assert a.reject_probability(eps(2)) == 1.0  # 0.4 ≥ 0.34
    assert a.admit(low, eps(2)) is not None and a.admit(low, eps(0)) is None
    critical = req("c")
    assert a.admit(critical, eps(50)) is None
    shed = sum(a.admit(low, eps(1)) is not None for _ in range(2000))
    assert 120 < shed < 270  # ≈ 9.6 % of 2000
    unscraped: list[Endpoint] = [Endpoint("u", "10.0.0.2", 8000)]
    assert a.reject_probability(unscraped) == 1.0
    with pytest.raises(PluginConfigError, match="power"):
        build(ProbabilisticAdmitter, {"power": 0})


async def test_no_endpoint_request_ttl_waits_for_an_endpoint() -> None:
    from epp.framework import ServiceUnavailable

    ds = Datastore()
    d = fc_director(ds, QUEUE, FlowControlSpec(no_endpoint_request_ttl=1.0))
    pending = asyncio.create_task(d.handle_request(req("r")))
    await asyncio.sleep(0.1)
    assert not pending.done()  # no endpoint yet: it waits instead of a 503
    fresh_pool = pool(0)
    ds.replace_all(list(fresh_pool.endpoints()))
    decision = await asyncio.wait_for(pending, 1)
    assert decision.endpoints[0].name == "pod-0"
    empty = fc_director(Datastore(), QUEUE, FlowControlSpec(no_endpoint_request_ttl=0.1))
    t0 = time.monotonic()
    with pytest.raises(ServiceUnavailable):
        await empty.handle_request(req("x"))
    assert 0.09 <= time.monotonic() - t0 < 1.0
    with pytest.raises(ServiceUnavailable):  # without the setting: at once, as before
        await fc_director(Datastore(), QUEUE, FlowControlSpec()).handle_request(req("y"))
