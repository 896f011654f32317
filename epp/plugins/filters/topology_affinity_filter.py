"""topology-affinity-filter (llm-d-router): in a disaggregated prefill profile, keeps the candidates co-located
with the decode pod already picked at `minAffinity` (host|rack|zone|region) or tighter.

Fails open: with no peer topology, or when no candidate qualifies, every candidate is returned. A candidate with
no Topology attribute is dropped (when another qualifies).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Self

from epp.framework import CycleState, Endpoint, InferenceRequest, Params, Plugin, PluginContext, Stability
from epp.framework.attributes import Topology
from epp.framework.state import DataKey
from epp.plugins.contracts.topology import LEVELS, common_level, peer_topology, topology_key


class TopologyAffinityFilter(Plugin):
    type_name = "topology-affinity-filter"
    stability = Stability.ALPHA

    def __init__(self, name: str, key: DataKey[Topology], min_affinity: str = "host") -> None:
        super().__init__(name)
        self.key = key
        self.floor = LEVELS.index(min_affinity)

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        return cls(name, topology_key(params, context), params.str("minAffinity", "host", choices=LEVELS))

    def filter(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        peer = peer_topology(state, self.key)
        if peer is None:
            return list(endpoints)
        kept = []
        for ep in endpoints:
            topo = ep.attributes.get(self.key)
            level = common_level(topo, peer) if topo is not None else None
            if level is not None and level <= self.floor:
                kept.append(ep)
        return kept or list(endpoints)
