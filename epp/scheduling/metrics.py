"""Scheduler self-metrics with GIE's names (pkg/epp/metrics): cycle latency, attempts, per-plugin latency."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

# GIE buckets for the scheduler: 0.1 ms … 100 ms.
_SCHED_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
_PLUGIN_BUCKETS = (0.00001, 0.00002, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.1, 1.0)

SCHEDULER_E2E_DURATION = Histogram(
    "inference_extension_scheduler_e2e_duration_seconds",
    "End-to-end scheduling latency distribution in seconds.",
    buckets=_SCHED_BUCKETS,
)
SCHEDULER_ATTEMPTS = Counter(
    "inference_extension_scheduler_attempts_total",
    "Total number of scheduling attempts.",
    ["status", "target_model_name", "pod_name", "namespace", "port"],
)
PLUGIN_DURATION = Histogram(
    "inference_extension_plugin_duration_seconds",
    "Plugin processing latency distribution in seconds for each extension point, plugin type and plugin name.",
    ["extension_point", "plugin_type", "plugin_name"],
    buckets=_PLUGIN_BUCKETS,
)
