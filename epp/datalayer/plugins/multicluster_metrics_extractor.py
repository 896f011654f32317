"""multicluster-metrics-extractor (llm-d-router, Alpha): a cluster's pool averages from its EPP's /metrics page, as
the endpoint attributes the multicluster scorers read: `kvCacheUtilizationMetric`
(llm_d_epp_average_kv_cache_utilization) and `queueSizeMetric` (llm_d_epp_average_queue_size), each a metric spec
(`name` or `name{label="value"}`). A metric missing from a page leaves that attribute as it was (said once)."""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any, Self

from epp.datalayer.extractor import Selector, parse_spec
from epp.datalayer.promtext import find_family
from epp.framework import DataKey, Endpoint, Params, Plugin, PluginContext, Stability
from epp.framework.keys import MULTICLUSTER_KV_CACHE_UTILIZATION, MULTICLUSTER_QUEUE_SIZE

log = logging.getLogger(__name__)

DEFAULT_KV_METRIC = "llm_d_epp_average_kv_cache_utilization"
DEFAULT_QUEUE_METRIC = "llm_d_epp_average_queue_size"


class MultiClusterMetricsExtractor(Plugin):
    type_name = "multicluster-metrics-extractor"
    stability = Stability.ALPHA

    def __init__(self, name: str | None = None, kv: str = DEFAULT_KV_METRIC, queue: str = DEFAULT_QUEUE_METRIC) -> None:
        super().__init__(name)
        self.metrics: list[tuple[list[Selector], DataKey[float]]] = [
            (parse_spec(kv), MULTICLUSTER_KV_CACHE_UTILIZATION),
            (parse_spec(queue), MULTICLUSTER_QUEUE_SIZE),
        ]
        self._missing: set[tuple[str, str]] = set()

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        specs = {}
        for key, default in (
            ("kvCacheUtilizationMetric", DEFAULT_KV_METRIC),
            ("queueSizeMetric", DEFAULT_QUEUE_METRIC),
        ):
            specs[key] = params.str(key, "") or default
            try:
                parse_spec(specs[key])
            except ValueError as e:
                raise params.fail(key, str(e)) from None
        return cls(name, specs["kvCacheUtilizationMetric"], specs["queueSizeMetric"])

    def produces(self) -> Collection[DataKey[Any]]:
        return tuple(key for _, key in self.metrics)

    def extract(self, endpoint: Endpoint, text: str) -> None:
        for selectors, key in self.metrics:
            value = _first(text, selectors)
            if value is None:
                if (endpoint.name, key.name) not in self._missing:
                    self._missing.add((endpoint.name, key.name))
                    log.warning("%s: %s: no %s on its metrics page", self.name, endpoint.name, selectors[0].name)
                continue
            self._missing.discard((endpoint.name, key.name))
            endpoint.attributes.put(key, value)

    def forget(self, endpoint: Endpoint) -> None:
        for _, key in self.metrics:
            endpoint.attributes.pop(key)
            self._missing.discard((endpoint.name, key.name))


def _first(text: str, selectors: list[Selector]) -> float | None:
    """The first sample of the first family present that matches its labels (llm-d-router's latest, without
    timestamps)."""
    for sel in selectors:
        for labels, value in find_family(text, sel.name):
            if sel.matches(labels):
                return value
    return None
