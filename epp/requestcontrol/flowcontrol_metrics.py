"""Flow-control self-metrics with GIE's names."""

from __future__ import annotations

from prometheus_client import Gauge, Histogram

_LABELS = ["fairness_id", "priority", "inference_pool", "model_name", "target_model_name"]

FC_QUEUE_SIZE = Gauge(
    "inference_extension_flow_control_queue_size", "Number of requests waiting in the flow-control queue.", _LABELS
)
FC_QUEUE_BYTES = Gauge(
    "inference_extension_flow_control_queue_bytes", "Bytes of requests waiting in the flow-control queue.", _LABELS
)
FC_QUEUE_DURATION = Histogram(
    "inference_extension_flow_control_request_queue_duration_seconds",
    "Time requests spend in the flow-control queue, by outcome.",
    [*_LABELS, "outcome"],
    buckets=(0.0001, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300),
)
FC_POOL_SATURATION = Gauge(
    "inference_extension_flow_control_pool_saturation",
    "Pool saturation as seen by the flow-control dispatcher (>= 1 holds dispatch).",
    ["inference_pool"],
)
