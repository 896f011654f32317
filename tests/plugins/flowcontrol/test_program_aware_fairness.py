"""llm-d-router flow-control policies through the real FlowController and Director: EDF and SLO-deadline
ordering, program-aware (LAS) fairness, priority-holdback and soft-reflective ceilings, agent identity."""

from __future__ import annotations

import pytest

from epp.framework import ApiKind, InferenceRequest, PluginConfigError, SchedulingResult, Usage
from epp.plugins.flowcontrol import program_aware_fairness as paf_module
from epp.plugins.flowcontrol.program_aware_fairness import ProgramAwareFairness
from epp.requestcontrol.flowcontrol_spec import FlowControlSpec, PriorityBandSpec
from tests.helpers import build
from tests.plugins.flowcontrol.support import QUEUE, chat_req, fc_director, order_of, pool


async def test_program_aware_fairness_serves_the_least_served_program_first() -> None:
    ds = pool(50)
    spec = FlowControlSpec(default_priority_band=PriorityBandSpec(0, fairness_policy_ref="program-aware-fairness"))
    d = fc_director(ds, QUEUE + "- type: program-aware-fairness\n", spec)
    paf = d.pipeline.plugins["program-aware-fairness"]
    assert isinstance(paf, ProgramAwareFairness)
    heavy = chat_req("done", {"x-llm-d-inference-fairness-id": "heavy"})
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


def req(fairness_id: str) -> InferenceRequest:
    r = InferenceRequest(fairness_id, "/v1/completions", ApiKind.COMPLETIONS, "m", "m", {"model": "m", "prompt": "x"})
    r.fairness_id = fairness_id
    return r


def served(paf: ProgramAwareFairness, pid: str, prompt_tokens: int) -> None:
    r = req(pid)
    paf.pre_request(r, SchedulingResult({}, ""))
    paf.response_complete(r, None, Usage(prompt_tokens=prompt_tokens, completion_tokens=0))


def test_defaults_are_v0_10s() -> None:
    paf = build(ProgramAwareFairness)
    assert (paf.decay_factor, paf.half_life) == (0.99997, 0.0)


def test_decay_factor_applies_once_per_pick_to_inactive_programs_only() -> None:
    paf = build(ProgramAwareFairness, {"lasDecayFactor": 0.5})
    served(paf, "idle", 1000)
    served(paf, "queued", 1000)
    for _ in range(3):
        assert paf.pick_flow({"queued": (1, 0.0)}) == "queued"
    assert paf.service("idle") == pytest.approx(125.0)  # 1000 · 0.5³
    assert paf.service("queued") == pytest.approx(1000.0)  # a queued program keeps its service
    busy = req("busy")
    served(paf, "busy", 1000)
    paf.pre_request(busy, SchedulingResult({}, ""))  # in flight
    paf.pick_flow({"queued": (1, 0.0)})
    assert paf.service("busy") == pytest.approx(1000.0)


def test_decay_factor_changes_who_dispatches() -> None:
    """A program served long ago decays below one queued since: with decay it goes first, without it waits."""
    order = {}
    for factor in (1.0, 0.5):
        paf = build(ProgramAwareFairness, {"lasDecayFactor": factor, "lasWeightHeadWait": 0.0})
        served(paf, "old", 1000)
        served(paf, "recent", 100)
        for _ in range(4):  # "recent" waits in the band; "old" is idle: 1000 · 0.5⁴ = 62.5 < 100
            paf.pick_flow({"recent": (1, 0.0)})
        order[factor] = paf.pick_flow({"recent": (1, 0.0), "old": (1, 0.0)})
    assert order == {1.0: "recent", 0.5: "old"}


def test_half_life_overrides_the_decay_factor(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(paf_module.time, "monotonic", lambda: clock[0])
    paf = build(ProgramAwareFairness, {"lasHalfLifeSeconds": 10, "lasDecayFactor": 0.5})
    served(paf, "idle", 1000)
    paf.pick_flow({})
    assert paf.service("idle") == pytest.approx(1000.0)  # no time passed: the factor is not used
    clock[0] += 10
    paf.pick_flow({})
    assert paf.service("idle") == pytest.approx(500.0)


@pytest.mark.parametrize(
    ("params", "key"),
    [
        ({"lasDecayFactor": 0}, "lasDecayFactor"),
        ({"lasDecayFactor": 1.5}, "lasDecayFactor"),
        ({"lasHalfLifeSeconds": -1}, "lasHalfLifeSeconds"),
        ({"evictionSweepSeconds": 0}, "evictionSweepSeconds"),
    ],
)
def test_out_of_range_parameters_are_rejected(params: dict[str, float], key: str) -> None:
    with pytest.raises(PluginConfigError, match=key):
        build(ProgramAwareFairness, params)


def test_eviction_ttl_zero_keeps_programs(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(paf_module.time, "monotonic", lambda: clock[0])
    keep = build(ProgramAwareFairness, {"evictionTtlSeconds": 0, "evictionSweepSeconds": 1})
    evict = build(ProgramAwareFairness, {"evictionTtlSeconds": 5, "evictionSweepSeconds": 1})
    for paf in (keep, evict):
        served(paf, "p", 10)
    clock[0] = 100.0
    for paf in (keep, evict):
        paf.pick_flow({})
    assert "p" in keep.programs and "p" not in evict.programs
