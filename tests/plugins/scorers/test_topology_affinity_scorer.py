"""topology-affinity-filter and -scorer follow the decode pick."""

from __future__ import annotations

import pytest

from epp.datalayer.datastore import Datastore
from epp.datalayer.plugins.topology_extractor import TopologyExtractor
from epp.framework import (
    PEER_ENDPOINT,
    CycleState,
    Endpoint,
    PluginConfigError,
)
from epp.plugins.filters.topology_affinity_filter import TopologyAffinityFilter
from epp.plugins.scorers.topology_affinity_scorer import TopologyAffinityScorer
from epp.wiring import plugin_context
from tests.helpers import build
from tests.plugins.support_catalog import req


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
