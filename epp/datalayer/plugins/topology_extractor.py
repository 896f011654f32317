"""topology-extractor (llm-d-router): each endpoint's Topology (hostname, rack, zone, region) from its pod labels.

The label keys are parameters (`hostname`, `rack`, `zone`, `region`; defaults kubernetes.io/hostname,
topology.kubernetes.io/rack, topology.kubernetes.io/zone, topology.kubernetes.io/region). The attribute is written
when an endpoint appears and again when its labels change; topology-affinity-filter/-scorer read it.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Self

from epp.framework import DataKey, Endpoint, Params, Plugin, PluginContext, Stability
from epp.framework.attributes import TOPOLOGY, Topology

DEFAULT_LABELS = {
    "hostname": "kubernetes.io/hostname",
    "rack": "topology.kubernetes.io/rack",
    "zone": "topology.kubernetes.io/zone",
    "region": "topology.kubernetes.io/region",
}


class TopologyExtractor(Plugin):
    type_name = "topology-extractor"
    stability = Stability.ALPHA

    def __init__(self, name: str, labels: dict[str, str] | None = None) -> None:
        super().__init__(name)
        self.labels = {**DEFAULT_LABELS, **(labels or {})}
        self.key = TOPOLOGY.of(self.name)

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        labels = {k: params.str(k, "") or v for k, v in DEFAULT_LABELS.items()}
        ext = cls(name, labels)
        for ep in context.endpoints.endpoints():
            ext.endpoint_added(ep)
        context.endpoints.subscribe(ext)
        return ext

    def produces(self) -> Collection[DataKey[Any]]:
        return (self.key,)

    def topology_of(self, endpoint: Endpoint) -> Topology:
        lb = endpoint.labels
        return Topology(*(lb.get(self.labels[k], "") for k in ("hostname", "rack", "zone", "region")))

    def endpoint_added(self, endpoint: Endpoint) -> None:
        endpoint.attributes.put(self.key, self.topology_of(endpoint))

    def endpoint_updated(self, endpoint: Endpoint) -> None:
        self.endpoint_added(endpoint)

    def endpoint_removed(self, endpoint: Endpoint) -> None:
        return None
