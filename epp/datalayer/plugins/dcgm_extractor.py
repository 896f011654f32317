"""dcgm-extractor (llm-d-router): an endpoint's GPU utilization from DCGM_FI_DEV_GPU_UTIL — the samples with this
pod's `pod` label (or none, for a sidecar), the busiest GPU, 0-100 → 0..1 — as the `GPUUtilization` attribute
(read by endpoint-attribute-filter/-scorer with `producer: <this plugin's name>`)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from epp.datalayer.promtext import find_family
from epp.framework import DataKey, Endpoint, Plugin, Stability

FAMILY = "DCGM_FI_DEV_GPU_UTIL"
ATTRIBUTE = "GPUUtilization"


class DCGMExtractor(Plugin):
    type_name = "dcgm-extractor"
    stability = Stability.ALPHA

    def __init__(self, name: str | None = None) -> None:
        super().__init__(name)
        self.key: DataKey[float] = DataKey[float](ATTRIBUTE).of(self.name)

    def produces(self) -> Collection[DataKey[Any]]:
        return (self.key,)

    def extract(self, endpoint: Endpoint, text: str) -> None:
        values = [
            v
            for labels, v in find_family(text, FAMILY)
            if "pod" not in labels or not endpoint.pod_name or labels["pod"] == endpoint.pod_name
        ]
        if values:
            endpoint.attributes.put(self.key, min(max(max(values) / 100.0, 0.0), 1.0))
        else:
            endpoint.attributes.pop(self.key)

    def forget(self, endpoint: Endpoint) -> None:
        endpoint.attributes.pop(self.key)
