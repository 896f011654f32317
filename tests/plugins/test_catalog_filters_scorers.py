"""llm-d-router catalog filters and scorers (issue 12): utilization, endpoint-attribute, header-label affinity,
topology, and GIE's conformance filter and verifier."""

from __future__ import annotations

import time

import pytest

from epp.datalayer.datastore import Datastore
from epp.datalayer.plugins.topology_extractor import TopologyExtractor
from epp.framework import (
    INFLIGHT_LOAD,
    PEER_ENDPOINT,
    CycleState,
    DataKey,
    Endpoint,
    InferenceRequest,
    InFlightLoad,
    Metrics,
    PluginConfigError,
    Response,
)
from epp.plugins.filters.endpoint_attribute_filter import EndpointAttributeFilter
from epp.plugins.filters.header_based_testing_filter import HeaderBasedTestingFilter
from epp.plugins.filters.topology_affinity_filter import TopologyAffinityFilter
from epp.plugins.filters.utilization_filter import UtilizationFilter
from epp.plugins.requestcontrol.destination_endpoint_served_verifier import DestinationEndpointServedVerifier
from epp.plugins.scorers.endpoint_attribute_scorer import EndpointAttributeScorer
from epp.plugins.scorers.header_label_affinity_scorer import HeaderLabelAffinityScorer
from epp.plugins.scorers.topology_affinity_scorer import TopologyAffinityScorer
from epp.wiring import plugin_context
from tests.helpers import build

S = CycleState()


def req(headers: dict[str, str] | None = None) -> InferenceRequest:
    return InferenceRequest("r", "/v1/completions", "completions", "m", "m", {}, headers=headers or {})


def ep(i: int, running: int = 0, waiting: int = 0, kv: float = 0.0, labels: dict[str, str] | None = None) -> Endpoint:
    e = Endpoint(f"e{i}", f"10.0.0.{i}", 8000, labels=labels or {})
    e.metrics = Metrics(waiting, running, kv, update_time=time.monotonic())
    return e


def test_utilization_filter_drops_an_endpoint_over_any_cap() -> None:
    f = build(
        UtilizationFilter,
        {
            "conditions": [
                {"metric": "running-requests", "maxValue": 40},
                {"metric": "waiting-queue", "maxValue": 0},
                {"metric": "kv-cache-utilization", "maxValue": 0.8},
            ]
        },
    )
    e = [ep(1, running=10), ep(2, running=41), ep(3, waiting=1), ep(4, kv=0.9), ep(5, running=40, kv=0.8)]
    assert [x.name for x in f.filter(S, req(), e)] == ["e1", "e5"]
    assert f.filter(S, req(), [ep(2, running=41)]) == []
    fb = build(UtilizationFilter, {"conditions": [{"metric": "waiting-queue", "maxValue": 0}], "fallbackOnEmpty": True})
    busy = [ep(1, waiting=3), ep(2, waiting=5)]
    assert fb.filter(S, req(), busy) == busy


def test_utilization_filter_active_requests_reads_the_inflight_producer() -> None:
    ctx = plugin_context(Datastore())
    f = build(UtilizationFilter, {"conditions": [{"metric": "active-requests", "maxValue": 2}]}, ctx=ctx)
    assert [r.type for r in ctx.requirements] == ["inflight-load-producer"]  # the builder adds it
    e1, e2 = ep(1), ep(2)
    e1.attributes.put(INFLIGHT_LOAD.of("inflight-load-producer"), InFlightLoad(requests=3))
    e2.attributes.put(INFLIGHT_LOAD.of("inflight-load-producer"), InFlightLoad(requests=1, remote_requests=1))
    assert f.filter(S, req(), [e1, e2]) == [e2]


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({}, "conditions"),
        ({"conditions": [{"metric": "gpu", "maxValue": 1}]}, "metric"),
        ({"conditions": [{"metric": "kv-cache-utilization", "maxValue": 2}]}, "must be <= 1.0"),
        ({"conditions": [{"metric": "waiting-queue"}]}, "maxValue"),
        ({"conditions": [{"metric": "waiting-queue", "maxValue": 1, "max": 2}]}, "unknown parameter 'conditions"),
    ],
)
def test_utilization_filter_rejects_bad_conditions(params: dict[str, object], match: str) -> None:
    with pytest.raises(PluginConfigError, match=match):
        build(UtilizationFilter, params)


def test_endpoint_attribute_filter_threshold_missing_and_fallback() -> None:
    f = build(
        EndpointAttributeFilter,
        {
            "attribute": "num_requests_running",
            "algorithm": {"type": "threshold", "threshold": {"operator": "LessThan", "value": 10}},
        },
    )
    unscraped = Endpoint("e9", "10.0.0.9", 8000)
    assert [x.name for x in f.filter(S, req(), [ep(1, running=3), ep(2, running=10), unscraped])] == ["e1", "e9"]
    strict = build(
        EndpointAttributeFilter,
        {
            "attribute": "gpu_util",
            "producer": "dcgm-extractor",
            "onMissing": "Fail",
            "fallbackOnEmpty": True,
            "algorithm": {"type": "threshold", "threshold": {"operator": "GreaterThanOrEqual", "value": 0.5}},
        },
    )
    a, b = ep(1), ep(2)
    a.attributes.put(DataKey[float]("gpu_util").of("dcgm-extractor"), 0.7)
    assert strict.filter(S, req(), [a, b]) == [a]
    assert strict.filter(S, req(), [b]) == [b]  # nothing passes: fallbackOnEmpty
    with pytest.raises(PluginConfigError, match="operator"):
        build(EndpointAttributeFilter, {"attribute": "x", "algorithm": {"type": "threshold", "threshold": {}}})
    with pytest.raises(PluginConfigError, match="set 'producer'"):
        build(EndpointAttributeFilter, {"attribute": "a/b", "algorithm": {"type": "threshold"}})


