"""Reading a configured numeric endpoint attribute (endpoint-attribute-filter/-scorer).

Without `producer` the name is one of the core metrics extractor's (`num_requests_running`, `num_requests_waiting`,
`kv_cache_usage_perc`, ...) or a custom scalar attribute written under that name; with `producer` it is the value
that plugin wrote (`<attribute>/<producer>`, e.g. the DCGM extractor's).
"""

from __future__ import annotations

from collections.abc import Callable

from epp.framework import DataKey, Endpoint, Params

CORE_METRICS: dict[str, Callable[[Endpoint], float]] = {
    "num_requests_running": lambda ep: float(ep.metrics.running_requests_size),
    "running_requests": lambda ep: float(ep.metrics.running_requests_size),
    "num_requests_waiting": lambda ep: float(ep.metrics.waiting_queue_size),
    "waiting_queue_size": lambda ep: float(ep.metrics.waiting_queue_size),
    "kv_cache_usage_perc": lambda ep: float(ep.metrics.kv_cache_usage_percent),
    "kv_cache_utilization": lambda ep: float(ep.metrics.kv_cache_usage_percent),
    "max_lora": lambda ep: float(ep.metrics.max_active_models),
}

CORE_PRODUCER = "core-metrics-extractor"


def attribute_reader(params: Params, key: str) -> Callable[[Endpoint], float | None]:
    """A getter for the attribute named by parameter `key` (None when the endpoint lacks it)."""
    attr = params.str(key, "")
    if not attr:
        raise params.fail(key, "required: the endpoint attribute to read")
    producer = params.get("producer", None)
    if producer is not None and not isinstance(producer, str):
        raise params.fail("producer", "expected a plugin name")
    if producer is None and "/" in attr:
        raise params.fail(key, "contains '/': set 'producer' explicitly")
    if producer in (None, CORE_PRODUCER) and attr in CORE_METRICS:
        core = CORE_METRICS[attr]

        def scraped(ep: Endpoint) -> float | None:
            return core(ep) if ep.metrics.update_time else None

        return scraped
    dk: DataKey[object] = DataKey(attr) if not producer else DataKey[object](attr).of(producer)

    def custom(ep: Endpoint) -> float | None:
        v = ep.attributes.get(dk)
        if isinstance(v, bool) or not isinstance(v, int | float):
            return None
        return float(v)

    return custom
