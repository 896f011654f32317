"""llm-d-router's multi-cluster hub types (`multicluster-*`): recognized, and refused with a clear config error.

A hub EPP routes to whole clusters (their EPPs' pool averages), not to model-server pods; pyepp routes within one
InferencePool only. Failing at load time, naming the type and the line, beats an `unknown plugin type`.
"""

from __future__ import annotations

from typing import Self

from epp.framework import Params, Plugin, PluginContext


class MultiClusterHubPlugin(Plugin):
    type_name = "multicluster-file-discovery"
    aliases = (
        "multicluster-metrics-data-source",
        "multicluster-metrics-extractor",
        "multicluster-kv-cache-utilization-scorer",
        "multicluster-queue-scorer",
        "multicluster-prefix-cache-scorer",
        "multicluster-session-affinity-filter",
        "multicluster-approx-prefix-cache-producer",
    )

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        raise ValueError(
            "multi-cluster hub routing (llm-d-router's multicluster-* plugin types) is not supported: "
            "run one EPP per InferencePool and route between clusters in the gateway"
        )