def test_endpoint_attribute_scorer_adaptive_and_fixed_ranges() -> None:
    lower = build(
        EndpointAttributeScorer,
        {"attributeKey": "num_requests_waiting", "algorithm": {"type": "linear_lower_is_better"}},
    )
    e = [ep(1, waiting=0), ep(2, waiting=5), ep(3, waiting=10), Endpoint("e4", "10.0.0.4", 8000)]
    assert lower.score(S, req(), e) == [1.0, 0.5, 0.0, 0.0]
    assert lower.score(S, req(), [ep(1, waiting=4), ep(2, waiting=4)]) == [1.0, 1.0]
    fixed = build(
        EndpointAttributeScorer,
        {
            "attributeKey": "kv_cache_usage_perc",
            "algorithm": {"type": "linear_higher_is_better", "normalization": {"fixedRange": {"min": 0.0, "max": 0.5}}},
        },
    )
    assert fixed.score(S, req(), [ep(1, kv=0.25), ep(2, kv=0.9)]) == [0.5, 1.0]
    with pytest.raises(PluginConfigError, match="greater than min"):
        build(
            EndpointAttributeScorer,
            {
                "attributeKey": "x",
                "algorithm": {"type": "linear_lower_is_better", "normalization": {"fixedRange": {"min": 1, "max": 1}}},
            },
        )


def test_header_label_affinity_scorer() -> None:
    s = build(HeaderLabelAffinityScorer, {"headerName": "X-Preferred-Zone", "labelKey": "zone"})
    e = [ep(1, labels={"zone": "a"}), ep(2, labels={"zone": "b"}), ep(3)]
    assert s.score(S, req({"x-preferred-zone": "b"}), e) == [0.0, 1.0, 0.0]
    assert s.score(S, req(), e) == [0.0, 0.0, 0.0]
    with pytest.raises(PluginConfigError, match="labelKey"):
        build(HeaderLabelAffinityScorer, {"headerName": "x"})


def topo_endpoints() -> tuple[Endpoint, list[Endpoint]]:
    ds = Datastore()
    mk = lambda i, **lb: Endpoint(f"e{i}", f"10.0.0.{i}", 8000, labels=lb)  # noqa: E731
    decode = mk(
        0, **{"kubernetes.io/hostname": "h1", "topology.kubernetes.io/rack": "r1", "topology.kubernetes.io/zone": "z1"}
    )
    same_host = mk(1, **{"kubernetes.io/hostname": "h1", "topology.kubernetes.io/rack": "r1"})
    same_rack = mk(2, **{"kubernetes.io/hostname": "h2", "topology.kubernetes.io/rack": "r1"})
    same_zone = mk(3, **{"kubernetes.io/hostname": "h3", "topology.kubernetes.io/zone": "z1"})
    far = mk(4, **{"kubernetes.io/hostname": "h4"})
    for e in (decode, same_host, same_rack):
        ds.upsert(e)
    build(TopologyExtractor, ctx=plugin_context(ds))  # existing endpoints now, later ones as they arrive
    ds.upsert(same_zone)
    ds.upsert(far)
    return decode, [same_host, same_rack, same_zone, far]


def test_topology_filter_and_scorer_follow_the_decode_pick() -> None:
    decode, cands = topo_endpoints()
    state = CycleState()
    state.put(PEER_ENDPOINT, decode)
    host = build(TopologyAffinityFilter)
    rack = build(TopologyAffinityFilter, {"minAffinity": "rack"})
    assert [e.name for e in host.filter(state, req(), cands)] == ["e1"]
    assert [e.name for e in rack.filter(state, req(), cands)] == ["e1", "e2"]
    assert host.filter(state, req(), cands[3:]) == cands[3:]  # none qualifies: fail open
    assert host.filter(CycleState(), req(), cands) == cands  # no peer: fail open
    assert build(TopologyAffinityScorer).score(state, req(), cands) == [1.0, 0.2, 0.05, 0.0]
    assert build(TopologyAffinityScorer).score(CycleState(), req(), cands) == [0.0] * 4
    with pytest.raises(PluginConfigError, match="minAffinity"):
        build(TopologyAffinityFilter, {"minAffinity": "planet"})


def test_conformance_filter_and_verifier() -> None:
    e = [ep(1), ep(2), ep(3)]
    f = HeaderBasedTestingFilter()
    assert f.filter(S, req(), e) == []
    assert [
        x.name for x in f.filter(S, req({"test-epp-endpoint-selection": "10.0.0.3, 10.0.0.1:8000,10.0.0.3"}), e)
    ] == [
        "e3",
        "e1",
    ]
    assert f.filter(S, req({"test-epp-endpoint-selection": "10.0.0.2:9999"}), e) == []
    v = DestinationEndpointServedVerifier()
    resp = Response(200)
    v.response_received(req(), resp, e[1])
    assert resp.set_headers == {"x-conformance-test-served-endpoint": "10.0.0.2:8000"}
    v.response_received(req(), resp, None)
    assert resp.set_headers["x-conformance-test-served-endpoint"].startswith("fail: missing")
