"""Benchmarks: each prints ratios measured side by side in one run (results in docs/benchmarks.md).

Grouped by what they measure, each run as `python -m e2e.bench.<group>.<name>`: `routing` (the workload suite),
`cost` (what the EPP adds per request), `index` (the KV-cache index), `scale` (replicas, soaks, large bodies),
`pd` (disaggregation) and `components` (one part in process). `loadgen` and `procstat` are shared by all.
"""
