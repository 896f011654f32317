"""Topology proximity between a candidate and the peer an earlier profile picked (topology-affinity-filter/-scorer).

Levels, tightest first: host, rack, zone, region (same host implies the rest). A missing value never matches,
empty against empty included.
"""

from __future__ import annotations

from epp.framework import PEER_ENDPOINT, CycleState, Endpoint, Params, PluginContext
from epp.framework.attributes import TOPOLOGY, Topology
from epp.framework.state import DataKey

LEVELS = ("host", "rack", "zone", "region")


def common_level(a: Topology, b: Topology) -> int | None:
    """Index in LEVELS of the tightest level a and b share, or None."""
    pairs = ((a.hostname, b.hostname), (a.rack, b.rack), (a.zone, b.zone), (a.region, b.region))
    for i, (x, y) in enumerate(pairs):
        if x and x == y:
            return i
    return None


def topology_key(params: Params, context: PluginContext) -> DataKey[Topology]:
    """`topologyProducerName` (default: the topology-extractor named like its type)."""
    return TOPOLOGY.of(params.str("topologyProducerName", "") or "topology-extractor")


def peer_topology(state: CycleState, key: DataKey[Topology]) -> Topology | None:
    peer: Endpoint | None = state.get(PEER_ENDPOINT)
    if peer is None:
        return None
    topo = peer.attributes.get(key)
    return None if topo is None or topo.empty() else topo
