"""topology-affinity-scorer (llm-d-router): grades prefill candidates by proximity to the decode pod already
picked, on llm-d's fixed KV-transfer curve: same host 1.0, rack 0.2, zone 0.05, region 0.02, none 0.
No peer topology, or a candidate without Topology, scores 0."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Self

from epp.framework import CycleState, Endpoint, InferenceRequest, Params, Plugin, PluginContext, Stability
from epp.framework.attributes import Topology
from epp.framework.state import DataKey
from epp.plugins.contracts.topology import common_level, peer_topology, topology_key

LEVEL_SCORES = (1.0, 0.2, 0.05, 0.02)


class TopologyAffinityScorer(Plugin):
    type_name = "topology-affinity-scorer"
    stability = Stability.ALPHA

    def __init__(self, name: str, key: DataKey[Topology]) -> None:
        super().__init__(name)
        self.key = key

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        return cls(name, topology_key(params, context))

    def score(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        peer = peer_topology(state, self.key)
        if peer is None:
            return [0.0] * len(endpoints)
        out = []
        for ep in endpoints:
            topo = ep.attributes.get(self.key)
            level = common_level(topo, peer) if topo is not None else None
            out.append(0.0 if level is None else LEVEL_SCORES[level])
        return out
