"""dcgm-data-source (llm-d-router): polls NVIDIA's DCGM exporter for each endpoint — the pod's IP (sidecar) or its
node's (`useNodeAddress`, DaemonSet) at `port` (9400) `path` (/metrics) — and feeds the page to its dcgm-extractor.
"""

from __future__ import annotations

from typing import Self

from epp.datalayer.plugins._polling_source import PollingSource
from epp.framework import Params, PluginContext, Stability


class DCGMDataSource(PollingSource):
    type_name = "dcgm-data-source"
    stability = Stability.ALPHA
    extractor_types = ("dcgm-extractor",)

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        src = cls(
            name,
            context.endpoints,
            port=params.int("port", 9400, min=1, max=65535),
            node_address=params.bool("useNodeAddress", False),
            **cls.common(params, "/metrics"),
        )
        src.start(context)
        return src
